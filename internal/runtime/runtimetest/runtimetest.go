// Package runtimetest is the conformance suite every runtime.Runtime passes:
// lifecycle, recovery and the isolation (escape and abuse) checks of
// R-70..R-75 (docs/REQUIREMENTS.md), all against real sandboxes. The
// contract part runs on any runtime, one with no host in common with the
// caller included; the parts of the optional capabilities (pause, stats,
// the host's view) run when the runtime declares them (see Harness).
// Fake, a map of states, stands in for a runtime in the layers' unit
// tests.
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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// Harness is what the suite needs from a driver's test. The suite has
// two parts. The contract is what every runtime passes, host or no host:
// create, dial, run through the executor, stop, destroy, inspect, list,
// bad input, recovery, and isolation as seen from inside the sandbox.
// The capability parts run when the runtime declares the capability
// (runtime.CapabilitiesOf) and are skipped, saying so, when it does not:
// pause and resume (Pauser), stats (StatsReader), and the probes that
// look at the sandbox from the host (HostProcesses: host pids, cgroups,
// mounts, the bundle, the volume's directory).
type Harness struct {
	// Runtime is the driver under test.
	Runtime runtime.Runtime
	// Reopen returns a second instance of the driver over the same state,
	// as a restarted server would make. Nil skips the recovery test.
	Reopen func(t *testing.T) runtime.Runtime
	// Image is a built `python` template, named as the runtime takes it
	// (runtime.Spec.Image).
	Image string
	// NewVolume makes a new, empty volume the runtime can mount and
	// returns its name (runtime.Spec.Volume); it goes at the test's end.
	NewVolume func(t testing.TB) string
	// MissingImage and MissingVolume, when set, are well-formed names the
	// runtime does not have: Create must answer ErrNotFound.
	MissingImage, MissingVolume string
	// ExecRoot runs argv inside sandbox id as the sandbox's root, with the
	// capabilities the runtime gives the executor (runc exec), and returns
	// its combined output. The suite uses it to check what code that gained
	// the sandbox's root could do to what sandboxes share. Required.
	ExecRoot func(ctx context.Context, id string, argv ...string) ([]byte, error)

	// For a runtime with runtime.HostProcesses, the host's view, which the
	// host probes need (each fails the test if missing then).

	// Rootfs is Image's root filesystem on the host.
	Rootfs string
	// VolumeDir returns a volume's directory on the host.
	VolumeDir func(name string) string
	// CgroupDirs returns the host cgroup directories a sandbox may have,
	// so the suite can check Destroy removed them.
	CgroupDirs func(id string) []string
	// BundleDir returns the sandbox's host state directory.
	BundleDir func(id string) string

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
	// SandboxWidePids: the processes limit holds the sandbox as a whole,
	// its executor included (a Pod's pids limit, which the executor
	// cannot divide: it has no cgroup of its own to make), so a fork bomb
	// may end the sandbox. ForkBomb then checks the run ends, the
	// bystander forks meanwhile, and the sandbox answers afterwards or is
	// reported gone.
	SandboxWidePids bool
	// Checkpoint, for a runtime whose volumes live with their sandboxes
	// (a Pod's emptyDir; workspace.Checkpointer), saves a volume as the
	// control plane does after every completed call. Lifecycle calls it
	// before the sandbox goes, and then checks the volume outlives it as
	// of that checkpoint. sandbox is the one that holds the volume.
	Checkpoint func(ctx context.Context, volume, sandbox string) error
	// PodNetwork: the sandbox has a network interface of its own besides
	// loopback (a Pod's eth0), whose egress the cluster's NetworkPolicy
	// closes. HostNetwork then expects lo and eth0, and still no service
	// on the caller's loopback and no egress.
	PodNetwork bool
	// SharedProcesses: the executions of one sandbox share a PID
	// namespace and a uid (the executor's unprivileged mode in a Pod,
	// which cannot make namespaces: docs/SECURITY.md, "In a Pod").
	// CrossExecution then checks what still holds: the executor (pid 1)
	// and the zygote stay unreadable to user code.
	SharedProcesses bool
	// ExecutorCaps is the executor's effective capability set, when it is
	// not KILL and DAC_READ_SEARCH (a Pod held to Pod Security's
	// baseline, which has no DAC_READ_SEARCH, leaves KILL alone).
	ExecutorCaps uint64
	// ZygoteCaps are the capabilities the zygote (and its idle workers)
	// hold permitted, never effective, in the sandbox's own namespace:
	// a Pod's CAP_SETGID, for the conversations' groups
	// (internal/executor/podviews.go). User code's bounding set keeps
	// them too (emptying it takes CAP_SETPCAP), every other set empty.
	// Zero: none outside the workers' user namespace.
	ZygoteCaps uint64
}

