"""sbx zygote: forks the processes that run user code from an interpreter
that has already imported the template's heavy modules.

Started by the executor as `python3 -I zygote.py CONFIG_JSON` with its
control socket (AF_UNIX, SOCK_SEQPACKET) on fd 3. Messages are one JSON
object each, with file descriptors attached (SCM_RIGHTS):

  executor -> zygote  {"op":"spawn","tag":N,"kind":"run"}      fds: payload, stdout, stderr, result
                      {"op":"spawn","tag":N,"kind":"context"}  fds: the context's own channel
  zygote -> executor  {"op":"ready","preloaded":[...],"errors":{name: msg}}
                      {"op":"spawned","tag":N,"pid":P}         fds: pidfd (if the kernel gives one)
                      {"op":"spawn_failed","tag":N,"error":"..."}
                      {"op":"exit","pid":P,"status":S}         (raw wait status)
                      {"op":"log","level":"...","msg":"..."}

The zygote stays single-threaded (it forks, and a fork of a threaded
process keeps one thread and whatever locks the others held): one poll loop
over the control socket and a SIGCHLD wakeup pipe.

Every process it forks (a "worker") is PID 1 of a fresh PID namespace, so
that when it dies the kernel kills everything it started, daemons included.
The worker drops to the sandbox user with no capabilities (bounding set
included), sets no_new_privs, installs the inner seccomp filter and only
then waits on its channel (fd 3) for {"op":"run"} with the payload, stdout,
stderr and result descriptors. A run worker serves one run and exits; a
context worker serves runs until its channel closes.

Fork is the expensive part (page tables of a big interpreter, then a copy
on write of every page the child touches), so the zygote keeps a few run
workers forked, set up and warmed ahead of demand, and hands a request to
one of them.
"""

import ctypes
import errno
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import time

_TP = os.environ.get("SBX_TRACE")
_TFD = -1
if _TP:
    _TFD = os.dup2(os.open(_TP, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666), 99, inheritable=False)
_ROLE = ["zyg"]


def T(ev):
    if _TFD >= 0:
        os.write(_TFD, b"%d %s %s\n" % (time.monotonic_ns(), _ROLE[0].encode(), ev.encode()))


T("py.top")
CFG = json.loads(sys.argv[1])
UID = CFG["uid"]
GID = CFG["gid"]
BASH = CFG.get("bash") or "/bin/bash"
WARM = CFG.get("warm", 1)
RUNNER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
MAX_RETURN = CFG.get("max_return_bytes", 16 << 20)
CTL_FD = 3  # the zygote's control socket; in a worker, its channel
RES_FD = 4  # in a worker during a run: the result pipe
MAX_MSG = 1 << 16
MAX_FDS = 8

CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522

libc = ctypes.CDLL(None, use_errno=True)


def _fail(what):
    e = ctypes.get_errno()
    raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def prctl(option, a2=0, a3=0, a4=0, a5=0):
    # prctl is variadic: pass every argument as an unsigned long.
    ul = ctypes.c_ulong
    return libc.prctl(ctypes.c_int(option), ul(a2), ul(a3), ul(a4), ul(a5))


def _read_filter():
    path = CFG.get("seccomp_file") or ""
    if not path:
        return b""
    with open(path, "rb") as f:
        prog = f.read()
    if not prog or len(prog) % 8:
        raise ValueError("seccomp filter %s: %d bytes is not a sock_filter array" % (path, len(prog)))
    return prog


# Read while still root: the file lives in the root-only control directory.
FILTER = _read_filter()


# ---------------------------------------------------------------- messages

def send(sock, obj, fds=()):
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def log(sock, level, msg):
    try:
        send(sock, {"op": "log", "level": level, "msg": msg})
    except OSError:
        pass


