package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/errdefs"
	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

func TestMain(m *testing.M) { Main(m) }

// sandboxWorkspace makes a workspace the sandbox user owns.
func sandboxWorkspace(t testing.TB, root, name string) string {
	t.Helper()
	ws := filepath.Join(root, name)
	if err := os.Mkdir(ws, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ws, SandboxUID, SandboxUID); err != nil {
		t.Fatal(err)
	}
	return ws
}

func clientOf(rt runtime.Runtime, id string) *execclient.Client {
	return execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
}

func run(t testing.TB, c *execclient.Client, code string) *wire.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Run(ctx, wire.RunRequest{ID: "r", Language: wire.LanguagePython, Code: code}, nil)
	if err != nil {
		t.Fatalf("run %q: %v", code, err)
	}
	return res
}

// children lists this process's child processes (the executor's zygote
// and its helpers, and whatever they left: the executor is a subreaper).
func children(t *testing.T) []string {
	t.Helper()
	var out []string
	me := fmt.Sprint(os.Getpid())
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			if f := strings.Fields(s[i+1:]); len(f) > 1 && f[1] == me {
				out = append(out, s[:i+1])
			}
		}
	}
	return out
}

func TestInProcessLifecycle(t *testing.T) {
	before := goleak.IgnoreCurrent()
	rt := NewInProcess(t)
	rt.Volumes = pathVolumes{}
	ctx := context.Background()
	ws := sandboxWorkspace(t, WorkspaceRoot(t), "ws")
	info, err := rt.Create(ctx, runtime.Spec{ID: "one", Volume: ws, Env: map[string]string{"GREETING": "hi"}, Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if info.State != runtime.StateRunning || info.Labels["k"] != "v" || info.Volume != ws {
		t.Errorf("created: %+v", info)
	}
	c := clientOf(rt, "one")
	defer c.Close()
	res := run(t, c, "import os\nopen('made.txt','w').write(os.environ['GREETING'])\nreturn os.getuid()")
	if res.Status != wire.StatusCompleted || res.ReturnValue == nil || string(res.ReturnValue) != "1000" {
		t.Fatalf("run: %+v", res)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "made.txt")); string(b) != "hi" {
		t.Errorf("the run's file on the host: %q %v", b, err)
	}
	if len(children(t)) == 0 {
		t.Error("no child process while the sandbox runs: the check after destroy sees nothing")
	}

	// Paused: refused at once, new connection or kept one.
	if err := rt.Pause(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if err := rt.Pause(ctx, "one"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("pause of a paused sandbox: %v, want failed precondition", err)
	}
	if _, err := rt.Dial(ctx, "one"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("dial of a paused sandbox: %v, want unavailable", err)
	}
	if _, err := c.Run(ctx, wire.RunRequest{ID: "p", Language: wire.LanguagePython, Code: "1"}, nil); !errors.Is(err, execclient.ErrNoAnswer) {
		t.Errorf("run in a paused sandbox: %v, want no answer", err)
	}
	if info, _ := rt.Inspect(ctx, "one"); info == nil || info.State != runtime.StatePaused {
		t.Errorf("inspect of a paused sandbox: %+v", info)
	}
	if err := rt.Resume(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if err := rt.Resume(ctx, "one"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("resume of a running sandbox: %v, want failed precondition", err)
	}
	if res := run(t, c, "return 2+2"); string(res.ReturnValue) != "4" {
		t.Errorf("after resume: %+v", res)
	}

	if err := rt.Stop(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if info, err := rt.Inspect(ctx, "one"); err != nil || info.State != runtime.StateStopped {
		t.Errorf("inspect of a stopped sandbox: %+v %v", info, err)
	}
	if _, err := rt.Dial(ctx, "one"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("dial of a stopped sandbox: %v, want unavailable", err)
	}
	if err := rt.Destroy(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	// Nothing of the sandbox is left: no goroutine, no process.
	if err := goleak.Find(before, goleak.IgnoreAnyFunction("os/signal.loop")); err != nil {
		t.Errorf("after destroy: %v", err)
	}
	if ps := children(t); len(ps) != 0 {
		t.Errorf("after destroy, processes: %q", ps)
	}
	if _, err := rt.Inspect(ctx, "one"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("inspect after destroy: %v, want not found", err)
	}
	if err := rt.Destroy(ctx, "one"); err != nil {
		t.Errorf("second destroy: %v", err)
	}
	if l, _ := rt.List(ctx); len(l) != 0 {
		t.Errorf("list after destroy: %+v", l)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "made.txt")); string(b) != "hi" {
		t.Errorf("the workspace after destroy: %q %v", b, err)
	}
}

// TestInProcessRefuses: ids that would become paths, workspaces the
// sandbox user could not use, a second sandbox of one id, and more than
// the runtime's bound; none leaves anything behind.
func TestInProcessRefuses(t *testing.T) {
	rt := NewInProcess(t)
	rt.Volumes = pathVolumes{}
	rt.MaxSandboxes = 1
	ctx := context.Background()
	root := WorkspaceRoot(t)
	ws := sandboxWorkspace(t, root, "ws")
	rootOwned := filepath.Join(root, "root-owned")
	if err := os.Mkdir(rootOwned, 0o777); err != nil {
		t.Fatal(err)
	}
	closed := filepath.Join(root, "closed")
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	behind := sandboxWorkspace(t, closed, "ws")
	link := filepath.Join(root, "link")
	if err := os.Symlink(ws, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		spec runtime.Spec
		want error
	}{
		{"empty id", runtime.Spec{Volume: ws}, errdefs.ErrInvalidArgument},
		{"id with a slash", runtime.Spec{ID: "../x", Volume: ws}, errdefs.ErrInvalidArgument},
		{"long id", runtime.Spec{ID: strings.Repeat("a", 65), Volume: ws}, errdefs.ErrInvalidArgument},
		{"network", runtime.Spec{ID: "n", Volume: ws, Network: true}, errdefs.ErrInvalidArgument},
		{"relative workspace", runtime.Spec{ID: "r", Volume: "ws"}, errdefs.ErrInvalidArgument},
		{"missing workspace", runtime.Spec{ID: "m", Volume: filepath.Join(root, "nothing")}, errdefs.ErrInvalidArgument},
		{"symlinked workspace", runtime.Spec{ID: "l", Volume: link}, errdefs.ErrInvalidArgument},
		{"root's workspace", runtime.Spec{ID: "o", Volume: rootOwned}, errdefs.ErrInvalidArgument},
		{"workspace behind a closed directory", runtime.Spec{ID: "c", Volume: behind}, errdefs.ErrInvalidArgument},
		{"bad preload", runtime.Spec{ID: "p", Volume: ws, Preload: []string{"os; import x"}}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := rt.Create(ctx, tc.spec); !errors.Is(err, tc.want) {
				t.Errorf("create: %v, want %v", err, tc.want)
			}
		})
	}
	if l, _ := rt.List(ctx); len(l) != 0 {
		t.Fatalf("refused creates left sandboxes: %+v", l)
	}
	if _, err := rt.Create(ctx, runtime.Spec{ID: "a", Volume: ws}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Create(ctx, runtime.Spec{ID: "a", Volume: ws}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("a second sandbox a: %v, want already exists", err)
	}
	if _, err := rt.Create(ctx, runtime.Spec{ID: "b", Volume: ws}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("a sandbox past MaxSandboxes: %v, want resource exhausted", err)
	}
	if l, _ := rt.List(ctx); len(l) != 1 || l[0].ID != "a" {
		t.Errorf("list: %+v, want a alone", l)
	}
}

// TestInProcessCreateCancelled: a Create whose caller gives up before the
// executor is ready leaves nothing behind.
func TestInProcessCreateCancelled(t *testing.T) {
	rt := NewInProcess(t)
	rt.Volumes = pathVolumes{}
	ws := sandboxWorkspace(t, WorkspaceRoot(t), "ws")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := rt.Create(ctx, runtime.Spec{ID: "x", Volume: ws}); !errors.Is(err, context.Canceled) {
		t.Errorf("create with a cancelled context: %v", err)
	}
	if l, _ := rt.List(context.Background()); len(l) != 0 {
		t.Errorf("a cancelled create left %+v", l)
	}
	if _, err := rt.Create(context.Background(), runtime.Spec{ID: "x", Volume: ws}); err != nil {
		t.Errorf("the id again: %v", err)
	}
}

// TestInProcessStopBreaksRun: a run in flight when its sandbox is killed
// ends with an error, as with a real sandbox, instead of hanging.
func TestInProcessStopBreaksRun(t *testing.T) {
	rt := NewInProcess(t)
	rt.Volumes = pathVolumes{}
	ctx := context.Background()
	ws := sandboxWorkspace(t, WorkspaceRoot(t), "ws")
	if _, err := rt.Create(ctx, runtime.Spec{ID: "k", Volume: ws}); err != nil {
		t.Fatal(err)
	}
	c := clientOf(rt, "k")
	defer c.Close()
	started := make(chan struct{}, 1)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Run(ctx, wire.RunRequest{ID: "long", Language: wire.LanguagePython, Code: "import time\nprint('up', flush=True)\ntime.sleep(600)"},
			func(string, string) {
				select {
				case started <- struct{}{}:
				default:
				}
			})
		errc <- err
	}()
	<-started
	if err := rt.Stop(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err == nil {
		t.Error("a run whose sandbox was stopped under it succeeded")
	}
}

// BenchmarkInProcessCreate is a sandbox's create to its first result,
// and its destroy (reported apart: create-ms, run-ms, destroy-ms).
func BenchmarkInProcessCreate(b *testing.B) {
	rt := NewInProcess(b)
	rt.Volumes = pathVolumes{}
	ws := sandboxWorkspace(b, WorkspaceRoot(b), "ws")
	ctx := context.Background()
	var create, first, destroy time.Duration
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprint("b", i)
		t0 := time.Now()
		if _, err := rt.Create(ctx, runtime.Spec{ID: id, Volume: ws}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		c := clientOf(rt, id)
		run(b, c, "1")
		c.Close()
		t2 := time.Now()
		rt.Destroy(ctx, id)
		create, first, destroy = create+t1.Sub(t0), first+t2.Sub(t1), destroy+time.Since(t2)
	}
	n := float64(b.N) * float64(time.Millisecond)
	b.ReportMetric(float64(create)/n, "create-ms")
	b.ReportMetric(float64(first)/n, "run-ms")
	b.ReportMetric(float64(destroy)/n, "destroy-ms")
}

// pathVolumes names each volume by its directory: InProcess's own tests
// give it directories, good and bad, directly.
type pathVolumes struct{}

func (pathVolumes) VolumeDir(_ context.Context, name string) (string, error) { return name, nil }
