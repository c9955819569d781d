//go:build integration

package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// podCaps is the sandbox Pod's container capability list: drop ALL, add
// these. SETPCAP is there for the shim to empty the bounding set it hands
// the zygote (PR_CAPBSET_DROP needs it).
var podCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL"}

// runtimeDefaultLike is the part of containerd's RuntimeDefault profile
// that decides what the unprivileged mode may do: without CAP_SYS_ADMIN it
// refuses every namespace (unshare, setns, clone with a CLONE_NEW* flag;
// clone3 answers ENOSYS so that libc falls back to clone), mount,
// umount2, pivot_root, and the calls it never allows a container
// (keyctl, bpf, perf_event_open, kexec, module loading, ...). Everything
// else is allowed, as RuntimeDefault does for the rest of the table:
// ptrace, process_vm_readv/writev and kcmp among them, which is why the
// executor's inner filter carries sbx's own allowlist in this mode.
func runtimeDefaultLike() *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	refused := []string{"unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
		"keyctl", "add_key", "request_key", "bpf", "perf_event_open", "kexec_load", "kexec_file_load",
		"init_module", "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at",
		"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
		"userfaultfd", "acct", "swapon", "swapoff", "reboot", "settimeofday", "clock_settime",
		"syslog", "quotactl", "lookup_dcookie", "nfsservctl", "vhangup", "iopl", "ioperm"}
	s := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64},
		Syscalls: []specs.LinuxSyscall{
			{Names: refused, Action: specs.ActErrno, ErrnoRet: &eperm},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
	for _, flag := range []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWUSER,
		unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWCGROUP} {
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{Names: []string{"clone"}, Action: specs.ActErrno, ErrnoRet: &eperm,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: flag, ValueTwo: flag, Op: specs.OpMaskedEqual}}})
	}
	return s
}

// podSandbox is sbx-executor --unprivileged run by runc with a config that
// mirrors the sandbox Pod's container: no user namespace (uid 0 is the
// host's), podCaps, no_new_privs, runtimeDefaultLike, a read-only root
// from a built template, a read-only cgroupfs, emptyDir-like mounts at
// /workspace, /tmp and /run/sbx, and a PID namespace of its own with the
// executor as PID 1. It is a test harness, not a runtime.
type podSandbox struct {
	id        string
	workspace string
	c         *client.Client
}

func startPodSandbox(t *testing.T) *podSandbox { return startPodSandboxIn(t, "runc") }

// startPodSandboxIn is startPodSandbox under the OCI runtime rt (runc,
// or runsc: a Pod whose RuntimeClass is gVisor).
func startPodSandboxIn(t *testing.T, rt string) *podSandbox {
	t.Helper()
	if _, err := exec.LookPath(rt); err != nil {
		t.Skipf("%s is not installed", rt)
	}
	env := testenv.New(t)
	rootfs := env.Rootfs(t, "python")
	dir := t.TempDir()
	p := &podSandbox{id: fmt.Sprintf("sbx-podmode-%d", time.Now().UnixNano()), workspace: filepath.Join(dir, "workspace")}
	run := filepath.Join(dir, "run")
	bin := filepath.Join(dir, "bin")
	for _, d := range []string{p.workspace, run, bin} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// As the kubelet makes an emptyDir: root's, mode 0777.
	if err := os.Chmod(p.workspace, 0o777); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(env.Executor)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "sbx-executor"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	pids := int64(256)
	spec := &specs.Spec{
		Version:  "1.0.2",
		Hostname: "pod",
		Root:     &specs.Root{Path: rootfs, Readonly: true},
		Process: &specs.Process{
			Args: []string{"/opt/sbx/sbx-executor", "--unprivileged", "--socket", "/run/sbx/executor.sock",
				"--workspace", "/workspace", "--log-level", "debug"},
			Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "POD_SECRET=executor-only",
				// What the kubelet adds to every container.
				"KUBERNETES_SERVICE_HOST=10.0.0.1", "KUBERNETES_SERVICE_PORT=443", "KUBERNETES_PORT=tcp://10.0.0.1:443"},
			Cwd:             "/",
			User:            specs.User{UID: 0, GID: 0},
			Capabilities:    &specs.LinuxCapabilities{Bounding: podCaps, Effective: podCaps, Permitted: podCaps},
			NoNewPrivileges: true,
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 4096, Hard: 4096}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=64m"}},
			{Destination: "/workspace", Type: "bind", Source: p.workspace, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
			{Destination: "/run/sbx", Type: "bind", Source: run, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
			{Destination: "/opt/sbx", Type: "bind", Source: bin, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace},
			},
			Resources:         &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: &pids}},
			Seccomp:           runtimeDefaultLike(),
			RootfsPropagation: "private",
			MaskedPaths: []string{"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
				"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	cfg, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	// This harness talks to the executor over a socket: no network (runsc
	// here refuses its default one in the host's network namespace).
	var global []string
	if rt == "runsc" {
		global = []string{"--network=none", "--host-uds=all"}
	}
	cmd := exec.Command(rt, append(global, "run", "--bundle", dir, p.id)...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = exec.Command(rt, append(global, "kill", p.id, "KILL")...).Run()
		<-exited
		_ = exec.Command(rt, append(global, "delete", "--force", p.id)...).Run()
		if t.Failed() {
			t.Logf("executor log:\n%s", logs.String())
		}
	})
	sock := filepath.Join(run, "executor.sock")
	p.c = client.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(func() { p.c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.c.WaitReady(ctx); err != nil {
		select {
		case <-exited:
			t.Fatalf("the executor exited: %s", logs.String())
		default:
		}
		t.Fatalf("executor not ready: %v\n%s", err, logs.String())
	}
	return p
}

func (p *podSandbox) run(t *testing.T, req wire.RunRequest) *wire.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if req.Language == "" {
		req.Language = "python"
	}
	res, err := p.c.Run(ctx, req, nil)
	if err != nil {
		t.Fatalf("run %q: %v", req.Code, err)
	}
	return res
}