def recv(sock):
    """One message and its fds; (None, []) at EOF."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MSG, MAX_FDS)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        close_all(fds)
        raise ValueError("truncated control message")
    if not data:
        close_all(fds)
        return None, []
    return json.loads(data), fds


def close_all(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# ---------------------------------------------------------------- zygote

# A first use of these libraries does lazy imports and fills caches. Done
# once in the zygote, every worker inherits the result instead of paying
# for it (tens of milliseconds for a first DataFrame).
WARM_UPS = {
    "numpy": "import numpy as np\n"
             "a = np.arange(12, dtype=float).reshape(3, 4)\n"
             "a.sum(axis=0).tolist(); a.mean(); np.float64(1.5).item(); str(a); repr(a)\n",
    "pandas": "import io, pandas as pd\n"
              "df = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', None, 'y'], 'c': [1.5, 2.5, None]})\n"
              "df.to_dict(orient='records'); df.describe(); df.groupby('b')['a'].sum(); df['a'].tolist()\n"
              "df.sort_values('a'); df[df.a > 1]; str(df); repr(df); df.to_csv(io.StringIO())\n"
              "pd.read_csv(io.StringIO('x,y\\n1,2\\n')); pd.Timestamp('2024-01-01').isoformat()\n",
}

class Zygote:
    def __init__(self, sock):
        self.sock = sock
        self.own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.warm = []  # [(pid, channel)] run workers waiting for a run
        self.running = set()  # pids of run workers handed a run
        self.next_fork = 0.0  # monotonic time before which not to pre-fork

    def loop(self):
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        while True:
            # Pre-fork only when idle, so that no request waits behind a
            # fork; and, while a warm worker is left, only once no run is
            # going, so that a run's exit is not reaped late because the
            # zygote was busy forking.
            prefork = (len(self.warm) < WARM and time.monotonic() >= self.next_fork
                       and (not self.warm or not self.running))
            events = poller.poll(0 if prefork else None)
            if not events:
                self.prefork()
                continue
            for fd, _ in events:
                if fd == wake_r:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                    self.reap()
                    continue
                try:
                    msg, fds = recv(self.sock)
                except (ValueError, OSError) as e:
                    log(self.sock, "error", "bad control message: %s" % e)
                    continue
                if msg is None:
                    os._exit(0)  # the executor went away
                if msg.get("op") == "spawn":
                    T("spawn.recv")
                    self.spawn(msg, fds)
                else:
                    close_all(fds)
                    log(self.sock, "warn", "unknown op %r" % msg.get("op"))

    def prefork(self):
        try:
            T("prefork.start")
            self.warm.append(self.fork_worker("run"))
            T("prefork.end")
        except OSError as e:
            self.next_fork = time.monotonic() + 1.0
            log(self.sock, "warn", "cannot pre-fork a worker: %s" % e)

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            T("reaped")
            self.running.discard(pid)
            for i, (wpid, chan) in enumerate(self.warm):
                if wpid == pid:  # died while idle: the executor never knew it
                    chan.close()
                    del self.warm[i]
                    break
            send(self.sock, {"op": "exit", "pid": pid, "status": status})
            T("exit.sent")

    def fork_worker(self, kind, chan_fd=-1):
        """Fork a worker; for a run worker, return (pid, our end of its channel)."""
        ours = None
        if chan_fd < 0:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            chan_fd = theirs.fileno()
        try:
            # unshare(CLONE_NEWPID) only sets the namespace of the *next*
            # children, and refuses (EINVAL) while that is not our own. Point
            # it back at our own first, so that every fork gets a new one.
            # gVisor has no setns for PID namespaces (EINVAL) but lets
            # unshare(CLONE_NEWPID) be repeated, so go on to unshare there.
            if libc.setns(self.own_pidns, CLONE_NEWPID) != 0 and ctypes.get_errno() != errno.EINVAL:
                _fail("setns(own pid namespace)")
            if libc.unshare(CLONE_NEWPID) != 0:
                _fail("unshare(CLONE_NEWPID)")
            pid = os.fork()
        except BaseException:
            if ours is not None:
                ours.close()
                theirs.close()
            raise
        if pid == 0:
            status = 70
            try:
                worker_main(kind, chan_fd)
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else 70
            except BaseException:
                try:
                    import traceback
                    os.write(2, traceback.format_exc().encode("utf-8", "replace"))
                except BaseException:
                    pass
            os._exit(status)  # never return into the zygote's loop
        if ours is not None:
            theirs.close()
        return pid, ours

    def spawn(self, msg, fds):
        tag, kind = msg.get("tag"), msg.get("kind")
        try:
            if kind == "context" and len(fds) == 1:
                pid, _ = self.fork_worker("context", fds[0])
            elif kind == "run" and len(fds) == 4:
                pid = self.hand_out(fds)
            else:
                raise ValueError("bad spawn request %r with %d fds" % (kind, len(fds)))
        except (OSError, ValueError) as e:
            close_all(fds)
            send(self.sock, {"op": "spawn_failed", "tag": tag, "error": str(e)})
            return
        close_all(fds)
        pidfd = -1
        try:
            pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            pass  # the executor falls back to kill(pid)
        send(self.sock, {"op": "spawned", "tag": tag, "pid": pid}, [pidfd] if pidfd >= 0 else [])
        T("spawned.sent")
        if pidfd >= 0:
            os.close(pidfd)

    def hand_out(self, fds):
        """Give the run to a warm worker, or to a fresh one."""
        while True:
            fresh = not self.warm
            pid, chan = self.fork_worker("run") if fresh else self.warm.pop(0)
            try:
                T("handout.fresh" if fresh else "handout.warm")
                socket.send_fds(chan, [b'{"op":"run"}'], fds)
                self.running.add(pid)
                return pid
            except OSError:
                # It died while idle (reap reports its exit, for a pid the
                # executor never heard of): try the next one.
                if fresh:
                    raise
            finally:
                chan.close()


def main():
    sock = socket.socket(fileno=CTL_FD)
    preloaded, errors = [], {}
    # The runner's own modules first, then the template's list.
    for name in ["json", "traceback", "ast", "linecache", "types", "asyncio", "inspect"] + (CFG.get("preload") or []):
        try:
            importlib.import_module(name)
            T("imported " + name)
            preloaded.append(name)
        except BaseException as e:  # an import may even call sys.exit
            errors[name] = "%s: %s" % (type(e).__name__, e)
    for name, code in WARM_UPS.items():
        if name in preloaded:
            try:
                exec(code, {})
            except BaseException as e:
                log(sock, "warn", "warm-up of %s failed: %s: %s" % (name, type(e).__name__, e))
    # Keep the imported objects out of the collector's reach, so that a
    # collection in a worker does not touch (and so copy) every shared page.
    T("warmups.done")
    gc.collect()
    gc.freeze()
    T("gc.frozen")
    # The executor stops the zygote with SIGKILL or by closing the socket.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    z = Zygote(sock)
    send(sock, {"op": "ready", "preloaded": preloaded, "errors": errors,
                "python": sys.version.split()[0]})
    T("ready.sent")
    z.loop()


# ---------------------------------------------------------------- worker

def worker_main(kind, chan_fd):
    _ROLE[0] = "wrk"
    T("forked")
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # 0, 1 = /dev/null; 2 stays the executor's log until the run (a crash
    # of the worker's own code is worth a traceback there); 3 = channel;
    # 4 = /dev/null holding RES_FD's place, so that received descriptors
    # never land on it.
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(chan_fd, CTL_FD, inheritable=False)
    os.dup2(null, RES_FD, inheritable=False)
    os.closerange(RES_FD + 1, 99)
    os.closerange(100, 1 << 30)
    chan = socket.socket(fileno=CTL_FD)
    setup_error = None
    try:
        become_user()
    except BaseException as e:
        setup_error = "cannot drop privileges: %s" % e
    T("become_user.done")
    if kind == "context":
        if setup_error:
            send(chan, {"op": "error", "error": setup_error})
            os._exit(70)
        context_loop(chan)
        return
    if not setup_error and not select.select([chan], [], [], 0)[0]:
        # Idle time: take the copy-on-write faults of the pages every run
        # touches now, rather than during the run.
        prepare({"env": dict(os.environ), "cwd": "/"})
        RUNNER.warm_up()
        T("warmup.done")
    msg, fds = recv(chan)
    T("run.recv")
    if msg is None or msg.get("op") != "run" or len(fds) != 4:
        os._exit(0)  # the zygote went away before handing us a run
    payload_fd, out_fd, err_fd, res_fd = fds
    os.dup2(res_fd, RES_FD, inheritable=False)
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
    T("payload.read")
    run_once(p)


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


def become_user():
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")  # the OOM killer picks user code, never the zygote
    os.setsid()
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() != errno.EINVAL:
            _fail("PR_CAPBSET_DROP %d" % cap)
    # gVisor has no ambient set (EINVAL); check_status verifies it is empty.
    if prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL) != 0 and ctypes.get_errno() != errno.EINVAL:
        _fail("PR_CAP_AMBIENT_CLEAR_ALL")
    os.setgroups([])
    os.setresgid(GID, GID, GID)
    os.setresuid(UID, UID, UID)
    # setresuid away from 0 clears the permitted, effective and ambient
    # sets but not the inheritable one.
    hdr = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(hdr, data) != 0:
        _fail("capset")
    if prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
        _fail("PR_SET_NO_NEW_PRIVS")
    # Changing uid made us non-dumpable, which makes /proc/self/* root-owned
    # and unreadable to the user's own code (subprocess lists /proc/self/fd).
    prctl(PR_SET_DUMPABLE, 1)
    # Changing uid also cleared the parent-death signal: an idle worker must
    # not outlive its zygote.
    # (If the zygote is already gone, the worker's channel is closed and it
    # exits at its first read.)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    check_status()
    if FILTER:
        install_seccomp(FILTER)
    elif CFG.get("require_seccomp", True):
        raise RuntimeError("no inner seccomp filter configured")


def check_status():
    want = {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0, "NoNewPrivs": 1}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            val = val.split()
            if key in want and int(val[0], 16 if key.startswith("Cap") else 10) != want[key]:
                raise RuntimeError("%s is %s after dropping privileges" % (key, val[0]))
            if key in ("Uid", "Gid") and set(val) != {str(UID if key == "Uid" else GID)}:
                raise RuntimeError("%s is %s after dropping privileges" % (key, " ".join(val)))
            if key == "Groups" and val:
                raise RuntimeError("supplementary groups %s kept" % " ".join(val))


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(prog):
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog)) != 0:
        _fail("PR_SET_SECCOMP")


def executor_error(msg):
    return {"type": "ExecutorError", "message": msg, "traceback": ""}


def write_result(res):
    """Write the result and close the pipe: its EOF ends the run.
    res["return_value"], if any, is JSON text already and is spliced in."""
    rv = res.pop("return_value", None)
    data = json.dumps(res)  # ensure_ascii: lone surrogates survive
    if rv is not None:
        data = data[:-1] + ', "return_value": ' + rv + "}"
    b = data.encode()
    while b:
        n = os.write(RES_FD, b)
        b = b[n:]
    # Close the pipe, keeping the slot taken (see worker_main).
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
    T("run.done")
    code = res["exit_code"]
    write_result(res)
    T("result.written")
    RUNNER.finish()
    T("finish.done")
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


def _load_runner():
    import types as _types
    # Not in sys.modules: user code must not find (or shadow) it by name.
    m = _types.ModuleType("_sbx_runner")
    m.__file__ = RUNNER_FILE
    m.MAX_RETURN = MAX_RETURN
    m.T = T
    with open(RUNNER_FILE) as f:
        exec(compile(f.read(), RUNNER_FILE, "exec"), m.__dict__)
    return m


RUNNER = _load_runner()

if __name__ == "__main__":
    main()
