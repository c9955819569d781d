"""sbx zygote: forks the processes that run user code from an interpreter
that has already imported the template's heavy modules.

Started by the executor as `python3 -I zygote.py CONFIG_JSON` with its
control socket (AF_UNIX, SOCK_SEQPACKET) on fd 3. Messages are one JSON
object each, with file descriptors attached (SCM_RIGHTS):

  executor -> zygote  {"op":"spawn","tag":N,"kind":"run","conversation":C}      fds: payload, stdout, stderr, result
                      {"op":"spawn","tag":N,"kind":"context","conversation":C}  fds: the context's own channel
                      {"op":"took","pid":P}                    worker P has had a run for 0.1 s
  zygote -> executor  {"op":"ready","preloaded":[...],"errors":{name: msg}}
                      {"op":"worker","pid":P}                  fds: P's channel, pidfd (if any)
                      {"op":"spawned","tag":N,"pid":P}         fds: pidfd (if the kernel gives one)
                      {"op":"spawn_failed","tag":N,"error":"..."}
                      {"op":"exit","pid":P,"status":S}         (raw wait status)
                      {"op":"log","level":"...","msg":"..."}

The zygote stays single-threaded (it forks, and a fork of a threaded
process keeps one thread and whatever locks the others held): one poll loop
over the control socket, a SIGCHLD wakeup pipe and the settle pipes of the
workers still setting up.

Every process it forks (a "worker") is PID 1 of a fresh PID namespace, so
that when it dies the kernel kills everything it started, daemons included.
The worker takes a mount namespace and a /proc of its own, empties its
bounding set and warms up (rehearsing, among others, the steps below),
still with the zygote's capabilities over the workers' user namespace
(which maps uid 1000 alone: see enter_userns), then waits on its channel
(fd 3) for
{"op":"run","conversation":C} (conversation optional) with the payload,
stdout, stderr and result descriptors. Only then does it make the
conversation's view of the uploads (mounts), drop to the sandbox user with
no capabilities, set no_new_privs and install the inner seccomp filter,
and only then read the payload. A run worker serves one run and exits; a
context worker, which gets its conversation in the spawn request and
drops at once, serves runs until its channel closes.

Fork is the expensive part (page tables of a big interpreter, then a copy
on write of every page the child touches), so the zygote keeps a few run
workers forked, set up and warmed ahead of demand ("worker" messages hand
their channels to the executor, which sends a run straight to one of them:
the zygote is not on a run's path). It forks on demand ("spawn") when none
is left. Pre-forking waits while a run is going (a fork and a set-up would
share the CPU with it) unless the pool is empty and a run has gone on for a
while, and sets up one worker at a time.

A run worker writes its result, runs what interpreter exit would (threads,
atexit), and then a NUL byte: from there on it only exits, with the
result's exit code, so the executor may take its pidfd's exit for the end
of the run without waiting for the "exit" message.
"""

import ctypes
import errno
import gc
import importlib
import json
import math
import os
import re
import select
import signal
import socket
import stat
import sys
import time

CFG = json.loads(sys.argv[1])
UID = CFG["uid"]
GID = CFG["gid"]
BASH = CFG.get("bash") or "/bin/bash"
WARM = CFG.get("warm", 1)
# The executor's unprivileged mode (a Pod without CAP_SYS_ADMIN, shim.go's
# shimUnprivileged): no namespace of our own, and the scripts come as
# descriptors (FILES: name -> /proc/self/fd/N), not from beside us.
UNPRIV = bool(CFG.get("unprivileged"))
FILES = CFG.get("files") or {}
RUNNER_FILE = FILES.get("runner.py") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
WORKER_FILE = FILES.get("worker.py") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
MAX_RETURN = CFG.get("max_return_bytes", 16 << 20)
CTL_FD = 3  # the zygote's control socket; in a worker, its channel
RES_FD = 4  # in a worker during a run: the result pipe
SETTLE_FD = 5  # in a pre-forked worker until it is set up: closing it tells the zygote
RUN_MSG = b'{"op":"run"}'


def run_msg(conversation, group=0):
    """The run message a worker waits for (handoff.go's runMessage)."""
    if not conversation:
        return RUN_MSG
    m = {"op": "run", "conversation": conversation}
    if group:
        m["group"] = group
    return json.dumps(m).encode()


# While the pool is empty, a run that has gone on this long (seconds) no
# longer holds back the pre-fork of its successor (handoff.go's
# busyPreforkAfter).
BUSY_PREFORK_AFTER = 0.1
# After a run worker's exit the executor is answering for its run: the
# successor's fork (milliseconds of CPU) waits this long (seconds) rather
# than compete with it.
EXIT_PREFORK_DELAY = 0.003
MAX_MSG = 1 << 16
MAX_FDS = 8

CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
libc = ctypes.CDLL(None, use_errno=True)


