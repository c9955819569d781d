//go:build integration

package oci_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/egress"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// jobRuntime is a runc driver for jobs only, with its state under the
// test's root.
func jobRuntime(t *testing.T) (*oci.Runtime, string) {
	testenv.RequiresRoot(t)
	env := testenv.New(t)
	stateDir := filepath.Join(env.StateRoot, "jobs-test")
	rt, err := oci.New(oci.Config{StateDir: stateDir, CgroupParent: "sbx-test", JobsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	return rt, stateDir
}

// TestJobConfinement: a template build's commands run as root of a user
// namespace of their own, never as the host's root: no capability on the
// host, seccomp, no_new_privs, their own /proc and no network but the
// listener they are given; what they write lands as storage ids.
func TestJobConfinement(t *testing.T) {
	rt, stateDir := jobRuntime(t)
	rootfs := testenv.New(t).Rootfs(t, "python")
	out := t.TempDir()
	if err := os.Chown(out, 100000, 100000); err != nil {
		t.Fatal(err)
	}
	// A service on the host's loopback that the job must not reach.
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go func() {
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host service\n"))
			c.Close()
		}
	}()
	ns, err := egress.NewNetNS()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	go func() {
		for {
			c, err := ns.Listener.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("egress\n"))
			c.Close()
		}
	}()

	script := fmt.Sprintf(`
import os, socket
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
for k in ("CapEff", "CapBnd", "NoNewPrivs", "Seccomp"):
    print(k, st[k].strip())
print("uid_map", " ".join(open("/proc/self/uid_map").read().split()))
print("pid", os.getpid())
print("hostname", socket.gethostname())
def dial(port):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        return s.recv(64).decode().strip()
    except OSError as e:
        return "refused"
print("host", dial(%d))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for name, flag in (("userns", 0x10000000), ("netns", 0x40000000)):
    print(name, "made" if libc.unshare(flag) == 0 else os.strerror(ctypes.get_errno()).replace(" ", "_"))
print("egress", dial(%d))
# The classic double chroot: from a chroot inside the job, up and out.
os.makedirs("/workspace/jail", exist_ok=True)
real = os.open("/", os.O_RDONLY)
os.chroot("/workspace/jail")
os.fchdir(real)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
print("escaped", os.path.exists("/workspace/jail"), sorted(os.listdir("/"))[:3])
with open("/workspace/written", "w") as f:
    f.write("x")
os.chown("/workspace/written", 1000, 1000)
`, host.Addr().(*net.TCPAddr).Port, ns.Port)
	var stdout, stderr bytes.Buffer
	err = rt.RunJob(context.Background(), runtime.Job{
		Root: rootfs, ReadOnlyRoot: true,
		Binds:  []runtime.Bind{{Source: out, Dest: "/workspace", Storage: true}},
		Args:   []string{"/usr/bin/python3", "-I", "-c", script},
		Env:    []string{"PATH=/usr/bin:/bin"},
		Stdout: &stdout, Stderr: &stderr,
		NetNS: ns.Path(),
	})
	if err != nil {
		t.Fatalf("job: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		k, v, _ := strings.Cut(line, " ")
		got[k] = v
	}
	t.Logf("job saw: %v", got)
	if got["NoNewPrivs"] != "1" || got["Seccomp"] != "2" {
		t.Errorf("no_new_privs %q, seccomp %q: want 1 and 2", got["NoNewPrivs"], got["Seccomp"])
	}
	// Root of its own user namespace, which maps it to a host uid far from
	// 0 and from the storage ids.
	f := strings.Fields(got["uid_map"])
	if len(f) != 3 || f[0] != "0" {
		t.Fatalf("uid_map %q", got["uid_map"])
	}
	if base, _ := strconv.Atoi(f[1]); base < 1<<24 {
		t.Errorf("job root is host uid %d: want an id slot of its own (>= %d)", base, 1<<24)
	}
	if got["pid"] != "1" || got["hostname"] != "sbx-build" {
		t.Errorf("pid %q, hostname %q: want its own PID and UTS namespaces", got["pid"], got["hostname"])
	}
	for _, ns := range []string{"userns", "netns"} {
		if got[ns] != "Operation_not_permitted" {
			t.Errorf("unshare of a %s in a build job: %q, want EPERM", ns, got[ns])
		}
	}
	if got["host"] != "refused" {
		t.Errorf("the job reached a host loopback service: %q", got["host"])
	}
	if got["egress"] != "egress" {
		t.Errorf("the job did not reach its egress listener: %q", got["egress"])
	}
	if !strings.HasPrefix(got["escaped"], "True") {
		t.Errorf("after a double chroot the job sees %q: want its own root still", got["escaped"])
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(out, "written"), &st); err != nil || st.Uid != 101000 || st.Gid != 101000 {
		t.Errorf("a file the job made and gave to uid 1000 is %d:%d on disk (%v), want the storage ids 101000", st.Uid, st.Gid, err)
	}
	assertNoJobs(t, stateDir)
}

// TestJobEnds: a failing job says so, a cancelled one is killed with all
// its processes, and neither leaves anything behind.
func TestJobEnds(t *testing.T) {
	rt, stateDir := jobRuntime(t)
	rootfs := testenv.New(t).Rootfs(t, "python")
	job := func(args ...string) runtime.Job {
		return runtime.Job{Root: rootfs, ReadOnlyRoot: true, Args: args, Env: []string{"PATH=/usr/bin:/bin"}}
	}
	err := rt.RunJob(context.Background(), job("/bin/sh", "-c", "exit 3"))
	if err == nil || !strings.Contains(err.Error(), "status 3") {
		t.Errorf("exit 3: %v", err)
	}
	assertNoJobs(t, stateDir)

	// A job that leaves a process behind that ignores SIGTERM and holds
	// its output open.
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	j := job("/bin/sh", "-c", "trap '' TERM; (trap '' TERM; sleep 600) & echo started; sleep 600")
	j.Stdout = &out
	done := make(chan error, 1)
	go func() { done <- rt.RunJob(ctx, j) }()
	for !strings.Contains(out.String(), "started") {
		select {
		case err := <-done:
			t.Fatalf("the job ended before it was cancelled: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled job: %v", err)
	}
	assertNoJobs(t, stateDir)
}

// assertNoJobs checks that no job left a bundle, a mount or an id claim.
func assertNoJobs(t *testing.T, stateDir string) {
	t.Helper()
	if ents, _ := os.ReadDir(filepath.Join(stateDir, "jobs")); len(ents) > 0 {
		t.Errorf("job bundles left: %d", len(ents))
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), filepath.Join(stateDir, "jobs")+"/") {
		t.Errorf("job mounts left:\n%s", mounts)
	}
	claims, _ := os.ReadDir("/run/sbx-ids")
	for _, c := range claims {
		b, _ := os.ReadFile(filepath.Join("/run/sbx-ids", c.Name()))
		if strings.HasPrefix(string(b), filepath.Join(stateDir, "jobs")) {
			t.Errorf("id slot %s is still claimed by %s", c.Name(), b)
		}
	}
}
