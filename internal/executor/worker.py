"""sbx worker: the half of zygote.py that a forked worker runs.

zygote.py executes this file into its own namespace (see _include_worker
there): it shares the zygote's configuration, constants and messages. A
worker sets itself up (privileges, seccomp), warms up while idle, then
serves one run (or, for a context, runs until its channel closes).
"""

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522


# prctl is variadic: pass every argument as an unsigned long. The function
# object and everything below that ctypes would build on a first call are
# built here, once: in a worker each new object costs copy-on-write faults.
_prctl = libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
_capset = libc.capset
_capget = libc.capget


def prctl(option, a2=0, a3=0, a4=0, a5=0):
    return _prctl(option, a2, a3, a4, a5)


def _read_filter():
    path = CFG.get("seccomp_file") or ""
    if not path:
        return b""
    with open(path, "rb") as f:
        prog = f.read()
    if not prog or len(prog) % 8:
        raise ValueError("seccomp filter %s: %d bytes is not a sock_filter array" % (path, len(prog)))
    return prog


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


# Read at the zygote's start, from its read-only copy of the control
# directory (shim.go).
FILTER = _read_filter()
_FILTER_BUF = ctypes.create_string_buffer(FILTER, len(FILTER))
_FPROG = _SockFprog(len(FILTER) // 8, ctypes.cast(_FILTER_BUF, ctypes.c_void_p))
# A filter that allows everything (BPF_RET|BPF_K SECCOMP_RET_ALLOW), for
# the drop's rehearsal (see rehearse_enter_run).
_ALLOW_BUF = ctypes.create_string_buffer(b"\x06\x00\x00\x00\x00\x00\xff\x7f", 8)
_ALLOW_FPROG = _SockFprog(1, ctypes.cast(_ALLOW_BUF, ctypes.c_void_p))
# capset's header (this process) and data: every set empty.
_CAP_HDR = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
_CAP_DATA = (ctypes.c_uint32 * 6)()
_CAP_GOT = (ctypes.c_uint32 * 6)()  # what capget reads back
_CAP_KEEP = (ctypes.c_uint32 * 6)()  # the rehearsal's: the ones we have

# The workspace, and the directory where a conversation's view
# of its uploads is assembled (see conversation_view).
WORKSPACE = CFG.get("workspace") or "/workspace"
VIEW_DIR = CFG.get("view_dir") or ""

# What drop_privileges drops to: uid, gid, capability sets, the seccomp
# filter's address (0: none).
DROP_PLAN = (UID, GID, _CAP_DATA, ctypes.addressof(_FPROG) if FILTER else 0)


# A pre-forked worker's idle warm-up: the common core of zygote.py's
# WARM_UPS, kept cheap, since every page it touches becomes the worker's own
# copy (its memory while idle).
WORKER_WARM_UPS = {
    "numpy": [
        "import numpy as np",
        "a = np.arange(12, dtype=float).reshape(3, 4); a.sum(axis=0).tolist(); a.mean()",
    ],
    "pandas": [
        "import pandas as pd",
        "d = pd.DataFrame({'a': range(100), 'b': [1.5] * 100})",
        "float((d.a * d.b).mean())",
        "d.to_dict(orient='records')",
    ],
}


def worker_main(kind, chan_fd, settle_fd=-1, conversation="", group=0):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # 0, 1 = /dev/null; 2 stays the executor's log until the run (a crash
    # of the worker's own code is worth a traceback there); 3 = channel;
    # 4 = /dev/null holding RES_FD's place, so that received descriptors
    # never land on it; 5 = the settle pipe of a pre-forked worker.
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(chan_fd, CTL_FD, inheritable=False)
    os.dup2(null, RES_FD, inheritable=False)
    if settle_fd >= 0:
        os.dup2(settle_fd, SETTLE_FD, inheritable=False)
    os.closerange(SETTLE_FD + 1 if settle_fd >= 0 else RES_FD + 1, 1 << 30)
    chan = socket.socket(fileno=CTL_FD)
    setup_error = None
    try:
        isolate()
    except BaseException as e:
        setup_error = "cannot isolate the worker: %s" % e
    if kind == "context":
        # A context is bound to its conversation for life: its view is made
        # now, from the spawn request, and privileges dropped before its
        # first run.
        if not setup_error:
            setup_error = enter_run(conversation, group)
        if setup_error:
            send(chan, {"op": "error", "error": setup_error})
            os._exit(70)
        context_loop(chan)
        return
    # With the capabilities over our user namespace from here to enter_run:
    # only this fixed code runs (the warm-up; and what the template put in
    # the zygote, which had them too), and nothing of a request is read
    # before the drop but the conversation id of the run message.
    if not setup_error and not pending(chan):
        setup_error = rehearse_enter_run()
        if not setup_error:
            warm_up(chan)
    if settle_fd >= 0:
        os.close(SETTLE_FD)  # set up: the zygote may fork the next one
    msg, fds = recv(chan)
    if msg is None or msg.get("op") != "run" or len(fds) != 4:
        os._exit(0)  # the zygote went away before handing us a run
    payload_fd, out_fd, err_fd, res_fd = fds
    os.dup2(res_fd, RES_FD, inheritable=False)
    if not setup_error:
        group = msg.get("group") or 0
        if not valid_group(group):
            setup_error = "bad group %r" % (group,)
        else:
            setup_error = enter_run(msg.get("conversation") or "", group)
    if setup_error:
        write_result({"exit_code": 70, "error": executor_error(setup_error)})
        os._exit(70)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    try:
        p = read_payload(payload_fd)
    except BaseException as e:  # RecursionError for an event nested too deep
        write_result({"exit_code": 70, "error": executor_error("cannot read the request: %s: %s" % (type(e).__name__, e))})
        os._exit(70)
    close_all([payload_fd, out_fd, err_fd, res_fd])
    run_once(p)


def valid_group(group):
    """A conversation's group id, as the executor gives them (podviews.go),
    or 0 for none."""
    return type(group) is int and (group == 0 or 40000 <= group < 65000)


def enter_run(conversation, group=0, plan=DROP_PLAN, workspace=WORKSPACE, stage=VIEW_DIR, owners=None):
    """The privileged last step before a run (or a context's life): the
    conversation's view of the uploads, then the final privilege drop.
    In the unprivileged mode the view is the executor's (podviews.go): the
    run keeps the conversation's group, which opens its uploads to it.
    Returns an error message, or None."""
    groups = []
    if conversation:
        try:
            if UNPRIV:
                if not group:
                    raise ViewError("the executor gave the conversation no group")
                if not setgid_kept():
                    raise ViewError("conversation views in a Pod need the zygote to keep CAP_SETGID, which it cannot without ambient capabilities (gVisor has none)")
                groups = [group]
            else:
                conversation_view(conversation, workspace, stage, owners)
        except BaseException as e:
            return "conversation %s: %s" % (conversation, e)
    try:
        drop_privileges(plan, groups)
    except BaseException as e:
        return "cannot drop privileges: %s" % e
    return None


def rehearse_enter_run():
    """A pre-forked worker's rehearsal of enter_run, while idle, so that
    the real one, on the run's path, takes none of the copy-on-write faults
    of a first call (tens of microseconds each here, a dozen or two in
    all) nor the one-time cost of a process's first seccomp filter. It
    makes a conversation's view in a scratch workspace on a tmpfs at
    VIEW_DIR (this mount namespace is ours, nobody else can reach it, and
    the whole scratch tree is unmounted afterwards), then "drops" to what
    the worker has already: its uid and gid, its capabilities, and a
    seccomp filter that allows everything. The worker stays able to mount;
    it has no_new_privs from then on, which mounts do not care about.
    Returns an error message, or None."""
    try:
        if _capget(_CAP_HDR, _CAP_KEEP) != 0:
            _fail("capget")
        # gVisor reports every capability in a user namespace the zygote
        # made, but keeps only those of its own bounding set (not
        # CAP_NET_RAW) once they are set: set them once, so that the
        # rehearsal's check compares what the kernel keeps.
        if _capset(_CAP_HDR, _CAP_KEEP) != 0 or _capget(_CAP_HDR, _CAP_KEEP) != 0:
            _fail("capset")
    except OSError as e:
        return "cannot read capabilities: %s" % e
    plan = (os.geteuid(), os.getegid(), _CAP_KEEP, ctypes.addressof(_ALLOW_FPROG))
    # The real drop passes these around, which writes their reference
    # counts: take those faults now too.
    list(DROP_PLAN)
    if VIEW_DIR:
        try:
            _mount("tmpfs", VIEW_DIR, "tmpfs", _VIEW_MOUNT_FLAGS, "mode=0700")
        except OSError:
            pass
        else:
            try:
                ws, stage = VIEW_DIR + "/ws", VIEW_DIR + "/stage"
                os.makedirs(ws + "/uploads/rehearsal/temparea", 0o755)
                os.mkdir(stage, 0o700)
                # Our own scratch tree: its owner is us, not root.
                if enter_run("rehearsal", 0, plan, ws, stage, {os.geteuid()}) is None:
                    return None
            except OSError:
                pass
            finally:
                libc.umount2(VIEW_DIR.encode(), MNT_DETACH)
    # Without the view's part, if that failed here: it fails the same way
    # for a run of a conversation, which says why.
    return enter_run("", 0, plan)


def pending(chan):
    return bool(select.select([chan], [], [], 0)[0])


# What a worker runs in its idle warm-up, the way it would run a request.
REHEARSAL = "print(1)\ndef handler(event):\n    return {'n': len(str(event)), 'ok': True}\n"


def warm_up(chan):
    """Idle time: take the copy-on-write faults of the pages a run touches
    now rather than during the run (each costs tens of microseconds on a
    virtualized machine): rehearse a whole run on /dev/null, then the
    template's warm-ups (a small DataFrame for pandas). A run that comes
    meanwhile waits for one step at most."""
    try:
        rehearse()
    except BaseException:
        pass
    for name, code in WORKER_WARM_UPS.items():
        if name not in PRELOADED:
            continue
        g = {}
        for stmt in code:
            if pending(chan):
                return
            try:
                exec(stmt, g)
            except BaseException:
                break


def rehearse():
    """A run of REHEARSAL through the same steps as a request: the message
    and its descriptors, the payload, the run, the result (RES_FD is
    /dev/null until the run), interpreter exit's modules."""
    p = {"language": "python", "code": REHEARSAL, "event": [1, "a", None], "env": dict(os.environ), "cwd": "/"}
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    mfd = os.memfd_create("sbx-rehearsal", os.MFD_CLOEXEC)
    try:
        os.write(mfd, json.dumps(p).encode())
        socket.send_fds(a, [RUN_MSG], [mfd, 0, 0, 0])
        _, fds = recv(b)
        close_all(fds[1:])
        p = read_payload(fds[0])
        os.close(fds[0])
    finally:
        a.close()
        b.close()
        os.close(mfd)
    prepare(p)
    write_result(RUNNER.run(p, RUNNER.new_main_module().__dict__, False), close=False)
    RUNNER.warm_finish()


def read_payload(fd):
    size = os.fstat(fd).st_size
    chunks, off = [], 0
    while off < size:
        b = os.pread(fd, size - off, off)
        if not b:
            break
        chunks.append(b)
        off += len(b)
    return json.loads(b"".join(chunks))


CAP_SETGID = 6


def setgid_idle():
    """The unprivileged mode's zygote, first thing: the shim hands it
    CAP_SETGID (ambient, to survive the exec) for one use, the
    conversation's group a worker takes at its drop (podviews.go). Keep
    it permitted only: out of the effective set, so that nothing runs
    with it, and of the inheritable and ambient ones, so that no exec
    passes it on."""
    if not UNPRIV:
        return
    buf = (ctypes.c_uint32 * 6)()
    if _capget(_CAP_HDR, buf) != 0:
        _fail("capget")
    buf[0] = buf[3] = 0  # effective
    buf[2] = buf[5] = 0  # inheritable (which empties the ambient set too)
    if _capset(_CAP_HDR, buf) != 0:
        _fail("capset")
    if prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL) != 0 and ctypes.get_errno() != errno.EINVAL:
        _fail("PR_CAP_AMBIENT_CLEAR_ALL")