def _fail(what):
    e = ctypes.get_errno()
    raise OSError(e, "%s: %s" % (what, os.strerror(e)))


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
    "numpy": [
        "import numpy as np",
        "a = np.arange(12, dtype=float).reshape(3, 4)",
        "a.sum(axis=0).tolist(); a.mean(); np.float64(1.5).item(); str(a); repr(a)",
    ],
    "pandas": [
        "import io, pandas as pd",
        "df = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', None, 'y'], 'c': [1.5, 2.5, None]})",
        "df.to_dict(orient='records'); df.describe(); df.groupby('b')['a'].sum(); df['a'].tolist()",
        "df.sort_values('a'); df[df.a > 1]; str(df); repr(df); df.to_csv(io.StringIO())",
        "pd.read_csv(io.StringIO('x,y\\n1,2\\n')); pd.Timestamp('2024-01-01').isoformat()",
    ],
}
PRELOADED = []  # what the zygote imported: the warm-ups that apply
INHERITED_CAPS_DROPPED = False  # the zygote emptied the bounding and ambient sets


class Zygote:
    def __init__(self, sock):
        self.sock = sock
        self.own_pidns = -1 if UNPRIV else os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.poller = select.poll()
        self.idle = set()  # pids of pre-forked workers the executor holds, no run yet
        self.settling = {}  # settle pipe -> pid, for pre-forked workers still setting up
        self.running = {}  # pid -> monotonic start, for run workers that have a run
        self.next_fork = 0.0  # monotonic time before which not to pre-fork

    def prefork_delay(self, now):
        """Seconds until the next pre-fork is due, or None while none is."""
        if len(self.idle) >= WARM or self.settling:
            return None
        due = self.next_fork
        if self.running:
            if self.idle:
                return None  # replace the used ones once the runs are over
            due = max(due, min(self.running.values()) + BUSY_PREFORK_AFTER)
        return max(0.0, due - now)

    def loop(self):
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.poller.register(self.sock.fileno(), select.POLLIN)
        self.poller.register(wake_r, select.POLLIN)
        while True:
            delay = self.prefork_delay(time.monotonic())
            # Pending messages come first: a pre-fork waits for a poll that
            # finds nothing to do.
            events = self.poller.poll(None if delay is None else math.ceil(delay * 1000))
            if not events:
                if delay is not None and self.prefork_delay(time.monotonic()) == 0:
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
                elif fd in self.settling:
                    self.poller.unregister(fd)
                    os.close(fd)
                    del self.settling[fd]
                else:
                    self.handle()

    def handle(self):
        try:
            msg, fds = recv(self.sock)
        except (ValueError, OSError) as e:
            log(self.sock, "error", "bad control message: %s" % e)
            return
        if msg is None:
            os._exit(0)  # the executor went away
        op = msg.get("op")
        if op == "spawn":
            self.spawn(msg, fds)
            return
        close_all(fds)
        if op == "took":
            # A run has gone on for BUSY_PREFORK_AFTER on worker pid (shorter
            # ones are not reported: the worker's exit is).
            pid = msg.get("pid")
            if pid in self.idle:  # else it is gone already, and reported
                self.idle.discard(pid)
                self.running[pid] = time.monotonic() - BUSY_PREFORK_AFTER
        else:
            log(self.sock, "warn", "unknown op %r" % op)

    def prefork(self):
        """Fork a run worker and hand its channel to the executor."""
        settle_r, settle_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid, chan = self.fork_worker("run", settle_fd=settle_w)
        except OSError as e:
            os.close(settle_r)
            self.next_fork = time.monotonic() + 1.0
            log(self.sock, "warn", "cannot pre-fork a worker: %s" % e)
            return
        finally:
            os.close(settle_w)
        self.settling[settle_r] = pid
        self.poller.register(settle_r, select.POLLIN)
        self.idle.add(pid)
        pidfd = pidfd_of(pid)
        try:
            send(self.sock, {"op": "worker", "pid": pid}, [chan.fileno()] + ([pidfd] if pidfd >= 0 else []))
        finally:
            chan.close()
            if pidfd >= 0:
                os.close(pidfd)

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.running.pop(pid, None) is not None or pid in self.idle:
                # The executor is answering for that run right now: leave it
                # the CPU for a moment before forking the successor (a fork
                # holds a CPU for milliseconds).
                self.next_fork = max(self.next_fork, time.monotonic() + EXIT_PREFORK_DELAY)
            self.idle.discard(pid)
            send(self.sock, {"op": "exit", "pid": pid, "status": status})

    def fork_worker(self, kind, chan_fd=-1, settle_fd=-1, conversation="", group=0):
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
            # Unprivileged: no PID namespace of its own (see worker.py's
            # isolate for what stands in for it).
            if not UNPRIV:
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
                worker_main(kind, chan_fd, settle_fd, conversation, group)
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
        """Fork a worker on demand: for a context, or a run no pre-forked worker took."""
        tag, kind = msg.get("tag"), msg.get("kind")
        conversation = msg.get("conversation") or ""
        group = msg.get("group") or 0
        try:
            if not isinstance(conversation, str):
                raise ValueError("bad conversation %r" % (conversation,))
            if not valid_group(group):
                raise ValueError("bad group %r" % (group,))
            if kind == "context" and len(fds) == 1:
                pid, _ = self.fork_worker("context", fds[0], conversation=conversation, group=group)
            elif kind == "run" and len(fds) == 4:
                pid, chan = self.fork_worker("run")
                try:
                    socket.send_fds(chan, [run_msg(conversation, group)], fds)
                finally:
                    chan.close()
                self.running[pid] = time.monotonic()
            else:
                raise ValueError("bad spawn request %r with %d fds" % (kind, len(fds)))
        except (OSError, ValueError) as e:
            close_all(fds)
            send(self.sock, {"op": "spawn_failed", "tag": tag, "error": str(e)})
            return
        close_all(fds)
        pidfd = pidfd_of(pid)
        send(self.sock, {"op": "spawned", "tag": tag, "pid": pid}, [pidfd] if pidfd >= 0 else [])
        if pidfd >= 0:
            os.close(pidfd)