var seq atomic.Int64

// Sandbox is one sandbox made for a test, destroyed at its end.
type Sandbox struct {
	ID     string
	Volume string
	Client *execclient.Client
	rt     runtime.Runtime
}

// NewSandbox creates a sandbox with the given resources.
func (h *Harness) NewSandbox(t testing.TB, res runtime.Resources) *Sandbox {
	t.Helper()
	return h.newSandbox(t, runtime.Spec{Resources: res})
}

// newSandbox creates a sandbox from spec, filling in its id, image,
// labels and, unless spec has one, a new volume.
func (h *Harness) newSandbox(t testing.TB, spec runtime.Spec) *Sandbox {
	t.Helper()
	id := fmt.Sprintf("rtt-%d-%d", os.Getpid(), seq.Add(1))
	if spec.Volume == "" {
		spec.Volume = h.NewVolume(t)
	}
	ctx := context.Background()
	spec.ID, spec.Image = id, h.Image
	spec.Labels = map[string]string{"test": t.Name()}
	if _, err := h.Runtime.Create(ctx, spec); err != nil {
		t.Fatalf("create: %v", err)
	}
	rt := h.Runtime
	s := &Sandbox{ID: id, Volume: spec.Volume, rt: rt}
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

// Run runs the whole suite: the contract, then the parts of the
// capabilities the runtime declares.
func Run(t *testing.T, h Harness) {
	if h.NewVolume == nil || h.Image == "" {
		t.Fatal("Harness.Image and Harness.NewVolume are required")
	}
	t.Logf("runtime capabilities: %+v", runtime.CapabilitiesOf(h.Runtime))
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, &h) })
	t.Run("Errors", func(t *testing.T) { testErrors(t, &h) })
	t.Run("Recover", func(t *testing.T) { testRecover(t, &h) })
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, &h) })
	t.Run("SandboxRoot", func(t *testing.T) { testSandboxRoot(t, &h) })
	t.Run("Pause", func(t *testing.T) { testPause(t, &h) })
	t.Run("Stats", func(t *testing.T) { testStats(t, &h) })
	t.Run("Host", func(t *testing.T) { testHost(t, &h) })
}

// pauser, statsReader and host return the runtime's capability, or skip
// the test that needs it, saying why.
func (h *Harness) pauser(t testing.TB) runtime.Pauser {
	t.Helper()
	p, ok := runtime.PauserOf(h.Runtime)
	if !ok {
		t.Skip("the runtime cannot pause (no runtime.Pauser): pause and resume are not checked")
	}
	return p
}

func (h *Harness) statsReader(t testing.TB) runtime.StatsReader {
	t.Helper()
	r, ok := runtime.StatsReaderOf(h.Runtime)
	if !ok {
		t.Skip("the runtime reads no stats (no runtime.StatsReader): usage figures are not checked")
	}
	return r
}

func (h *Harness) host(t testing.TB) runtime.HostProcesses {
	t.Helper()
	hp, ok := runtime.HostProcessesOf(h.Runtime)
	if !ok {
		t.Skip("the runtime's sandboxes are not on this host (no runtime.HostProcesses): host probe skipped")
	}
	return hp
}

// onHost says whether the runtime's sandboxes are on this host.
func (h *Harness) onHost() bool { return runtime.CapabilitiesOf(h.Runtime).HostProcesses }

