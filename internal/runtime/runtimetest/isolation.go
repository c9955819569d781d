package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// testIsolation is R-74: hostile code stays in its sandbox, and the server
// and other sandboxes do not notice it.
func testIsolation(t *testing.T, h *Harness) {
	// One long-lived sandbox serves the checks that do not damage it, and
	// doubles as the bystander that must stay healthy while others burn.
	s := h.NewSandbox(t, runtime.Resources{MemoryMB: 256, PIDs: 128, TmpMB: 16})

	t.Run("Identity", func(t *testing.T) {
		capAmb, noNewPrivs := "st['CapAmb']", "st['NoNewPrivs']"
		if h.NoAmbientCaps {
			capAmb = "st.get('CapAmb', '0000000000000000')"
			noNewPrivs = "str(__import__('ctypes').CDLL(None).prctl(39, 0, 0, 0, 0))" // PR_GET_NO_NEW_PRIVS
		}
		out := returnString(t, s.MustRun(t, "python", `
import os
st = {}
for line in open('/proc/self/status'):
    k, _, v = line.partition(':')
    st[k] = v.strip()
return ' '.join([str(os.getuid()), str(os.getgid()), str(os.getgroups()),
    st['CapEff'], st['CapPrm'], st['CapInh'], st['CapBnd'], `+capAmb+`,
    `+noNewPrivs+`, st['Seccomp']])`))
		// The bounding set is empty but for what the zygote keeps
		// (h.ZygoteCaps), which nothing can gain again under no_new_privs
		// with every other set empty.
		want := fmt.Sprintf("1000 1000 [] 0000000000000000 0000000000000000 0000000000000000 %016x 0000000000000000 1 2", h.ZygoteCaps)
		if out != want {
			t.Errorf("uid gid groups CapEff CapPrm CapInh CapBnd CapAmb NoNewPrivs Seccomp:\n got %s\nwant %s", out, want)
		}
	})

	t.Run("HostUID", func(t *testing.T) {
		// Seen from the host, code in the sandbox is an unprivileged uid.
		h.host(t)
		if h.ProcessesOffHost {
			hostUIDOffHost(t, h, s)
			return
		}
		marker := fmt.Sprintf("sbx-uid-marker-%d", time.Now().UnixNano())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.Client.Run(ctx, wire.RunRequest{ID: marker, Language: "bash", Code: "exec -a " + marker + " sleep 30", TimeoutMs: 30000}, nil)
		}()
		defer func() { cancel(); <-done }()
		var uid string
		for i := 0; i < 500 && uid == ""; i++ {
			uid = hostUIDOf(marker)
			time.Sleep(10 * time.Millisecond)
		}
		if uid == "" {
			t.Fatal("the sandbox process was not found on the host")
		}
		if n, _ := strconv.Atoi(uid); n < 1000 {
			t.Errorf("sandbox code runs as host uid %s", uid)
		}
	})

	t.Run("ProcRoot", func(t *testing.T) {
		// A file only the host has must not be reachable through
		// /proc/1/root or any other path.
		h.host(t)
		secret := filepath.Join(os.TempDir(), fmt.Sprintf("sbx-host-secret-%d", time.Now().UnixNano()))
		if err := os.WriteFile(secret, []byte("host"), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(secret)
		out := returnString(t, s.MustRun(t, "python", fmt.Sprintf(`
res = []
for p in ['/proc/1/root%[1]s', '%[1]s', '/proc/self/root%[1]s', '/proc/1/cwd/../../..%[1]s']:
    try:
        open(p).read(); res.append('READ ' + p)
    except OSError as e:
        res.append(type(e).__name__)
return ' '.join(res)`, secret)))
		if strings.Contains(out, "READ") {
			t.Errorf("host file reachable: %s", out)
		}
	})

	t.Run("HostNetwork", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("host service"))
				c.Close()
			}
		}()
		port := ln.Addr().(*net.TCPAddr).Port
		ifaces := "os.listdir('/sys/class/net')"
		if h.NoSysfsNet {
			ifaces = "[name for _, name in socket.if_nameindex()]"
		}
		out := returnString(t, s.MustRun(t, "python", fmt.Sprintf(`
import socket, os
res = []
try:
    c = socket.create_connection(('127.0.0.1', %d), timeout=2); res.append('CONNECTED ' + c.recv(100).decode())
except OSError as e:
    res.append('refused')
res.append(','.join(sorted(%s)))
try:
    socket.create_connection(('10.0.2.2', 80), timeout=1); res.append('EGRESS')
except OSError:
    res.append('no-egress')
return ' '.join(res)`, port, ifaces)))
		want := "refused lo no-egress"
		if h.PodNetwork {
			want = "refused eth0,lo no-egress"
		}
		if out != want {
			t.Errorf("network: %s (want: %s)", out, want)
		}
	})

	t.Run("OtherWorkspace", func(t *testing.T) {
		other := h.NewSandbox(t, runtime.Resources{})
		other.MustRun(t, "python", "open('/workspace/other-secret.txt','w').write('mine')")
		// On a host, the other's directory there is a path to try too.
		hostPath := "/nonexistent"
		if h.onHost() && h.VolumeDir != nil {
			hostPath = h.VolumeDir(other.Volume)
		}
		out := returnString(t, s.MustRun(t, "python", fmt.Sprintf(`
import os, glob
hits = glob.glob('/workspace/other-secret.txt') + glob.glob('/proc/*/root/workspace/other-secret.txt')
for p in ['%s/other-secret.txt']:
    if os.path.exists(p): hits.append(p)
return ' '.join(hits) or 'none'`, hostPath)))
		if out != "none" {
			t.Errorf("another sandbox's file is visible: %s", out)
		}
	})

	t.Run("Syscalls", func(t *testing.T) {
		out := returnString(t, s.MustRun(t, "python", `
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
res = []
def check(name, rc):
    res.append(name + ('=ok' if rc == 0 else '=' + os.strerror(ctypes.get_errno())))
check('mount', libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 0, None))
check('unshare-user', libc.unshare(0x10000000))
check('unshare-ns', libc.unshare(0x00020000))
check('ptrace', libc.ptrace(16, 1, None, None))
check('keyctl', libc.syscall(250, 0, 0, 0, 0))
check('bpf', libc.syscall(321, 0, 0, 0))
check('chroot', libc.chroot(b'/tmp'))
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); res.append('raw=ok')
except OSError as e:
    res.append('raw=' + os.strerror(e.errno))
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW); res.append('packet=ok')
except OSError as e:
    res.append('packet=' + os.strerror(e.errno))
return ' '.join(res)`))
		for _, f := range strings.Fields(out) {
			if strings.HasSuffix(f, "=ok") {
				t.Errorf("allowed: %s (all: %s)", f, out)
			}
		}
		res := s.Run(t, "bash", "unshare -U -r true", 10*time.Second)
		if res.Status == wire.StatusCompleted {
			t.Errorf("unshare -U succeeded")
		}
	})

	t.Run("ReadOnlyRoot", func(t *testing.T) {
		out := returnString(t, s.MustRun(t, "python", `
res = []
for p in ['/usr/bin/evil', '/etc/evil', '/evil', '/opt/sbx/evil', '/opt/sbx/sbx-executor']:
    try:
        open(p, 'a').write('x'); res.append('WROTE ' + p)
    except OSError as e:
        res.append(type(e).__name__)
import os
# User code sees the zygote's read-only copy of sbx's scripts in place of
# the control directory (internal/executor/shim.go): never the executor's
# socket, and nothing it could write.
try:
    if 'executor.sock' in os.listdir('/run/sbx'):
        res.append('CONTROL-DIR-SOCKET')
except OSError:
    pass
for p in ['/run/sbx/evil', '/run/sbx/executor.sock', '/run/sbx/zygote.py']:
    try:
        open(p, 'a').write('x'); res.append('CONTROL-DIR-WROTE ' + p)
    except OSError as e:
        res.append(type(e).__name__)
return ' '.join(res)`))
		if strings.Contains(out, "WROTE") || strings.Contains(out, "CONTROL") {
			t.Errorf("write to rootfs or control dir: %s", out)
		}
	})

	t.Run("TmpFiller", func(t *testing.T) {
		res := s.Run(t, "bash", "dd if=/dev/zero of=/tmp/fill bs=1M count=64; df -m /tmp | tail -1", 30*time.Second)
		if !strings.Contains(res.Stderr, "No space left") {
			t.Errorf("filling /tmp did not hit its cap: %q %q", res.Stdout, res.Stderr)
		}
		s.MustRun(t, "bash", "rm -f /tmp/fill")
	})

	t.Run("CrossExecution", func(t *testing.T) {
		// Executions in one sandbox run as the same uid; their own PID
		// namespace must also hide them from each other, /proc included,
		// or one could read or write another's memory, environment and
		// mount namespace (and a warm worker's, the next execution's).
		marker := fmt.Sprintf("sbx-cross-%d", time.Now().UnixNano())
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		done := make(chan struct{})
		var once sync.Once
		go func() {
			defer close(done)
			// Its output says it runs, whether or not this host sees it.
			s.Client.Run(ctx, wire.RunRequest{ID: marker, Language: "bash", Env: map[string]string{"SECRET": marker},
				Code: "echo started; exec -a " + marker + " sleep 30", TimeoutMs: 30000},
				func(string, string) { once.Do(func() { close(started) }) })
		}()
		defer func() { cancel(); <-done }()
		select {
		case <-started:
		case <-done:
			t.Fatal("the other execution ended before it started")
		}
		// Where executions share a PID namespace (SharedProcesses), what
		// holds is that the executor and the zygote stay closed to them.
		only := "None"
		if h.SharedProcesses {
			only = "{'1'} | {q for q in os.listdir('/proc') if q.isdigit() and 'zygote.py' in open('/proc/%s/cmdline' % q, 'rb').read().decode(errors='replace')}"
		}
		out := returnString(t, s.MustRun(t, "python", fmt.Sprintf(`
import os
mine = os.getpid()
only = %s
seen = []
for p in os.listdir('/proc'):
    if not p.isdigit() or int(p) == mine or only is not None and p not in only:
        continue
    if only is not None and p != '1' and 'zygote.py' not in open('/proc/%%s/cmdline' %% p, 'rb').read().decode(errors='replace'):
        continue
    for f in (('environ', 'mem', 'root/workspace') if only is not None else ('cmdline', 'environ', 'mem', 'root/workspace')):
        try:
            if f == 'root/workspace':
                os.listdir('/proc/%%s/%%s' %% (p, f))
            else:
                open('/proc/%%s/%%s' %% (p, f), 'rb').read(64)
            seen.append(p + '/' + f)
        except OSError:
            pass
return ' '.join(seen) or 'none'`, only)))
		if out != "none" {
			t.Errorf("another execution's /proc entries are readable: %s (marker %s)", out, marker)
		}
	})

	t.Run("LeftBehind", func(t *testing.T) {
		s.MustRun(t, "bash", "setsid nohup sleep 1001 >/dev/null 2>&1 < /dev/null & disown; echo started")
		s.MustRun(t, "python", `
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp('sleep', ['sleep', '1002'])
    os._exit(0)`)
		out := returnString(t, s.MustRun(t, "python", `
import os
left = []
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            c = open('/proc/%s/cmdline' % p).read()
        except OSError:
            continue
        if 'sleep\x00100' in c: left.append(c)
return repr(left)`))
		if out != "[]" {
			t.Errorf("processes outlived their execution: %s", out)
		}
	})

	t.Run("ForkBomb", func(t *testing.T) {
		b := h.NewSandbox(t, runtime.Resources{PIDs: 64})
		// Its tasks at rest: the executor, the zygote's shim and the holder
		// of its namespaces (Go programs, a few threads each), the zygote
		// and its pre-forked worker.
		b.MustRun(t, "python", "print(1)")
		stats, hasStats := runtime.StatsReaderOf(h.Runtime)
		var idle *runtime.Stats
		if hasStats {
			var err error
			if idle, err = stats.Stats(context.Background(), b.ID); err != nil {
				t.Fatal(err)
			}
		}
		// While the bomb holds every process it may have, a bystander
		// sandbox (same uids, its own user namespace) can still fork.
		bystander := make(chan string, 1)
		go func() {
			time.Sleep(time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := s.Client.Run(ctx, wire.RunRequest{
				ID: fmt.Sprintf("e%d", seq.Add(1)), Language: "python", TimeoutMs: 20000, Code: `
import os
kids = []
for _ in range(8):
    k = os.fork()
    if k == 0:
        os._exit(0)
    kids.append(k)
for k in kids:
    os.waitpid(k, 0)
print(len(kids))`}, nil)
			switch {
			case err != nil:
				bystander <- err.Error()
			case res.Status != wire.StatusCompleted || res.Stdout != "8\n":
				bystander <- fmt.Sprintf("status %s stdout %q stderr %q", res.Status, res.Stdout, res.Stderr)
			default:
				bystander <- ""
			}
		}()
		if h.SandboxWidePids {
			forkBombSandboxWide(t, h, b, bystander)
			return
		}
		res := b.Run(t, "bash", `bomb() { bomb | bomb & }; bomb; sleep 3`, 5*time.Second)
		if res.Status == wire.StatusCompleted && res.ExitCode == 0 {
			t.Logf("fork bomb ended as %s", res.Status)
		}
		if msg := <-bystander; msg != "" {
			t.Errorf("a bystander could not fork during the fork bomb: %s", msg)
		}
		// Contained: the sandbox recovers, and (if the runtime reads
		// stats) has no more tasks than at rest.
		b.MustRun(t, "python", "print(1)")
		if hasStats {
			st, err := stats.Stats(context.Background(), b.ID)
			if err != nil || st.PIDs > idle.PIDs+4 {
				t.Errorf("after the fork bomb: %+v, %v (at rest before it: %d tasks)", st, err, idle.PIDs)
			}
		}
	})

	t.Run("MemoryBomb", func(t *testing.T) {
		b := h.NewSandbox(t, runtime.Resources{MemoryMB: 128})
		if h.SandboxWideOOM {
			memoryBombSandboxWide(t, h, b, s)
			return
		}
		res := b.Run(t, "python", memoryBomb, 30*time.Second)
		if res.Status == wire.StatusCompleted {
			t.Fatalf("a 1 GiB allocation in a 128 MiB sandbox completed: %+v", res)
		}
		if res.Error == nil || res.Error.Type != "OutOfMemory" && res.Error.Type != "MemoryError" {
			t.Errorf("memory bomb: status %s error %+v", res.Status, res.Error)
		}
		// The kill is in the sandbox's figures (usage reports them).
		if r, ok := runtime.StatsReaderOf(h.Runtime); ok && res.Error != nil && res.Error.Type == "OutOfMemory" {
			st, err := r.Stats(context.Background(), b.ID)
			t.Logf("after the memory bomb: %+v, %v", st, err)
			if err != nil || st.OOMKills == 0 {
				t.Errorf("after an execution the OOM killer ended: stats %+v, %v; want an OOM kill", st, err)
			}
		}
		b.MustRun(t, "python", "print('still here')")
		s.MustRun(t, "python", "print('bystander fine')")
	})
}