def pidfd_of(pid):
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return -1  # the executor falls back to kill(pid) and the exit message


def main():
    sock = socket.socket(fileno=CTL_FD)
    setgid_idle()  # before any template code runs
    preloaded, errors = [], {}
    # The runner's own modules first, then the template's list.
    # (asyncio and inspect, which only some runs need, are imported by those
    # runs: asyncio alone is tens of milliseconds of start-up and megabytes.)
    for name in ["json", "traceback", "ast", "linecache", "types", "atexit"] + (CFG.get("preload") or []):
        try:
            importlib.import_module(name)
            preloaded.append(name)
        except BaseException as e:  # an import may even call sys.exit
            errors[name] = "%s: %s" % (type(e).__name__, e)
    PRELOADED.extend(preloaded)
    for name, code in WARM_UPS.items():
        if name in preloaded:
            try:
                exec("\n".join(code), {})
            except BaseException as e:
                log(sock, "warn", "warm-up of %s failed: %s: %s" % (name, type(e).__name__, e))
    # Keep the imported objects out of the collector's reach, so that a
    # collection in a worker does not touch (and so copy) every shared page.
    gc.collect()
    gc.freeze()
    try:
        enter_userns()
    except OSError as e:
        log(sock, "error", "cannot enter the workers' user namespace: %s" % e)
        os._exit(70)
    global INHERITED_CAPS_DROPPED
    INHERITED_CAPS_DROPPED = drop_inherited_caps()
    if UNPRIV:
        # Executions run as our uid beside us: none may read or write our
        # memory (through /proc or ptrace) to reach the runs of others.
        # Workers are forked non-dumpable too, until their drop.
        prctl(PR_SET_DUMPABLE, 0)
    # The executor stops the zygote with SIGKILL or by closing the socket.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    z = Zygote(sock)
    send(sock, {"op": "ready", "preloaded": preloaded, "errors": errors,
                "python": sys.version.split()[0]})
    z.loop()


def enter_userns():
    """Take the user namespace the workers run in, after the preload: the
    zygote runs the template's code (its interpreter, sitecustomize,
    preload list) as the sandbox user without any capability, and gets
    capabilities only over that namespace, which maps uid and gid 1000 and
    nothing else (shim.go). "join": the shim made it and handed us its
    descriptor, which its owner (our uid) may setns. "self" (gVisor, which
    cannot setns a user namespace): make it."""
    mode = CFG.get("userns") or ""
    if mode == "join":
        fd = CFG["userns_fd"]
        if libc.setns(fd, CLONE_NEWUSER) != 0:
            _fail("setns(user namespace)")
        os.close(fd)
    elif mode == "self":
        if libc.unshare(CLONE_NEWUSER) != 0:
            _fail("unshare(CLONE_NEWUSER)")
        for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (UID, UID)), ("gid_map", "%d %d 1" % (GID, GID))):
            try:
                fd = os.open("/proc/self/" + name, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, text.encode())
                finally:
                    os.close(fd)
            except OSError:
                if name != "setgroups":  # gVisor has no setgroups file
                    raise
    elif mode:
        raise OSError(errno.EINVAL, "unknown userns mode %r" % mode)


def _load_runner():
    import types as _types
    # Not in sys.modules: user code must not find (or shadow) it by name.
    m = _types.ModuleType("_sbx_runner")
    m.__file__ = RUNNER_FILE
    m.MAX_RETURN = MAX_RETURN
    with open(RUNNER_FILE) as f:
        exec(compile(f.read(), RUNNER_FILE, "exec"), m.__dict__)
    return m


def _include_worker():
    # worker.py is the other half of this script, split off for size: what a
    # forked worker runs. It is executed into this module's namespace, so
    # that both halves share one set of globals (configuration, messages).
    with open(WORKER_FILE) as f:
        exec(compile(f.read(), WORKER_FILE, "exec"), globals())


_include_worker()
RUNNER = _load_runner()
# Read: the descriptors the shim handed them over in are not the workers'.
for _path in FILES.values():
    if _path.startswith("/proc/self/fd/"):
        try:
            os.close(int(_path[len("/proc/self/fd/"):]))
        except (OSError, ValueError):
            pass

if __name__ == "__main__":
    main()
