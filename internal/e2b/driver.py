# The code interpreter's cell driver (internal/e2b/interpreter.go). sbx
# sends it, followed by a call with the user's cell, to a stateful context:
# it runs in the context's module globals, so the cell's variables persist
# like a notebook kernel's. It gives a notebook's answers that sbx's
# executions do not: the value of the last expression (with its rich
# representations), figures shown with plt.show() or left open at the end
# of the cell (as PNG), display(), and errors as name/value/traceback. All
# of it comes back as the execution's return value; stdout and stderr
# stream as usual. It defines _sbx_e2b_cell and deletes it after the call,
# and keeps its own state in globals named __sbx_e2b_*.
def _sbx_e2b_cell(code_b64, cwd_b64):
    import ast, base64, builtins, io, linecache, os, sys, traceback

    g = globals()
    code = base64.b64decode(code_b64).decode("utf-8")
    cwd = base64.b64decode(cwd_b64).decode("utf-8")
    if "__sbx_e2b_count" not in g:
        g["__sbx_e2b_count"] = 0
        g["__sbx_e2b_cwd"] = cwd
    # sbx starts every run in the execution's directory; a kernel stays
    # where the previous cell left it (the context's cwd at first).
    try:
        os.chdir(g["__sbx_e2b_cwd"] or cwd)
    except OSError:
        pass
    g["__sbx_e2b_count"] += 1
    count = g["__sbx_e2b_count"]
    results = []

    def formats(value):
        out = {}
        try:
            out["text"] = repr(value)
        except BaseException as e:
            out["text"] = "<unrepresentable %s: %s>" % (type(value).__name__, e)
        for fmt in ("html", "markdown", "svg", "png", "jpeg", "latex", "json", "javascript", "pdf"):
            method = getattr(value, "_repr_%s_" % fmt, None)
            if not callable(method) or isinstance(value, type):
                continue
            try:
                data = method()
            except Exception:
                continue
            if isinstance(data, tuple):
                data = data[0]
            if data is None:
                continue
            if isinstance(data, bytes):
                data = base64.b64encode(data).decode("ascii")
            out[fmt] = data
        return out

    def figure(fig):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        r = {"text": repr(fig), "png": base64.b64encode(buf.getvalue()).decode("ascii")}
        return r

    def flush_figures():
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in plt.get_fignums():
            fig = plt.figure(num)
            try:
                r = figure(fig)
                r["is_main_result"] = False
                results.append(r)
            except Exception as e:
                print("sbx: could not render figure %s: %s" % (num, e), file=sys.stderr)
        plt.close("all")

    def show(*args, **kwargs):
        flush_figures()

    def display(*objs, **kwargs):
        for obj in objs:
            r = formats(obj)
            r["is_main_result"] = False
            results.append(r)

    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.show = show
    display._sbx_e2b = True
    if getattr(builtins, "display", display) is display or hasattr(builtins.display, "_sbx_e2b"):
        builtins.display = display  # this cell's: it adds to this cell's results

    name = "<cell-%d>" % count
    lines = code.splitlines(True)
    linecache.cache[name] = (len(code), None, lines, name)
    error = None
    try:
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), g)
        if last is not None:
            value = eval(compile(last, name, "eval"), g)
            if value is not None:
                fig_type = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
                if fig_type is not None and isinstance(value, fig_type):
                    r = figure(value)
                    sys.modules["matplotlib.pyplot"].close(value)
                else:
                    r = formats(value)
                r["is_main_result"] = True
                results.append(r)
                g["_"] = value
    except BaseException as e:
        tb = e.__traceback__
        # Start the traceback at the user's code, not at this driver.
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell-"):
            tb = tb.tb_next
        error = {
            "name": type(e).__name__,
            "value": str(e),
            "traceback": "".join(traceback.format_exception(type(e), e, tb)),
        }
    flush_figures()
    try:
        g["__sbx_e2b_cwd"] = os.getcwd()
    except OSError:
        pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    return {"results": results, "error": error, "execution_count": count}