// memoryBomb allocates and touches 1 GiB.
const memoryBomb = "x = bytearray(1 << 30)\nx[::4096] = b'x' * len(x[::4096])\nprint('survived')"

// forkBombSandboxWide is ForkBomb for a runtime with SandboxWidePids: the
// bomb takes every process the sandbox may have, its executor's included,
// so the run may end without a result and the sandbox with it. What must
// hold: the run ends (no hang), the bystander sandbox forks meanwhile,
// and the bomb's sandbox then answers or is reported gone, never stuck
// in between.
func forkBombSandboxWide(t *testing.T, h *Harness, b *Sandbox, bystander <-chan string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := b.Client.Run(ctx, wire.RunRequest{ID: fmt.Sprintf("e%d", seq.Add(1)), Language: "bash",
		Code: `bomb() { bomb | bomb & }; bomb; sleep 3`, TimeoutMs: 5000}, nil)
	switch {
	case ctx.Err() != nil:
		t.Fatalf("the fork bomb's run never ended: %v", err)
	case err != nil:
		t.Logf("the fork bomb's run ended without a result: %v", err)
	default:
		t.Logf("fork bomb ended as %s", res.Status)
	}
	if msg := <-bystander; msg != "" {
		t.Errorf("a bystander could not fork during the fork bomb: %s", msg)
	}
	for {
		info, err := h.Runtime.Inspect(ctx, b.ID)
		if errors.Is(err, errdefs.ErrNotFound) || err == nil && info.State == runtime.StateStopped {
			t.Logf("the fork bomb's sandbox ended (%v)", err)
			return
		}
		hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
		_, herr := b.Client.Health(hctx)
		hcancel()
		if herr == nil {
			b.MustRun(t, "python", "print(1)")
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the fork bomb's sandbox neither answers nor ended: %+v, %v; health: %v", info, err, herr)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// memoryBombSandboxWide is MemoryBomb for a runtime with SandboxWideOOM:
// the bomb takes the whole sandbox b down, and that must be visible to the
// caller and harmless to bystander s.
func memoryBombSandboxWide(t *testing.T, h *Harness, b, s *Sandbox) {
	ctx := context.Background()
	res, err := b.Client.Run(ctx, wire.RunRequest{ID: fmt.Sprintf("e%d", seq.Add(1)), Language: "python", Code: memoryBomb, TimeoutMs: 30000}, nil)
	if err == nil && res.Status == wire.StatusCompleted {
		t.Fatalf("a 1 GiB allocation in a 128 MiB sandbox completed: %+v", res)
	}
	// The runtime reports the sandbox stopped once its kernel is gone (a
	// host init may take a moment to reap it).
	var info *runtime.Info
	for i := 0; i < 300; i++ {
		if info, err = h.Runtime.Inspect(ctx, b.ID); err != nil || info.State == runtime.StateStopped {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || info.State != runtime.StateStopped {
		t.Errorf("after the memory bomb (result %+v): %+v, %v; want a stopped sandbox", res, info, err)
	}
	if r, ok := runtime.StatsReaderOf(h.Runtime); ok {
		if st, err := r.Stats(ctx, b.ID); err != nil || st.OOMKills == 0 {
			t.Errorf("after the memory bomb: stats %+v, %v; want an OOM kill", st, err)
		}
	}
	s.MustRun(t, "python", "print('bystander fine')")
}

// hostUIDOffHost is HostUID for a runtime with ProcessesOffHost: while user
// code runs in s, every host process in the sandbox's cgroups (the
// runtime's kernel and its helpers) is an unprivileged uid.
func hostUIDOffHost(t *testing.T, h *Harness, s *Sandbox) {
	if h.CgroupDirs == nil {
		t.Fatal("ProcessesOffHost needs CgroupDirs")
	}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(done)
		s.Client.Run(ctx, wire.RunRequest{ID: fmt.Sprintf("e%d", seq.Add(1)), Language: "bash", Code: "echo started; exec sleep 30", TimeoutMs: 30000},
			func(string, string) { once.Do(func() { close(started) }) })
	}()
	defer func() { cancel(); <-done }()
	select {
	case <-started:
	case <-done:
		t.Fatal("the execution ended before it started")
	}
	pids := map[string]bool{}
	for _, d := range h.CgroupDirs(s.ID) {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, p := range strings.Fields(string(b)) {
			pids[p] = true
		}
	}
	if len(pids) == 0 {
		t.Fatal("no host process in the sandbox's cgroups")
	}
	for p := range pids {
		uid := uidOf(p)
		if n, err := strconv.Atoi(uid); err != nil || n < 1000 {
			t.Errorf("host process %s of the sandbox runs as uid %q", p, uid)
		}
	}
}

// uidOf returns the real uid of host process pid, "" if it is gone.
func uidOf(pid string) string {
	status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			return f[1]
		}
	}
	return ""
}

// hostUIDOf finds a process on the host whose command line starts with
// marker and returns its real uid.
func hostUIDOf(marker string) string {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(cmd), marker) {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
				return f[1]
			}
		}
	}
	return ""
}
