// Package runtimetest is the conformance suite every runtime.Runtime passes:
// lifecycle, recovery and the isolation (escape and abuse) checks of
// R-70..R-75 (docs/REQUIREMENTS.md), all against real sandboxes.
package runtimetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// Harness is what the suite needs from a driver's test.
type Harness struct {
	// Runtime is the driver under test.
	Runtime runtime.Runtime
	// Reopen returns a second instance of the driver over the same state,
	// as a restarted server would make. Nil skips the recovery test.
	Reopen func(t *testing.T) runtime.Runtime
	// Rootfs is a built `python` template.
	Rootfs string
	// WorkspaceRoot is a host directory to make workspaces in.
	WorkspaceRoot string
	// CgroupDirs, when set, returns the host cgroup directories a sandbox
	// may have, so the suite can check Destroy removed them.
	CgroupDirs func(id string) []string
	// BundleDir, when set, returns the sandbox's host state directory.
	BundleDir func(id string) string
	// ExecRoot runs argv inside sandbox id as the sandbox's root, with the
	// capabilities the runtime gives the executor (runc exec), and returns
	// its combined output. The suite uses it to check what code that gained
	// the sandbox's root could do to what sandboxes share. Required.
	ExecRoot func(ctx context.Context, id string, argv ...string) ([]byte, error)

	// Capability switches, for a runtime whose sandboxes cannot show a
	// property the way Linux shows it. Each names the difference and says
	// how the suite checks the same property instead; runc sets none, and
	// none of them skips a check.

	// ProcessesOffHost: the sandbox's processes are not host processes
	// (gVisor runs them in its own kernel, the sentry; the host sees only
	// the sentry, its systrap stubs and the gofer). HostUID then checks
	// that, while user code runs, every host process in the sandbox's
	// cgroups runs as an unprivileged uid. Needs CgroupDirs.
	ProcessesOffHost bool
	// NoAmbientCaps: the kernel has no ambient capability set and its
	// /proc/PID/status has neither a CapAmb nor a NoNewPrivs line (gVisor).
	// Identity then takes the missing CapAmb as the empty set it is and
	// reads no_new_privs with prctl(PR_GET_NO_NEW_PRIVS).
	NoAmbientCaps bool
	// NoSysfsNet: /sys has no class/net (gVisor's sysfs). HostNetwork then
	// lists the network interfaces with if_nameindex(3) instead.
	NoSysfsNet bool
	// SandboxWideOOM: the memory limit holds the sandbox as a whole, its
	// kernel included, so running out kills the whole sandbox rather than
	// the one execution (gVisor: the sentry shares the host memory cgroup
	// with the code it runs, and the host OOM killer cannot reach a process
	// inside it; google/gvisor#2533, #2534). MemoryBomb then checks that
	// the allocation did not complete, that the sandbox is reported stopped
	// with the OOM kill in its stats, and that the bystander is unharmed.
	SandboxWideOOM bool
	// EmulatedMounts: mount(2) in the sandbox is served by the runtime's
	// own kernel (gVisor's sentry), which may report a remount of the root
	// as done without it reaching the host's read-only mount. SandboxRoot
	// then judges by what matters: no write lands in the root, and the
	// template on the host is unchanged.
	EmulatedMounts bool
}

var seq atomic.Int64

// Sandbox is one sandbox made for a test, destroyed at its end.
type Sandbox struct {
	ID        string
	Workspace string
	Client    *execclient.Client
	rt        runtime.Runtime
}

// NewSandbox creates a sandbox with the given resources.
func (h *Harness) NewSandbox(t testing.TB, res runtime.Resources) *Sandbox {
	t.Helper()
	return h.newSandbox(t, runtime.Spec{Resources: res})
}

// newSandbox creates a sandbox from spec, filling in its id, rootfs,
// workspace and labels.
func (h *Harness) newSandbox(t testing.TB, spec runtime.Spec) *Sandbox {
	t.Helper()
	id := fmt.Sprintf("rtt-%d-%d", os.Getpid(), seq.Add(1))
	ws, err := os.MkdirTemp(h.WorkspaceRoot, "ws-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ws) })
	ctx := context.Background()
	spec.ID, spec.Rootfs, spec.Workspace = id, h.Rootfs, ws
	spec.Labels = map[string]string{"test": t.Name()}
	if _, err := h.Runtime.Create(ctx, spec); err != nil {
		t.Fatalf("create: %v", err)
	}
	rt := h.Runtime
	s := &Sandbox{ID: id, Workspace: ws, rt: rt}
	s.Client = execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
	t.Cleanup(func() {
		s.Client.Close()
		if err := rt.Destroy(context.Background(), id); err != nil {
			t.Errorf("destroy %s: %v", id, err)
		}
	})
	return s
}

// Run executes code and fails the test if the executor cannot be reached.
func (s *Sandbox) Run(t testing.TB, lang, code string, timeout time.Duration) *wire.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	res, err := s.Client.Run(ctx, wire.RunRequest{
		ID: fmt.Sprintf("e%d", seq.Add(1)), Language: lang, Code: code,
		TimeoutMs: timeout.Milliseconds(),
	}, nil)
	if err != nil {
		t.Fatalf("run %q: %v", code, err)
	}
	return res
}