def setgid_kept():
    """Whether the unprivileged zygote's CAP_SETGID is ours (setgid_idle)."""
    buf = (ctypes.c_uint32 * 6)()
    if _capget(_CAP_HDR, buf) != 0:
        return False
    return bool(buf[1] & (1 << CAP_SETGID))


def raise_setgid():
    """Make the kept CAP_SETGID effective, for setgroups at the drop."""
    buf = (ctypes.c_uint32 * 6)()
    if _capget(_CAP_HDR, buf) != 0:
        _fail("capget")
    buf[0] |= buf[1] & (1 << CAP_SETGID)
    if _capset(_CAP_HDR, buf) != 0:
        _fail("capset")


def drop_inherited_caps():
    """In the zygote, once: empty the bounding and ambient sets, which every
    worker inherits. They only bound what an execve could gain; the zygote
    never execs and keeps its own permitted set. Returns whether it worked
    (if not, each worker drops them itself)."""
    try:
        if UNPRIV:
            # Without CAP_SETPCAP PR_CAPBSET_DROP fails; the shim emptied
            # them but for CAP_SETGID (setgid_idle), and nothing can fill
            # them again.
            got = status_fields(("CapBnd", "CapAmb"))
            return int(got.get("CapBnd", "1"), 16) & ~(1 << CAP_SETGID) == 0 and int(got.get("CapAmb", "0"), 16) == 0
        drop_bounding_and_ambient()
        got = status_fields(("CapBnd", "CapAmb"))
        return int(got.get("CapBnd", "1"), 16) == 0 and int(got.get("CapAmb", "0"), 16) == 0
    except (OSError, ValueError):
        return False


