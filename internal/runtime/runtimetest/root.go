package runtimetest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// testSandboxRoot checks what code that gained the sandbox's root (the
// executor's identity, with its capabilities, inside the sandbox's user
// namespace) can do to what sandboxes share. It is the second line: user
// code never gets there by design, but one bug in a privileged helper would
// put a tenant there, and from there no other sandbox may be reachable.
func testSandboxRoot(t *testing.T, h *Harness) {
	if h.ExecRoot == nil {
		t.Fatal("Harness.ExecRoot is nil: a runtime must let the suite run a command as the sandbox's root")
	}
	// The tenant's variables: a preload library that would run in any
	// privileged process that inherits them, and a marker.
	const marker = "SBX_TENANT_MARKER"
	s := h.newSandbox(t, runtime.Spec{
		Resources: runtime.Resources{MemoryMB: 256, PIDs: 128, TmpMB: 16},
		Env:       map[string]string{"LD_PRELOAD": "/workspace/evil.so", marker: "tenant-chose-this"},
	})

	t.Run("TenantEnvOnlyForUserCode", func(t *testing.T) {
		// User code gets the variables ...
		out := returnString(t, s.MustRun(t, "python", `import os
return os.environ.get('`+marker+`', 'missing')`))
		if out != "tenant-chose-this" {
			t.Errorf("user code sees %s=%q, want the spec's value", marker, out)
		}
		// ... and no process of the sandbox's root (the executor, the
		// zygote, idle warm workers) has them in its environment.
		out = execRoot(t, h, s.ID, "python3", "-c", `
import os
bad = []
for p in os.listdir('/proc'):
    if not p.isdigit():
        continue
    try:
        uid = [l.split()[1] for l in open('/proc/%s/status' % p) if l.startswith('Uid:')][0]
        env = open('/proc/%s/environ' % p, 'rb').read()
    except OSError:
        continue
    if uid == '0' and (b'`+marker+`' in env or b'LD_PRELOAD' in env):
        bad.append(p + ':' + open('/proc/%s/cmdline' % p, 'rb').read().replace(b'\0', b' ').decode(errors='replace'))
print(' | '.join(bad) or 'none')`)
		if out != "none" {
			t.Errorf("privileged processes inherited the tenant's variables: %s", out)
		}
	})

	t.Run("HelperCapabilities", func(t *testing.T) {
		// Only sbx's own binary runs as the sandbox's root: the executor
		// and the shim that starts the zygote (internal/executor/shim.go).
		// Neither acts with what changes files it does not own, CAP_CHOWN
		// (0), CAP_DAC_OVERRIDE (1) or CAP_FOWNER (3): the shim holds none
		// of them, and the executor holds them permitted only, for the
		// thread of a file call (internal/executor/filecaps.go). The
		// executor's effective set is KILL and DAC_READ_SEARCH. The zygote is
		// the template's Python, which the tenant may have written: it runs
		// as uid 1000, and any capability it has is over a user namespace
		// that maps uid 1000 alone (uid_map "1000 1000 1"), never over the
		// sandbox's, but for h.ZygoteCaps, held permitted only.
		caps := h.ExecutorCaps
		if caps == 0 {
			caps = 1<<2 | 1<<5 // DAC_READ_SEARCH, KILL
		}
		out := execRoot(t, h, s.ID, "python3", "-c", fmt.Sprintf(`
import os
bad, seen = [], set()
for p in os.listdir('/proc'):
    if not p.isdigit() or int(p) == os.getpid():
        continue
    try:
        st = dict(l.split(':', 1) for l in open('/proc/%%s/status' %% p) if ':' in l)
        argv = open('/proc/%%s/cmdline' %% p, 'rb').read().decode(errors='replace').split('\0')
        uid_map = open('/proc/%%s/uid_map' %% p).read().split()
    except OSError:
        continue
    uid = st['Uid'].split()[0]
    eff, prm = int(st['CapEff'].strip(), 16), int(st['CapPrm'].strip(), 16)
    sbx = argv[0].endswith('sbx-executor')
    mode = argv[1] if sbx and len(argv) > 1 and argv[1].startswith('sbx-') else ''
    zygote = not sbx and 'zygote.py' in ' '.join(argv)
    name = 'zygote' if zygote else (mode or ('executor' if sbx else ' '.join(argv)[:60]))
    seen.add(name)
    if uid == '0':
        if not sbx:
            bad.append('%%s runs as root' %% name)
        for cap in (0, 1, 3):
            if (eff if name == 'executor' else eff | prm) & (1 << cap):
                bad.append('%%s has capability %%d' %% (name, cap))
        if name == 'executor' and eff != %d:
            bad.append('executor CapEff is %%x' %% eff)
    elif zygote and eff == 0 and prm == %d:
        pass
    elif (eff | prm) and uid_map != ['1000', '1000', '1']:
        bad.append('%%s (uid %%s) has capabilities %%x in a namespace mapping %%s' %% (name, uid, eff | prm, uid_map))
    if zygote and uid != '1000':
        bad.append('the zygote runs as uid %%s' %% uid)
for want in ('executor', 'sbx-zygote-shim', 'zygote'):
    if want not in seen:
        bad.append('no %%s among %%s' %% (want, sorted(seen)))
print(' | '.join(bad) or 'none')`, caps, h.ZygoteCaps))
		if out != "none" {
			t.Errorf("privileged helpers hold capabilities they do not need: %s", out)
		}
	})

	t.Run("NoRemount", func(t *testing.T) {
		probe := fmt.Sprintf("sbx-escape-probe-%d", time.Now().UnixNano())
		out := execRoot(t, h, s.ID, "python3", "-c", `
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384
res = {}
def rc(name, r):
    res[name] = 'ok' if r >= 0 else os.strerror(ctypes.get_errno())
    return r
# Remount the root read-write: with and without MS_BIND.
rc('remount-bind /', libc.mount(None, b'/', None, MS_REMOUNT | MS_BIND, None))
rc('remount /', libc.mount(None, b'/', None, MS_REMOUNT, None))
rc('remount-bind /usr', libc.mount(None, b'/usr', None, MS_REMOUNT | MS_BIND, None))
# Bind the root elsewhere, then remount that read-write.
os.makedirs('/tmp/b', exist_ok=True)
libc.mount(b'/', b'/tmp/b', None, MS_BIND | MS_REC, None)
rc('remount-bind copy', libc.mount(None, b'/tmp/b', None, MS_REMOUNT | MS_BIND, None))
# open_tree(OPEN_TREE_CLONE) of the root, then mount_setattr clearing
# MOUNT_ATTR_RDONLY (struct mount_attr: set, clr, propagation, userns_fd).
fd = rc('open_tree /', libc.syscall(428, -100, b'/', 1 | 0o2000000, 0))
attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)
if fd >= 0:
    rc('mount_setattr clone', libc.syscall(442, fd, b'', 0x1000, ctypes.byref(attr), 32))
rc('mount_setattr /', libc.syscall(442, -100, b'/', 0, ctypes.byref(attr), 32))
for p in ['/etc/`+probe+`', '/usr/`+probe+`', '/tmp/b/etc/`+probe+`', '/opt/sbx/`+probe+`']:
    try:
        with open(p, 'w') as f:
            f.write('x')
        res['write ' + p] = 'ok'
    except OSError as e:
        res['write ' + p] = e.strerror
print(json.dumps(res))`)
		var res map[string]string
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("probe output %q: %v", out, err)
		}
		for what, r := range res {
			if r != "ok" || what == "open_tree /" { // a clone is harmless while it stays read-only
				continue
			}
			if h.EmulatedMounts && !strings.HasPrefix(what, "write ") {
				t.Logf("as the sandbox's root: %s reported success (the runtime's own kernel)", what)
				continue
			}
			t.Errorf("as the sandbox's root: %s succeeded (all: %v)", what, res)
		}
		// Whatever happened inside, the template on the host is untouched
		// (when the suite can see it).
		rootfs := ""
		if h.onHost() {
			rootfs = h.Rootfs
		}
		for _, dir := range []string{"etc", "usr"} {
			if rootfs == "" {
				break
			}
			if _, err := os.Lstat(filepath.Join(rootfs, dir, probe)); err == nil {
				t.Errorf("the template rootfs has %s/%s: a sandbox wrote to what every sandbox shares", dir, probe)
			}
		}
	})

	t.Run("DistinctHostIDs", func(t *testing.T) { testDistinctHostIDs(t, h, s) })
	t.Run("ControlDirBounded", func(t *testing.T) { testControlDirBounded(t, h, s) })

	// Last: it leaves s without a working socket.
	t.Run("SocketSwap", func(t *testing.T) { testSocketSwap(t, h, s) })
}