// MustRun executes code and fails the test unless it completed.
func (s *Sandbox) MustRun(t testing.TB, lang, code string) *wire.Result {
	t.Helper()
	res := s.Run(t, lang, code, 30*time.Second)
	if res.Status != wire.StatusCompleted {
		t.Fatalf("run %q: status %s, error %+v, stdout %q, stderr %q", code, res.Status, res.Error, res.Stdout, res.Stderr)
	}
	return res
}

// Run runs the whole suite.
func Run(t *testing.T, h Harness) {
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, &h) })
	t.Run("Errors", func(t *testing.T) { testErrors(t, &h) })
	t.Run("Recover", func(t *testing.T) { testRecover(t, &h) })
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, &h) })
	t.Run("SandboxRoot", func(t *testing.T) { testSandboxRoot(t, &h) })
}

func testLifecycle(t *testing.T, h *Harness) {
	ctx := context.Background()
	rt := h.Runtime
	s := h.NewSandbox(t, runtime.Resources{})

	info, err := rt.Inspect(ctx, s.ID)
	if err != nil || info.State != runtime.StateRunning {
		t.Fatalf("inspect after create: %+v, %v", info, err)
	}
	if info.Labels["test"] != t.Name() {
		t.Errorf("labels not kept: %v", info.Labels)
	}
	res := s.MustRun(t, "python", "print('hello')\nreturn 6*7")
	if res.Stdout != "hello\n" || string(res.ReturnValue) != "42" {
		t.Errorf("run: stdout %q return %s", res.Stdout, res.ReturnValue)
	}
	res = s.MustRun(t, "bash", "echo hi from bash")
	if res.Stdout != "hi from bash\n" {
		t.Errorf("bash: %q", res.Stdout)
	}

	// Files written by the sandbox land in the host workspace.
	s.MustRun(t, "python", "open('/workspace/out.txt','w').write('data')")
	if b, err := os.ReadFile(filepath.Join(s.Workspace, "out.txt")); err != nil || string(b) != "data" {
		t.Errorf("workspace file: %q, %v", b, err)
	}

	st, err := rt.Stats(ctx, s.ID)
	if err != nil || st.MemoryBytes == 0 || st.PIDs == 0 || st.CPUNanos == 0 {
		t.Errorf("stats: %+v, %v", st, err)
	} else if want := info.Resources; st.Limits != want || want.MemoryMB == 0 || want.CPU == 0 || want.PIDs == 0 {
		t.Errorf("stats: limits %+v, want what the sandbox was given (defaults filled in): %+v", st.Limits, want)
	}

	if err := rt.Pause(ctx, s.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if info, _ := rt.Inspect(ctx, s.ID); info.State != runtime.StatePaused {
		t.Errorf("after pause: %s", info.State)
	}
	if err := rt.Pause(ctx, s.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("pause twice: %v, want ErrFailedPrecondition", err)
	}
	// A frozen executor does not answer.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = s.Client.Health(short)
	cancel()
	if err == nil {
		t.Errorf("a paused sandbox answered")
	}
	if err := rt.Resume(ctx, s.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if err := rt.Resume(ctx, s.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("resume twice: %v, want ErrFailedPrecondition", err)
	}
	s.MustRun(t, "python", "print(1)")

	list, err := rt.List(ctx)
	if err != nil || !contains(list, s.ID) {
		t.Errorf("list does not have %s: %v", s.ID, err)
	}

	if err := rt.Stop(ctx, s.ID); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if info, err := rt.Inspect(ctx, s.ID); err != nil || info.State != runtime.StateStopped {
		t.Errorf("after stop: %+v, %v", info, err)
	}
	if err := rt.Destroy(ctx, s.ID); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if _, err := rt.Inspect(ctx, s.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("inspect after destroy: %v, want ErrNotFound", err)
	}
	if err := rt.Destroy(ctx, s.ID); err != nil {
		t.Errorf("destroy is not idempotent: %v", err)
	}
	checkGone(t, h, s.ID)
	if _, err := os.Stat(filepath.Join(s.Workspace, "out.txt")); err != nil {
		t.Errorf("destroy removed the workspace: %v", err)
	}
}

// checkGone verifies a destroyed sandbox left nothing on the host.
func checkGone(t *testing.T, h *Harness, id string) {
	t.Helper()
	if h.CgroupDirs != nil {
		for _, d := range h.CgroupDirs(id) {
			if _, err := os.Stat(d); err == nil {
				t.Errorf("cgroup %s left behind", d)
			}
		}
	}
	if h.BundleDir != nil {
		if _, err := os.Stat(h.BundleDir(id)); err == nil {
			t.Errorf("bundle %s left behind", h.BundleDir(id))
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), id) {
		t.Errorf("a mount of %s is left on the host", id)
	}
}

func testErrors(t *testing.T, h *Harness) {
	ctx := context.Background()
	rt := h.Runtime
	ws := t.TempDir()
	for _, tc := range []struct {
		name string
		spec runtime.Spec
		want error
	}{
		{"bad id", runtime.Spec{ID: "../x", Rootfs: h.Rootfs, Workspace: ws}, errdefs.ErrInvalidArgument},
		{"empty id", runtime.Spec{ID: "", Rootfs: h.Rootfs, Workspace: ws}, errdefs.ErrInvalidArgument},
		{"no rootfs", runtime.Spec{ID: "rtt-norootfs", Rootfs: "/nonexistent", Workspace: ws}, errdefs.ErrInvalidArgument},
		{"no workspace", runtime.Spec{ID: "rtt-nows", Rootfs: h.Rootfs, Workspace: "/nonexistent"}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := rt.Create(ctx, tc.spec); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("duplicate", func(t *testing.T) {
		s := h.NewSandbox(t, runtime.Resources{})
		_, err := rt.Create(ctx, runtime.Spec{ID: s.ID, Rootfs: h.Rootfs, Workspace: s.Workspace})
		if !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Errorf("got %v, want ErrAlreadyExists", err)
		}
		s.MustRun(t, "python", "print(1)") // the first one is unharmed
	})
	t.Run("unknown", func(t *testing.T) {
		for name, err := range map[string]error{
			"inspect": func() error { _, err := rt.Inspect(ctx, "rtt-unknown"); return err }(),
			"pause":   rt.Pause(ctx, "rtt-unknown"),
			"stats":   func() error { _, err := rt.Stats(ctx, "rtt-unknown"); return err }(),
			"dial":    func() error { _, err := rt.Dial(ctx, "rtt-unknown"); return err }(),
		} {
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("%s: %v, want ErrNotFound", name, err)
			}
		}
		if err := rt.Destroy(ctx, "rtt-unknown"); err != nil {
			t.Errorf("destroy unknown: %v", err)
		}
	})
}

// testRecover checks that a restarted server finds the sandboxes the old
// one left and can use or destroy them.
func testRecover(t *testing.T, h *Harness) {
	if h.Reopen == nil {
		t.Skip("the harness has no Reopen")
	}
	ctx := context.Background()
	s := h.NewSandbox(t, runtime.Resources{})
	s.MustRun(t, "python", "open('/workspace/before','w').write('x')")
	rt2 := h.Reopen(t)
	list, err := rt2.List(ctx)
	if err != nil || !contains(list, s.ID) {
		t.Fatalf("reopened runtime does not list %s: %v", s.ID, err)
	}
	c := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt2.Dial(ctx, s.ID) })
	defer c.Close()
	res, err := c.Run(ctx, wire.RunRequest{ID: "after-reopen", Language: "python", Code: "return open('/workspace/before').read()", TimeoutMs: 10000}, nil)
	if err != nil || string(res.ReturnValue) != `"x"` {
		t.Fatalf("reattach: %+v, %v", res, err)
	}
	if err := rt2.Destroy(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	checkGone(t, h, s.ID)
}

func contains(list []runtime.Info, id string) bool {
	for _, i := range list {
		if i.ID == id {
			return true
		}
	}
	return false
}

// returnString decodes a result's JSON string return value.
func returnString(t testing.TB, res *wire.Result) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(res.ReturnValue, &s); err != nil {
		t.Fatalf("return value %s is not a string: %v (stderr %q, error %+v)", res.ReturnValue, err, res.Stderr, res.Error)
	}
	return s
}