def drop_bounding_and_ambient():
    fd = os.open("/proc/sys/kernel/cap_last_cap", os.O_RDONLY | os.O_CLOEXEC)
    try:
        last = int(os.read(fd, 64))
    finally:
        os.close(fd)
    for cap in range(last + 1):
        if prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() != errno.EINVAL:
            _fail("PR_CAPBSET_DROP %d" % cap)
    # gVisor has no ambient set (EINVAL); the caller checks it is empty.
    if prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL) != 0 and ctypes.get_errno() != errno.EINVAL:
        _fail("PR_CAP_AMBIENT_CLEAR_ALL")


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWNS = 0x00020000


def proc_overmounts():
    """The container runtime's masks over /proc (maskedPaths: /dev/null or
    a read-only tmpfs over a path; readonlyPaths: the path bound onto itself
    read-only), read once from our mount table, so that a worker's own
    /proc can be given the same ones."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            if not point.startswith("/proc/"):
                continue
            fstype = fields[fields.index("-") + 1]
            out.append((point, fstype == "proc"))
    return out


def _mount(src, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None
    if libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        _fail("mount %s on %s" % (fstype or src, target))


def own_proc(overmounts):
    """Give this worker (PID 1 of a fresh PID namespace) a mount namespace
    with a /proc of that PID namespace: code sees its own processes only,
    so it cannot read another execution's (or a warm worker's) memory,
    environment or root through /proc, although they run as the same uid."""
    if libc.unshare(CLONE_NEWNS) != 0:
        _fail("unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path, readonly in overmounts:
        if not os.path.exists(path):
            continue
        if readonly:
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0")
        else:
            _mount("/dev/null", path, None, MS_BIND)


# Read once, in the zygote (this file runs in its namespace at start). The
# shim removed them from the zygote's mount namespace (a worker could not
# mount its /proc under them) and says what they were.
if UNPRIV:
    PROC_OVERMOUNTS = []  # no /proc of its own (isolate)
elif "proc_overmounts" in CFG and CFG["proc_overmounts"] is not None:
    PROC_OVERMOUNTS = [(m["path"], m["readonly"]) for m in CFG["proc_overmounts"]]
else:
    PROC_OVERMOUNTS = proc_overmounts()


# ------------------------------------------------------- conversation views
#
# A run for conversation C sees at WORKSPACE/uploads a read-only directory
# holding one entry, temparea, a read-only view of WORKSPACE/uploads/C/
# temparea (empty if that does not exist); no path leads to another
# conversation's files. It is made in the worker's own mount namespace,
# still privileged, after the run message and before the drop.
#
# Sandboxed code of other runs shares the workspace and may rename, plant
# symlinks or swap directories at any moment. So every source is opened
# component by component from a descriptor of the workspace with O_PATH |
# O_NOFOLLOW | O_DIRECTORY, and must be a real directory owned by root
# that no one else may write (so that its entries are the control plane's,
# and stay put); mounts take their sources and targets as /proc/self/fd/N
# of those descriptors (the trailing slash makes gVisor follow the magic
# link too, as Linux always does), never a path the sandbox can change. The
# view is assembled on a tmpfs at VIEW_DIR (a root-owned directory of the
# zygote's read-only copy of the control directory, on which each worker
# mounts a tmpfs of its own in its own mount namespace), and then moved
# onto the uploads directory as a whole. In the workers' user namespace
# root's files show as the overflow ids, which count as root's here.

MS_MOVE = 8192
MNT_DETACH = 2
_O_DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_VIEW_MOUNT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC
_VIEW_RO_FLAGS = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
# api.go's conversationPattern, checked again before the id names a directory.
_CONVERSATION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class ViewError(Exception):
    pass


def _overflow_id(kind):
    try:
        with open("/proc/sys/kernel/overflow" + kind) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65534


# Root's files as the workers see them: in their user namespace, which maps
# only the sandbox user, root's uid and gid show as the overflow ids.
ROOT_UIDS = {0, _overflow_id("uid")}
ROOT_GIDS = {0, _overflow_id("gid")}


def _root_dir(dir_fd, name, what, missing_ok=False, owners=None):
    """name in dir_fd as an O_PATH descriptor, without following a symlink:
    a directory owned by root (or one of owners, for the rehearsal's own
    scratch tree) that no one else may write. -1 if it does not exist and
    missing_ok."""
    try:
        fd = os.open(name, _O_DIR_PATH, dir_fd=dir_fd)
    except FileNotFoundError:
        if missing_ok:
            return -1
        raise ViewError("%s does not exist" % what)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            raise ViewError("%s is not a directory (a symbolic link or a file); refusing to use it" % what)
        raise ViewError("%s: %s" % (what, e.strerror))
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise ViewError("%s is not a directory; refusing to use it" % what)
        if (st.st_uid not in owners) if owners else (st.st_uid not in ROOT_UIDS or st.st_uid == UID):
            raise ViewError("%s is owned by uid %d, not root; refusing to use it" % (what, st.st_uid))
        if st.st_mode & 0o002 or (st.st_mode & 0o020 and (st.st_gid not in ROOT_GIDS or st.st_gid == GID)):
            raise ViewError("%s (mode %o) is writable by others than root; refusing to use it" % (what, st.st_mode & 0o7777))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _place_view(stage, up):
    """Put the view assembled at stage over the uploads directory up."""
    target = "/proc/self/fd/%d/" % up
    if libc.mount(stage.encode(), target.encode(), None, MS_MOVE, None) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:
        _fail("mount %s on %s" % (stage, target))
    # gVisor has no MS_MOVE: a recursive bind of the view (its mounts keep
    # their read-only flags), then the staging mount goes.
    _mount(stage, target, None, MS_BIND | MS_REC)
    libc.umount2(stage.encode(), MNT_DETACH)


def conversation_view(conv, workspace, stage, owners=None):
    """Make the view of conversation conv's uploads (see above), with
    stage (a directory nobody can write, on which this worker mounts a
    tmpfs in its own mount namespace) to assemble it in."""
    if not _CONVERSATION_RE.fullmatch(conv) or ".." in conv:
        raise ViewError("not a valid conversation id")
    if not stage:
        raise ViewError("the executor configured no staging directory for views")
    uploads = workspace + "/uploads"
    fds = []
    try:
        ws = os.open(workspace, _O_DIR_PATH)
        fds.append(ws)
        up = _root_dir(ws, "uploads", uploads, owners=owners)
        fds.append(up)
        area = -1
        c = _root_dir(up, conv, "%s/%s" % (uploads, conv), missing_ok=True, owners=owners)
        if c >= 0:
            fds.append(c)
            area = _root_dir(c, "temparea", "%s/%s/temparea" % (uploads, conv), missing_ok=True, owners=owners)
            if area >= 0:
                fds.append(area)
        # The tmpfs on stage is in this mount namespace, which is ours alone.
        _mount("tmpfs", stage, "tmpfs", _VIEW_MOUNT_FLAGS, "mode=0755")
        root = os.open(stage, _O_DIR_PATH)
        fds.append(root)
        inner = stage + "/temparea"
        os.mkdir(inner, 0o755)
        if area >= 0:
            _mount("/proc/self/fd/%d/" % area, inner, None, MS_BIND)
            _mount(None, inner, None, _VIEW_RO_FLAGS)
        _mount(None, stage, None, _VIEW_RO_FLAGS)
        _place_view(stage, up)
        # The view covers the directory we opened wherever it is; make sure
        # that is still the one the run will find at workspace/uploads.
        want = os.fstat(root)
        got = os.stat("uploads", dir_fd=ws, follow_symlinks=False)
        if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):
            raise ViewError("%s was replaced while its view was made" % uploads)
    finally:
        # Before any code runs: a descriptor of the real uploads directory
        # would lead past the view.
        close_all(fds)


def isolate():
    """The part of a worker's set-up that needs no knowledge of its run:
    done at fork, before the idle warm-up. The worker keeps the zygote's
    capabilities over the workers' user namespace until drop_privileges,
    because a conversation's view needs mounts, and which conversation is
    known only when the run comes."""
    if UNPRIV:
        # Non-dumpable (forked from the zygote), our /proc files are root's:
        # dumpable for the one write.
        prctl(PR_SET_DUMPABLE, 1)
    # Raw descriptors, not file objects: fewer objects, fewer faults.
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"1000")  # the OOM killer picks user code, never the zygote
        finally:
            os.close(fd)
    finally:
        if UNPRIV:
            prctl(PR_SET_DUMPABLE, 0)
    os.setsid()
    if UNPRIV:
        # No PID namespace of our own: as a child subreaper we keep what
        # the run starts (double-forked daemons too) in our tree while we
        # live; once we are gone, the executor kills what is left
        # (unprivileged.go).
        if prctl(PR_SET_CHILD_SUBREAPER, 1) != 0:
            _fail("PR_SET_CHILD_SUBREAPER")
    else:
        own_proc(PROC_OVERMOUNTS)
    if not INHERITED_CAPS_DROPPED:
        drop_bounding_and_ambient()
        # (The zygote checked the sets it emptied for every worker.)
        got = status_fields(("CapBnd", "CapAmb"))
        for key in ("CapBnd", "CapAmb"):
            if int(got.get(key, "0"), 16) != 0:
                raise RuntimeError("%s is %s after dropping it" % (key, got[key]))
    # An idle worker must not outlive its zygote. (drop_privileges sets it
    # again: changing uid clears it.)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def drop_privileges(plan, groups=()):
    """The final drop (to DROP_PLAN), after the run message and before
    anything of the run is read: uid/gid 1000, no groups but groups (a
    conversation's, in the unprivileged mode), every capability set empty,
    no_new_privs, the inner seccomp filter."""
    uid, gid, caps, fprog = plan
    # In the workers' user namespace setgroups is denied, and there are no
    # groups to clear (the shim started the zygote with none).
    if groups or os.getgroups():
        if UNPRIV:
            raise_setgid()
        os.setgroups(list(groups))
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    # setresuid away from 0 clears the permitted, effective and ambient
    # sets but not the inheritable one.
    if _capset(_CAP_HDR, caps) != 0:
        _fail("capset")
    if prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
        _fail("PR_SET_NO_NEW_PRIVS")
    # Changing uid made us non-dumpable, which makes /proc/self/* root-owned
    # and unreadable to the user's own code (subprocess lists /proc/self/fd).
    prctl(PR_SET_DUMPABLE, 1)
    # Changing uid also cleared the parent-death signal. (If the zygote is
    # already gone, the executor kills the workers it knows of; one it never
    # heard of finds its channel closed and exits at its first read.)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    check_dropped(uid, gid, caps, groups)
    if fprog:
        if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog) != 0:
            _fail("PR_SET_SECCOMP")
    elif CFG.get("require_seccomp", True):
        raise RuntimeError("no inner seccomp filter configured")


def status_fields(keys):
    """The given fields of /proc/self/status, as text."""
    fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)
    out = {}
    for line in data.split("\n"):
        key, _, val = line.partition(":")
        if key in keys:
            out[key] = val.strip()
    return out


def check_dropped(uid, gid, caps, groups=()):
    """Check the drop with system calls, not /proc/self/status, which is
    on the run's path now and costs a hundred microseconds and more to
    read and parse. The bounding set was emptied and checked before (it
    can never grow back), and the kernel keeps the ambient set within the
    permitted one, which capget shows empty. (setresuid sets the
    filesystem uid to the effective one; gVisor has no setfsuid to read it
    back.)"""
    if os.getresuid() != (uid, uid, uid):
        raise RuntimeError("uids are %s after dropping privileges" % (os.getresuid(),))
    if os.getresgid() != (gid, gid, gid):
        raise RuntimeError("gids are %s after dropping privileges" % (os.getresgid(),))
    if sorted(os.getgroups()) != sorted(groups):
        raise RuntimeError("supplementary groups are %s after dropping privileges, not %s" % (os.getgroups(), list(groups)))
    if _capget(_CAP_HDR, _CAP_GOT) != 0:
        _fail("capget")
    if _CAP_GOT[:] != caps[:]:
        raise RuntimeError("capabilities are %s after dropping privileges" % _CAP_GOT[:])
    if prctl(PR_GET_NO_NEW_PRIVS) != 1:
        raise RuntimeError("no_new_privs is not set")


def executor_error(msg):
    return {"type": "ExecutorError", "message": msg, "traceback": ""}


def write_result(res, close=True):
    """Write the result and (if close) close the pipe.
    res["return_value"], if any, is JSON text already and is spliced in."""
    rv = res.pop("return_value", None)
    data = json.dumps(res)  # ensure_ascii: lone surrogates survive
    if rv is not None:
        data = data[:-1] + ', "return_value": ' + rv + "}"
    write_all(data.encode())
    if close:
        close_result()


def write_all(b):
    while b:
        n = os.write(RES_FD, b)
        b = b[n:]


def close_result():
    """Close the result pipe (its EOF ends a context run), keeping the slot
    taken (see worker_main)."""
    try:
        os.dup2(0, RES_FD, inheritable=False)
    except OSError:
        os.close(RES_FD)


def prepare(p):
    """Environment and working directory of one run; an error dict or None."""
    os.environ.clear()
    os.environ.update(p.get("env") or {})
    try:
        os.chdir(p["cwd"])
    except OSError as e:
        return {"type": type(e).__name__, "message": "cwd %s: %s" % (p["cwd"], e.strerror), "traceback": ""}
    return None


def run_once(p):
    err = prepare(p)
    if err is not None:
        write_result({"exit_code": 1, "error": err})
        os._exit(1)
    if p["language"] == "bash":
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores them; exec would keep that
        try:
            os.execve(BASH, [BASH, "--noprofile", "--norc", "-c", p["code"]], os.environ)
        except OSError as e:
            write_result({"exit_code": 127, "error": executor_error("exec %s: %s" % (BASH, e))})
            os._exit(127)
    res = RUNNER.run(p, RUNNER.new_main_module().__dict__, False)
    code = res["exit_code"]
    write_result(res, close=False)
    RUNNER.finish()
    # From here on this process only exits, with the result's exit code: the
    # NUL says so (a crash or os._exit in the threads or atexit handlers
    # above leaves it out, and the executor waits for the wait status).
    # Daemon threads die with the process as at any interpreter exit.
    write_all(b"\0")
    close_result()
    os._exit(code & 0xFF)


def context_loop(chan):
    module = RUNNER.new_main_module()
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 2)
    send(chan, {"op": "ready"})
    while True:
        msg, fds = recv(chan)
        if msg is None:
            os._exit(0)
        if msg.get("op") != "run" or len(fds) != 4:
            close_all(fds)
            continue
        payload_fd, out_fd, err_fd, res_fd = fds
        try:
            p = read_payload(payload_fd)
        except BaseException as e:
            p = None
            perr = executor_error("cannot read the request: %s: %s" % (type(e).__name__, e))
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.dup2(res_fd, RES_FD, inheritable=False)
        close_all([payload_fd, out_fd, err_fd, res_fd])
        err = perr if p is None else prepare(p)
        if err is not None:
            res = {"exit_code": 1, "error": err}
        else:
            res = RUNNER.run(p, module.__dict__, True)
        # Let go of the output pipes before the result, so that the result's
        # EOF means the run's output is complete too.
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        os.dup2(null, 1)
        os.dup2(null, 2)
        write_result(res)


