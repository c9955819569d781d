"""sbx runner: runs one execution's Python code inside a zygote worker.

Loaded by zygote.py as a module of its own (not importable by user code),
so that its frames can be told apart from the user's in tracebacks. It
compiles the code with top-level `return` rewritten into a raise, runs it
and handler(event), and turns the outcome into a JSON-ready result.
"""
import ast
import json
import linecache
import math
import sys
import traceback
import types
from _collections_abc import Awaitable

# The zygote sets MAX_RETURN before running this file.
MAX_RETURN = globals().get("MAX_RETURN", 16 << 20)

USER_FILE = "<code>"
RET = "__sbx_return__"
# inspect's flags, without importing inspect (and asyncio) into every
# zygote: only code that awaits needs them, and imports them then.
CO_COROUTINE = 0x80
CO_ITERABLE_COROUTINE = 0x100


class _Return(BaseException):
    """A top-level `return`, rewritten into a raise so that finally blocks run."""

    def __init__(self, value=None):
        self.value = value


class _Rewrite(ast.NodeTransformer):
    # Only module-level returns: never look inside functions or classes.
    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_ClassDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_Return(self, node):
        value = node.value if node.value is not None else ast.Constant(None)
        call = ast.Call(func=ast.Name(id=RET, ctx=ast.Load()), args=[value], keywords=[])
        return ast.copy_location(ast.Raise(exc=call, cause=None), node)


def new_main_module():
    import builtins
    m = types.ModuleType("__main__")
    m.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = m
    return m


def _streams():
    sys.stdout = sys.__stdout__
    sys.stderr = sys.__stderr__
    # Line-buffered and written through, so that output streams while the
    # code runs instead of when the block buffer fills.
    sys.stdout.reconfigure(line_buffering=True, write_through=True)
    sys.stderr.reconfigure(line_buffering=True, write_through=True)


def _compile(code):
    linecache.cache[USER_FILE] = (len(code), None, code.splitlines(True), USER_FILE)
    tree = ast.parse(code, USER_FILE, "exec")
    tree = ast.fix_missing_locations(_Rewrite().visit(tree))
    return compile(tree, USER_FILE, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


def _user_tb(tb):
    t = tb
    while t is not None and t.tb_frame.f_code.co_filename != USER_FILE:
        t = t.tb_next
    if t is not None:
        return t
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _error(e, tb=True):
    if isinstance(e, SyntaxError) and not tb:
        text = "".join(traceback.format_exception_only(type(e), e))
    else:
        text = "".join(traceback.format_exception(type(e), e, _user_tb(e.__traceback__)))
    try:
        msg = str(e)
    except BaseException:
        msg = "<unprintable %s>" % type(e).__name__
    return {"type": type(e).__name__, "message": msg, "traceback": text}


def run(p, g, in_context):
    _streams()
    if "" not in sys.path:
        sys.path.insert(0, "")  # like python -c: modules beside the code import
    sys.argv = [""]
    sys.dont_write_bytecode = True  # no __pycache__ in the workspace
    res = {"exit_code": 0, "error": None}
    try:
        co = _compile(p["code"])
    except BaseException as e:  # SyntaxError; ValueError for a NUL; RecursionError
        res.update(exit_code=1, error=_error(e, tb=False))
        return res
    g[RET] = _Return
    before = g.get("handler")
    has_value, value = False, None
    try:
        if co.co_flags & CO_COROUTINE:
            import asyncio
            asyncio.run(eval(co, g))
        else:
            exec(co, g)
        h = g.get("handler")
        if callable(h) and (not in_context or h is not before):
            value = h(p.get("event"))
            if _isawaitable(value):
                import asyncio
                value = asyncio.run(_await(value))
            has_value = True
    except _Return as r:
        has_value, value = True, r.value
    except SystemExit as e:
        code = e.code
        if code is None or code is False or code == 0:
            pass
        elif isinstance(code, int):
            res.update(exit_code=code, error=_error(e))
        else:
            print(code, file=sys.stderr)
            res.update(exit_code=1, error=_error(e))
    except BaseException as e:
        res.update(exit_code=1, error=_error(e))
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
    if has_value:
        try:
            rv = json.dumps(jsonable(value), allow_nan=False)
        except BaseException:
            rv = json.dumps(_repr(value))
        if len(rv) > MAX_RETURN:
            res.update(exit_code=res["exit_code"] or 1, error={
                "type": "ReturnValueTooLarge", "traceback": "",
                "message": "return value is %d bytes of JSON, more than the limit of %d" % (len(rv), MAX_RETURN)})
        else:
            res["return_value"] = rv
    return res


async def _await(x):
    return await x


def _isawaitable(v):
    """inspect.isawaitable."""
    return (isinstance(v, types.CoroutineType)
            or isinstance(v, types.GeneratorType) and bool(v.gi_code.co_flags & CO_ITERABLE_COROUTINE)
            or isinstance(v, Awaitable))


def _repr(v):
    try:
        return repr(v)
    except BaseException as e:
        return "<unrepresentable %s: %s>" % (type(v).__name__, type(e).__name__)


def _key(k):
    """Dict keys as json.dumps spells them: 1 -> "1", None -> "null"."""
    if isinstance(k, str):
        return k
    j = jsonable(k)
    return j if isinstance(j, str) else json.dumps(j)


def jsonable(v, depth=0):
    """A JSON-ready copy of v; duck-typed so that pandas and numpy are never imported here."""
    if depth > 64:
        return _repr(v)
    d = depth + 1
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, dict):
        return {_key(k): jsonable(x, d) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x, d) for x in v]
    if isinstance(v, (set, frozenset)):
        items = [jsonable(x, d) for x in v]
        try:
            items.sort()
        except TypeError:
            pass
        return items
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return repr(b)
    mod = type(v).__module__ or ""
    if mod == "decimal":
        if not v.is_finite():
            return None
        return int(v) if v == v.to_integral_value() else float(v)
    if mod.startswith("pandas"):
        if hasattr(v, "to_dict") and hasattr(v, "columns"):  # DataFrame
            return jsonable(v.to_dict(orient="records"), d)
        if hasattr(v, "tolist") and hasattr(v, "index"):  # Series, Index
            return jsonable(v.tolist(), d)
    if hasattr(v, "isoformat") and callable(v.isoformat):  # datetime, date, time, Timestamp
        try:
            s = v.isoformat()
            if isinstance(s, str):
                return s if s != "NaT" else None
        except BaseException:
            pass
    if hasattr(v, "tolist") and hasattr(v, "ndim") and getattr(v, "ndim", 0) > 0:  # numpy array
        return jsonable(v.tolist(), d)
    if hasattr(v, "item") and hasattr(v, "dtype"):  # numpy scalar
        try:
            return jsonable(v.item(), d)
        except BaseException:
            pass
    if hasattr(v, "__dataclass_fields__") and not isinstance(v, type):
        import dataclasses
        return jsonable(dataclasses.asdict(v), d)
    return _repr(v)


def warm_finish():
    """What finish touches, without running anything: the zygote's workers
    call it in their idle warm-up."""
    import atexit
    atexit._ncallbacks()
    linecache.cache.pop(USER_FILE, None)
    for f in (sys.stdout, sys.stderr):
        f.flush()


def finish():
    """What interpreter exit does: wait for non-daemon threads, run atexit."""
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
    except BaseException:
        pass
    try:
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            pass