// testSocketSwap replaces the sandbox's executor socket, from inside, by a
// symlink to another sandbox's socket on the host: the host must not
// follow it (the attacker would drive the other sandbox's executor).
func testSocketSwap(t *testing.T, h *Harness, s *Sandbox) {
	h.host(t)
	if h.BundleDir == nil {
		t.Fatal("Harness.BundleDir is nil: the check needs the other sandbox's host socket path")
	}
	other := h.NewSandbox(t, runtime.Resources{MemoryMB: 128, PIDs: 64, TmpMB: 8})
	other.MustRun(t, "python", "open('/workspace/victim.txt','w').write('victim')")
	target := filepath.Join(h.BundleDir(other.ID), "ctl", "executor.sock")
	execRoot(t, h, s.ID, "sh", "-c", "mv /run/sbx/executor.sock /run/sbx/moved.sock && ln -s "+target+" /run/sbx/executor.sock && echo swapped")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := h.Runtime.Dial(ctx, s.ID)
	if err == nil {
		c.Close()
		// Show what the connection reached.
		res := s.Run(t, "python", "import os\nreturn sorted(os.listdir('/workspace'))", 10*time.Second)
		t.Fatalf("dialed sandbox %s through a symlink planted in its control directory; a run there saw %s", s.ID, res.ReturnValue)
	}
	t.Logf("dial refused: %v", err)
	// The other sandbox is unharmed.
	other.MustRun(t, "python", "return 1")
}