// testLifecycle is the contract's lifecycle: create, inspect, run, list,
// stop, destroy, and a volume that outlives its sandbox.
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
	if info.Image != h.Image || info.Volume != s.Volume {
		t.Errorf("inspect: image %q volume %q, want %q and %q", info.Image, info.Volume, h.Image, s.Volume)
	}
	if r := info.Resources; r.MemoryMB == 0 || r.CPU == 0 || r.PIDs == 0 {
		t.Errorf("inspect: resources %+v, want the defaults filled in", r)
	}
	res := s.MustRun(t, "python", "print('hello')\nreturn 6*7")
	if res.Stdout != "hello\n" || string(res.ReturnValue) != "42" {
		t.Errorf("run: stdout %q return %s", res.Stdout, res.ReturnValue)
	}
	res = s.MustRun(t, "bash", "echo hi from bash")
	if res.Stdout != "hi from bash\n" {
		t.Errorf("bash: %q", res.Stdout)
	}
	s.MustRun(t, "python", "open('/workspace/out.txt','w').write('data')")
	if h.Checkpoint != nil {
		if err := h.Checkpoint(ctx, s.Volume, s.ID); err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
	}

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
	if list, err := rt.List(ctx); err != nil || contains(list, s.ID) {
		t.Errorf("list after destroy has %s: %v", s.ID, err)
	}
	if err := rt.Destroy(ctx, s.ID); err != nil {
		t.Errorf("destroy is not idempotent: %v", err)
	}

	// The volume outlives the sandbox: a new one over it finds the file.
	again := h.newSandbox(t, runtime.Spec{Volume: s.Volume})
	if got := returnString(t, again.MustRun(t, "python", "return open('/workspace/out.txt').read()")); got != "data" {
		t.Errorf("a new sandbox over the volume reads %q, want what the destroyed one wrote", got)
	}
}