// ok runs Python code that must complete and returns its stdout.
func (p *podSandbox) ok(t *testing.T, code string) string {
	t.Helper()
	res := p.run(t, wire.RunRequest{Code: code})
	if res.Status != wire.StatusCompleted {
		t.Fatalf("run %q: %s exit %d, error %+v\nstdout %s\nstderr %s", code, res.Status, res.ExitCode, res.Error, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

func TestPodModeRuns(t *testing.T) {
	p := startPodSandbox(t)
	if got := p.ok(t, "print(6*7)"); got != "42\n" {
		t.Fatalf("stdout %q", got)
	}
	// The workspace (a Pod's emptyDir, root's and 0777 when the Pod
	// starts) is the user's, with its uploads directory the sandbox's
	// root's, before any file call: as the control plane makes one.
	if got := p.ok(t, "import os\nfor p in ('/workspace', '/workspace/uploads'):\n    st = os.lstat(p)\n    print(st.st_uid, oct(st.st_mode & 0o7777))"); got != "1000 0o711\n0 0o711\n" {
		t.Errorf("the workspace at start: %q", got)
	}
	// The executor sees what a run changed in the user's 0711 workspace
	// (artifacts, workspace_unchanged: a Pod's checkpoint is skipped on
	// its word), and what it did not.
	made := p.run(t, wire.RunRequest{Code: "import os\nos.makedirs('out', exist_ok=True)\nopen('out/code.txt', 'w').write('x')"})
	if made.WorkspaceUnchanged || strings.Join(made.Artifacts, ",") != "out/code.txt" {
		t.Errorf("a run that wrote out/code.txt: unchanged %v, artifacts %q", made.WorkspaceUnchanged, made.Artifacts)
	}
	if read := p.run(t, wire.RunRequest{Code: "print(open('out/code.txt').read())"}); !read.WorkspaceUnchanged || len(read.Artifacts) != 0 {
		t.Errorf("a run that only read: unchanged %v, artifacts %q", read.WorkspaceUnchanged, read.Artifacts)
	}
	res := p.run(t, wire.RunRequest{Language: "bash", Code: "id -u; id -g; id -G; echo hi >&2; exit 3"})
	if res.ExitCode != 3 || res.Stdout != "1000\n1000\n1000\n" || res.Stderr != "hi\n" {
		t.Fatalf("bash: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// A stateful context keeps its globals.
	r1 := p.run(t, wire.RunRequest{Code: "x = 41", ContextID: "c1"})
	r2 := p.run(t, wire.RunRequest{Code: "print(x + 1)", ContextID: "c1"})
	if r1.Status != wire.StatusCompleted || r2.Stdout != "42\n" {
		t.Fatalf("context: %+v / %+v", r1, r2)
	}
	// Output limits hold.
	res = p.run(t, wire.RunRequest{Code: "print('x' * 100000)", OutputLimitBytes: 1000})
	if !res.StdoutTruncated || len(res.Stdout) > 1200 {
		t.Fatalf("output limit: truncated %v, %d bytes", res.StdoutTruncated, len(res.Stdout))
	}
	// Stats read the read-only cgroupfs, or degrade; they never fail.
	// The workspace's disk is the last walk's: a run that wrote 2 MiB.
	p.ok(t, "import os\nopen('/workspace/two.bin', 'wb').write(os.urandom(2 << 20))")
	if st, err := p.c.Stats(context.Background()); err != nil || st.WorkspaceBytes < 2<<20 {
		t.Fatalf("stats: %+v, %v; want workspace_bytes of 2 MiB at least", st, err)
	}
}

func TestPodModeFiles(t *testing.T) {
	p := startPodSandbox(t)
	ws := client.NewWorkspace(p.c, 1<<20)
	ctx := context.Background()
	if _, err := ws.Save(ctx, "up/data.txt", strings.NewReader("payload"), 1<<20); err != nil {
		t.Fatalf("upload: %v", err)
	}
	if got := p.ok(t, "print(open('/workspace/up/data.txt').read()); open('/workspace/out.txt','w').write('made')"); got != "payload\n" {
		t.Fatalf("user code read %q", got)
	}
	f, err := ws.Open(ctx, "out.txt")
	if err != nil {
		t.Fatalf("download: %v", err)
	}
	b, err := io.ReadAll(f)
	f.Close()
	if err != nil || string(b) != "made" {
		t.Fatalf("download: %q %v", b, err)
	}
	// The uploaded file is the sandbox user's, so that code may change it.
	fi, err := os.Stat(filepath.Join(p.workspace, "up", "data.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 {
		t.Fatalf("uploaded file owned by %d", st.Uid)
	}
}

// TestPodModeTimeoutKillsDaemons: a run that leaves a setsid'd,
// double-forked daemon and then sleeps past its deadline; and one that
// leaves one and ends. Neither daemon outlives its run.
func TestPodModeTimeoutKillsDaemons(t *testing.T) {
	p := startPodSandbox(t)
	daemon := `import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        # A daemon lets go of the run's pipes (or a context's run would
        # wait for their end), as one that execs does.
        null = os.open('/dev/null', os.O_RDWR)
        for fd in (0, 1, 2): os.dup2(null, fd)
        os.closerange(3, 4096)
        while True: time.sleep(1)
    os._exit(0)
os.close(w)
print(os.read(r, 32).decode(), flush=True)
`
	alive := func(pid string) string {
		return p.ok(t, fmt.Sprintf(`import os
try:
    st = open('/proc/%s/stat').read()
    print('zombie' if st[st.rindex(')')+2] == 'Z' else 'alive')
except FileNotFoundError:
    print('gone')`, pid))
	}
	res := p.run(t, wire.RunRequest{Code: daemon + "time.sleep(60)\n", TimeoutMs: 1000})
	if res.Status != wire.StatusTimeout {
		t.Fatalf("status %s, want timeout (%+v)", res.Status, res.Error)
	}
	pid := strings.TrimSpace(res.Stdout)
	if pid == "" {
		t.Fatal("the daemon did not say its pid")
	}
	if got := strings.TrimSpace(alive(pid)); got == "alive" {
		t.Fatalf("the daemon %s of a timed-out run is %s", pid, got)
	}
	res = p.run(t, wire.RunRequest{Code: daemon})
	pid = strings.TrimSpace(res.Stdout)
	if res.Status != wire.StatusCompleted || pid == "" {
		t.Fatalf("run: %s %q %+v", res.Status, res.Stdout, res.Error)
	}
	if got := strings.TrimSpace(alive(pid)); got == "alive" {
		t.Fatalf("the daemon %s of an ended run is %s", pid, got)
	}
	// A context's daemon lives as long as the context.
	res = p.run(t, wire.RunRequest{Code: daemon, ContextID: "d"})
	pid = strings.TrimSpace(res.Stdout)
	if got := strings.TrimSpace(alive(pid)); got != "alive" {
		t.Fatalf("the daemon %s of a live context is %s", pid, got)
	}
	// ... and no longer: the sweep after the context's end is reported
	// runs on its own, so look until it has.
	if err := p.c.DeleteContext(context.Background(), "", "d"); err != nil {
		t.Fatal(err)
	}
	got := ""
	for range 200 {
		if got = strings.TrimSpace(alive(pid)); got != "alive" {
			return
		}
	}
	t.Fatalf("the daemon %s of a deleted context is %s", pid, got)
}

// TestPodModeHostile: what user code must not be able to do to the
// executor, the zygote or the sandbox.
func TestPodModeHostile(t *testing.T) {
	p := startPodSandbox(t)
	checks := map[string]string{
		// Every capability set empty; the bounding set too but for
		// CAP_SETGID, which the zygote keeps for the conversations' groups
		// (podviews.go) and which nothing can gain again (no_new_privs);
		// a seccomp filter; no groups.
		"caps": `import re
s = open('/proc/self/status').read()
f = dict(l.split(':\t', 1) for l in s.splitlines() if ':\t' in l)
for k in ('CapInh', 'CapPrm', 'CapEff', 'CapAmb'):
    assert int(f[k], 16) == 0, (k, f[k])
assert int(f['CapBnd'], 16) & ~(1 << 6) == 0, f['CapBnd']
assert f['NoNewPrivs'].strip() == '1', f['NoNewPrivs']
assert f['Seccomp'].strip() == '2', f['Seccomp']
assert f['Uid'].split() == ['1000'] * 4 and f['Gid'].split() == ['1000'] * 4, (f['Uid'], f['Gid'])
assert f['Groups'].strip() == '', f['Groups']
print('ok')`,
		// The executor: not signalable, not traceable, its environment and
		// the control directory unreadable.
		"kill": `import os
try:
    os.kill(1, 9); print('killed')
except PermissionError: print('ok')`,
		"environ": `try:
    open('/proc/1/environ').read(); print('read')
except PermissionError: print('ok')`,
		"control": `import os
for p in ('/run/sbx', '/run/sbx/executor.sock', '/run/sbx/zygote.py'):
    try:
        os.listdir(p) if p == '/run/sbx' else open(p).read()
        print('read', p); break
    except (PermissionError, OSError) as e:
        pass
else: print('ok')`,
		"ptrace": `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
out = []
import subprocess
child = subprocess.Popen(['sleep', '30'])
for pid in (1, os.getppid(), child.pid):
    if libc.ptrace(16, pid, None, None) == 0: out.append('attached %d' % pid)
child.kill()
print(' '.join(out) or 'ok')`,
		"zygote-mem": `import os
# the zygote is our parent's parent... or our parent: find a python
# process that is not us and is not the executor, and read its memory.
me = os.getpid()
for d in os.listdir('/proc'):
    if not d.isdigit() or int(d) in (1, me): continue
    try:
        with open('/proc/%s/mem' % d, 'rb') as f: pass
        print('opened mem of', d, open('/proc/%s/cmdline' % d).read()); break
    except OSError: pass
else: print('ok')`,
		"chown": `import os
open('/workspace/f', 'w').close()
try:
    os.chown('/workspace/f', 0, 0); print('chowned')
except PermissionError: print('ok')`,
		// A conversation's group, or any other: not for user code.
		"setgroups": `import os
out = []
for f in (lambda: os.setgroups([40000]), lambda: os.setgid(0), lambda: os.setresgid(40000, 40000, 40000)):
    try:
        f(); out.append('changed')
    except PermissionError: pass
print(' '.join(out) or 'ok')`,
		"setuid": `import os
try:
    os.setuid(0); print('root')
except PermissionError: print('ok')`,
		"unshare": `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print('unshared' if libc.unshare(0x10000000) == 0 else 'ok')`,
		"clone-parent": `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# clone(CLONE_PARENT|SIGCHLD, 0, ...): a sibling would be the zygote's child
r = libc.syscall(56, 0x00008000 | 17, 0, 0, 0, 0)
if r == 0: os._exit(0)
print('cloned' if r > 0 else 'ok')`,
		// Where the cluster's API server is: the kubelet's variables do
		// not reach user code.
		"kubernetes-env": `import os
print(' '.join(k for k in os.environ if k.startswith('KUBERNETES_')) or 'ok')`,
		"rootfs": `try:
    open('/usr/bin/sbx-planted', 'w'); print('wrote')
except OSError: print('ok')`,
	}
	for name, code := range checks {
		t.Run(name, func(t *testing.T) {
			if got := strings.TrimSpace(p.ok(t, code)); got != "ok" {
				t.Fatalf("%s: %s", name, got)
			}
		})
	}
	// The executor survived all of it.
	if got := p.ok(t, "print('still')"); got != "still\n" {
		t.Fatalf("after the attacks: %q", got)
	}
}

// TestPodModeRunsc: the unprivileged mode under gVisor (a Pod of a gVisor
// RuntimeClass), whose /proc/self/status has no ambient set.
func TestPodModeRunsc(t *testing.T) {
	p := startPodSandboxIn(t, "runsc")
	if got := p.ok(t, "print(6*7)"); got != "42\n" {
		t.Fatalf("stdout %q", got)
	}
	res := p.run(t, wire.RunRequest{Language: "bash", Code: "id -u; id -G"})
	if res.Status != wire.StatusCompleted || res.Stdout != "1000\n1000\n" {
		t.Fatalf("bash: %s %+v %q %q", res.Status, res.Error, res.Stdout, res.Stderr)
	}
	// No ambient capabilities, so no CAP_SETGID for the zygote to keep:
	// a run of a conversation fails and says why, rather than run
	// without its view.
	res = p.run(t, wire.RunRequest{Code: "print(1)", ConversationID: "c1"})
	if res.Status == wire.StatusCompleted || res.Error == nil || !strings.Contains(res.Error.Message, "ambient") {
		t.Fatalf("a run of a conversation under gVisor: %s %+v", res.Status, res.Error)
	}
}