// testControlDirBounded fills the control directory (/run/sbx) as the
// sandbox's root: it is a tmpfs of its own, so the writes stop at its size
// and the host's /run, RAM that every sandbox shares, does not grow; the
// sandbox serves on once the file is gone.
func testControlDirBounded(t *testing.T, h *Harness, s *Sandbox) {
	h.host(t)
	if h.BundleDir == nil {
		t.Fatal("Harness.BundleDir is nil: the check reads the control directory from the host")
	}
	ctl := filepath.Join(h.BundleDir(s.ID), "ctl")
	out := execRoot(t, h, s.ID, "sh", "-c", "dd if=/dev/zero of=/run/sbx/fill bs=1M count=64 2>&1 | tail -1; sync")
	fi, err := os.Stat(filepath.Join(ctl, "fill"))
	if err != nil {
		t.Fatalf("the fill is not in the control directory on the host: %v (dd: %s)", err, out)
	}
	t.Logf("dd: %s; the host holds %d bytes of it", out, fi.Size())
	if fi.Size() > 16<<20 {
		t.Errorf("the sandbox's root put %d bytes into its control directory on the host's /run", fi.Size())
	}
	var st unix.Statfs_t
	if err := unix.Statfs(ctl, &st); err != nil || st.Type != unix.TMPFS_MAGIC || uint64(st.Blocks)*uint64(st.Bsize) > 16<<20 {
		t.Errorf("the control directory is not a small tmpfs of its own: %+v %v", st, err)
	}
	execRoot(t, h, s.ID, "rm", "-f", "/run/sbx/fill")
	s.MustRun(t, "python", "return 1")
}

// testDistinctHostIDs checks that two sandboxes share no host uid: seen
// from the host, the processes in one sandbox's cgroups and the other's
// run as different users, so one that got out of its sandbox is a stranger
// to the other's processes and files.
func testDistinctHostIDs(t *testing.T, h *Harness, s *Sandbox) {
	h.host(t)
	if h.CgroupDirs == nil {
		t.Fatal("Harness.CgroupDirs is nil: the check reads the sandboxes' processes from their cgroups")
	}
	other := h.NewSandbox(t, runtime.Resources{MemoryMB: 128, PIDs: 64, TmpMB: 8})
	other.MustRun(t, "python", "return 1")
	s.MustRun(t, "python", "return 1")
	uids := func(sb *Sandbox) map[string]bool {
		out := map[string]bool{}
		for _, d := range h.CgroupDirs(sb.ID) {
			b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			for _, p := range strings.Fields(string(b)) {
				if u := uidOf(p); u != "" {
					out[u] = true
				}
			}
		}
		if len(out) == 0 {
			t.Fatalf("no host process in sandbox %s's cgroups", sb.ID)
		}
		return out
	}
	a, b := uids(s), uids(other)
	for u := range a {
		if b[u] {
			t.Errorf("sandboxes %s and %s both run processes as host uid %s (%v, %v)", s.ID, other.ID, u, a, b)
		}
	}
	t.Logf("host uids: %v and %v", a, b)
}

// execRoot runs argv in sandbox id as its root and returns its trimmed
// output, failing the test if it cannot run.
func execRoot(t *testing.T, h *Harness, id string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := h.ExecRoot(ctx, id, argv...)
	if err != nil {
		t.Fatalf("exec as root %q: %v: %s", argv, err, out)
	}
	return strings.TrimSpace(string(out))
}