// testErrors is the contract's bad input: every malformed name is
// refused before anything is made, a name that only looks like a path
// never reaches one, and unknown sandboxes are ErrNotFound.
func testErrors(t *testing.T, h *Harness) {
	ctx := context.Background()
	rt := h.Runtime
	vol := h.NewVolume(t)
	long := strings.Repeat("a", 64<<10)
	// Paths given as names: the runtime resolves names, never paths.
	badImages := []string{"", "../../etc", "/", "/etc", "sbx/../../x:1", long}
	badVolumes := []string{"", "..", "../x", "x/../../etc", "/", "/tmp", "/etc/x", "a/b/c", long}
	if h.Rootfs != "" {
		badImages = append(badImages, h.Rootfs)
	}
	if h.VolumeDir != nil {
		badVolumes = append(badVolumes, h.VolumeDir(vol))
	}
	type tc struct {
		name string
		spec runtime.Spec
		want error
	}
	cases := []tc{
		{"bad id", runtime.Spec{ID: "../x", Image: h.Image, Volume: vol}, errdefs.ErrInvalidArgument},
		{"empty id", runtime.Spec{ID: "", Image: h.Image, Volume: vol}, errdefs.ErrInvalidArgument},
		{"long id", runtime.Spec{ID: long, Image: h.Image, Volume: vol}, errdefs.ErrInvalidArgument},
	}
	for i, img := range badImages {
		cases = append(cases, tc{fmt.Sprintf("bad image %d", i), runtime.Spec{ID: fmt.Sprintf("rtt-badimg-%d", i), Image: img, Volume: vol}, errdefs.ErrInvalidArgument})
	}
	for i, v := range badVolumes {
		cases = append(cases, tc{fmt.Sprintf("bad volume %d", i), runtime.Spec{ID: fmt.Sprintf("rtt-badvol-%d", i), Image: h.Image, Volume: v}, errdefs.ErrInvalidArgument})
	}
	if h.MissingImage != "" {
		cases = append(cases, tc{"missing image", runtime.Spec{ID: "rtt-noimage", Image: h.MissingImage, Volume: vol}, errdefs.ErrNotFound})
	}
	if h.MissingVolume != "" {
		cases = append(cases, tc{"missing volume", runtime.Spec{ID: "rtt-novol", Image: h.Image, Volume: h.MissingVolume}, errdefs.ErrNotFound})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rt.Create(ctx, tc.spec)
			if !errors.Is(err, tc.want) {
				t.Errorf("image %.80q volume %.80q: got %v, want %v", tc.spec.Image, tc.spec.Volume, err, tc.want)
			}
			if err != nil && len(err.Error()) > 4096 {
				t.Errorf("the error repeats the input: %d bytes", len(err.Error()))
			}
			// Nothing was left behind.
			if list, err := rt.List(ctx); err != nil || tc.spec.ID != "" && contains(list, tc.spec.ID) {
				t.Errorf("a refused create left %q listed: %v", tc.spec.ID, err)
			}
		})
	}
	t.Run("duplicate", func(t *testing.T) {
		s := h.NewSandbox(t, runtime.Resources{})
		_, err := rt.Create(ctx, runtime.Spec{ID: s.ID, Image: h.Image, Volume: h.NewVolume(t)})
		if !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Errorf("got %v, want ErrAlreadyExists", err)
		}
		s.MustRun(t, "python", "print(1)") // the first one is unharmed
	})
	t.Run("unknown", func(t *testing.T) {
		for name, err := range map[string]error{
			"inspect": func() error { _, err := rt.Inspect(ctx, "rtt-unknown"); return err }(),
			"dial":    func() error { _, err := rt.Dial(ctx, "rtt-unknown"); return err }(),
			"bad id":  func() error { _, err := rt.Inspect(ctx, "../../x"); return err }(),
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
	if _, err := rt2.Inspect(ctx, s.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("inspect after destroy: %v, want ErrNotFound", err)
	}
	if h.onHost() {
		checkGone(t, h, s.ID)
	}
}

// testPause is the Pauser capability: a paused sandbox does not answer,
// pausing twice or resuming a running one is refused, and a resumed one
// runs.
func testPause(t *testing.T, h *Harness) {
	p := h.pauser(t)
	ctx := context.Background()
	rt := h.Runtime
	s := h.NewSandbox(t, runtime.Resources{})
	s.MustRun(t, "python", "print(1)")
	if err := p.Pause(ctx, s.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if info, _ := rt.Inspect(ctx, s.ID); info.State != runtime.StatePaused {
		t.Errorf("after pause: %s", info.State)
	}
	if err := p.Pause(ctx, s.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("pause twice: %v, want ErrFailedPrecondition", err)
	}
	// A frozen executor does not answer.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := s.Client.Health(short)
	cancel()
	if err == nil {
		t.Errorf("a paused sandbox answered")
	}
	if err := p.Resume(ctx, s.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if err := p.Resume(ctx, s.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("resume twice: %v, want ErrFailedPrecondition", err)
	}
	s.MustRun(t, "python", "print(1)")
	// Stopping a paused sandbox works.
	if err := p.Pause(ctx, s.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := rt.Stop(ctx, s.ID); err != nil {
		t.Fatalf("stop a paused sandbox: %v", err)
	}
	if info, err := rt.Inspect(ctx, s.ID); err != nil || info.State != runtime.StateStopped {
		t.Errorf("after stop: %+v, %v", info, err)
	}
	for name, err := range map[string]error{"pause": p.Pause(ctx, "rtt-unknown"), "resume": p.Resume(ctx, "rtt-unknown")} {
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s unknown: %v, want ErrNotFound", name, err)
		}
	}
}

// testStats is the StatsReader capability: figures that follow what the
// code does (memory grows while it holds an allocation, CPU time grows
// while it computes), the sandbox's limits, a stopped sandbox's answer,
// and ErrNotFound. OOM kills are counted in MemoryBomb (Isolation).
func testStats(t *testing.T, h *Harness) {
	r := h.statsReader(t)
	ctx := context.Background()
	s := h.NewSandbox(t, runtime.Resources{})
	s.MustRun(t, "python", "print(sum(range(100000)))")
	info, err := h.Runtime.Inspect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := r.Stats(ctx, s.ID)
	if err != nil || idle.MemoryBytes == 0 || idle.PIDs == 0 || idle.CPUNanos == 0 {
		t.Fatalf("stats: %+v, %v", idle, err)
	}
	if want := info.Resources; idle.Limits != want {
		t.Errorf("stats: limits %+v, want what the sandbox was given (defaults filled in): %+v", idle.Limits, want)
	}
	if idle.MemoryCacheBytes > idle.MemoryBytes || idle.MemoryPeakBytes != 0 && idle.MemoryPeakBytes < idle.MemoryBytes {
		t.Errorf("stats: cache %d and peak %d against memory %d", idle.MemoryCacheBytes, idle.MemoryPeakBytes, idle.MemoryBytes)
	}

	// While code holds 96 MiB it has touched, the sandbox's memory counts
	// them, and the CPU time that took.
	const held = 96 << 20
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	holding := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := s.Client.Run(rctx, wire.RunRequest{ID: fmt.Sprintf("e%d", seq.Add(1)), Language: "python", TimeoutMs: 110_000,
			Code: fmt.Sprintf("import time\nx = bytearray(%d)\nx[::4096] = b'x' * len(x[::4096])\nprint('holding', flush=True)\ntime.sleep(100)", held)},
			func(_, data string) {
				if strings.Contains(data, "holding") {
					once.Do(func() { close(holding) })
				}
			})
		done <- err
	}()
	select {
	case <-holding:
	case err := <-done:
		t.Fatalf("the allocation's run ended before it held its memory: %v", err)
	}
	busy, err := r.Stats(ctx, s.ID)
	cancel()
	<-done
	t.Logf("stats at rest: %+v; holding %d MiB: %+v", idle, held>>20, busy)
	if err != nil || busy.MemoryBytes < idle.MemoryBytes+held*3/4 || busy.CPUNanos <= idle.CPUNanos {
		t.Errorf("stats while code holds %d MiB: %+v, %v; at rest: %+v", held>>20, busy, err, idle)
	} else if busy.MemoryPeakBytes != 0 && busy.MemoryPeakBytes < busy.MemoryBytes {
		t.Errorf("stats while code holds %d MiB: peak %d under the memory %d", held>>20, busy.MemoryPeakBytes, busy.MemoryBytes)
	}

	// Stopped, a sandbox still answers (with its limits); gone, it is
	// ErrNotFound.
	if err := h.Runtime.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if st, err := r.Stats(ctx, s.ID); err != nil || st.Limits != info.Resources {
		t.Errorf("stats of a stopped sandbox: %+v, %v; want its limits %+v", st, err, info.Resources)
	}
	if _, err := r.Stats(ctx, "rtt-unknown"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("stats unknown: %v, want ErrNotFound", err)
	}
}

// testHost is the HostProcesses capability: the sandbox seen from the
// host while it runs, and nothing of it left on the host once destroyed
// but its volume.
func testHost(t *testing.T, h *Harness) {
	hp := h.host(t)
	if h.VolumeDir == nil {
		t.Fatal("Harness.VolumeDir is nil: a runtime on this host must say where its volumes are")
	}
	ctx := context.Background()
	rt := h.Runtime
	s := h.NewSandbox(t, runtime.Resources{})
	if pid, err := hp.Pid(ctx, s.ID); err != nil || pid <= 0 {
		t.Errorf("pid of a running sandbox: %d, %v", pid, err)
	} else if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
		t.Errorf("pid %d is not a host process: %v", pid, err)
	}
	if _, err := hp.Pid(ctx, "rtt-unknown"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("pid of an unknown sandbox: %v, want ErrNotFound", err)
	}
	// Files written by the sandbox land in the volume's directory.
	s.MustRun(t, "python", "open('/workspace/out.txt','w').write('data')")
	dir := h.VolumeDir(s.Volume)
	if b, err := os.ReadFile(filepath.Join(dir, "out.txt")); err != nil || string(b) != "data" {
		t.Errorf("workspace file: %q, %v", b, err)
	}
	if err := rt.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if pid, err := hp.Pid(ctx, s.ID); err != nil || pid != 0 {
		t.Errorf("pid of a stopped sandbox: %d, %v; want 0", pid, err)
	}
	if err := rt.Destroy(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	checkGone(t, h, s.ID)
	if _, err := os.Stat(filepath.Join(dir, "out.txt")); err != nil {
		t.Errorf("destroy removed the workspace: %v", err)
	}
}

// checkGone verifies a destroyed sandbox left nothing on the host.
func checkGone(t *testing.T, h *Harness, id string) {
	t.Helper()
	if h.CgroupDirs == nil || h.BundleDir == nil {
		t.Fatal("Harness.CgroupDirs and BundleDir are nil: a runtime on this host must say where a sandbox's cgroups and state are")
	}
	for _, d := range h.CgroupDirs(id) {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s left behind", d)
		}
	}
	if _, err := os.Stat(h.BundleDir(id)); err == nil {
		t.Errorf("bundle %s left behind", h.BundleDir(id))
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), id) {
		t.Errorf("a mount of %s is left on the host", id)
	}
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
