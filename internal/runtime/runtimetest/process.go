package runtimetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor"
	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/seccomp"
	"go.uber.org/goleak"
)

// InProcess is a runtime whose sandboxes are the real executor daemon
// (internal/executor) served from the test process on a unix socket, with
// the host's python3 as its zygote and no container around it: what the
// control plane does with an executor (runs, output, cancels, contexts,
// the executor dying under a run) can be tested in milliseconds, without
// runc and without a template build.
//
// It is no sandbox. User code runs as uid SandboxUID in the executor's own
// per-run PID and user namespaces, under the inner seccomp filter, but it
// sees the host's filesystem and network, and no cgroup holds it: the
// Resources of a Spec are recorded, not enforced. Only tests run it, on
// code they wrote.
//
// Its sandboxes live as long as the runtime: Stop and Destroy end the
// executor and wait for every goroutine and process it started (goleak is
// clean after them); List knows only this instance's. Pause and Resume
// flip the state: while paused, Dial and every write on a connection it
// gave refuse with ErrUnavailable, so a caller that forgot to resume fails
// at once instead of hanging, but a run already streaming is not frozen.
type InProcess struct {
	// Python is the zygote's interpreter. NewInProcess sets
	// /usr/bin/python3: the zygote needs the system one.
	Python string
	// MaxSandboxes bounds the sandboxes in any state; more are
	// ErrResourceExhausted (each one is a python zygote and a warm worker).
	MaxSandboxes int
	// Volumes resolves a Spec's volume to its directory; the image is
	// ignored (code runs on the host's files).
	Volumes VolumeResolver

	mu    sync.Mutex
	boxes map[string]*box
}

// SandboxUID is the uid (and gid) user code runs as, and so the owner a
// workspace given to InProcess must have: there is no idmapped mount to
// make it so.
const SandboxUID = 1000

// defaultMaxSandboxes is InProcess.MaxSandboxes unless set.
const defaultMaxSandboxes = 64

// box is one sandbox: an executor serving on ctl/executor.sock.
type box struct {
	info    runtime.Info // InProcess.mu
	ctl     string
	sock    string
	created chan struct{} // closed when Create is over, made or not
	stop    context.CancelFunc
	served  chan struct{} // closed when Serve returned
	logs    *logTail
	conns   map[*conn]struct{} // InProcess.mu: what Dial gave, still open
}

var helperCalled atomic.Bool

// RunHelper must be the first call of TestMain in a package that uses
// InProcess: the executor starts its zygote by re-executing the running
// binary in a hidden mode, which this call serves (executor.RunHelper).
// Without it that re-execution would run the package's tests again.
func RunHelper() {
	executor.RunHelper()
	helperCalled.Store(true)
}

// Main is the whole TestMain of a package that uses InProcess: RunHelper,
// the tests, and then goleak, which fails a passing run that left a
// goroutine behind (os/signal's loop aside: it lives as long as the
// process once a signal is watched, and the executor's reaper watches
// SIGCHLD).
func Main(m *testing.M) {
	RunHelper()
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("os/signal.loop")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// innerFilter is the executor's inner seccomp program, made once.
var innerFilter = sync.OnceValues(seccomp.InnerFilter)

// NewInProcess returns an empty InProcess whose sandboxes are destroyed
// when t's test ends. It skips t unless the process is root (the executor
// drops to SandboxUID and makes namespaces) and the host has
// /usr/bin/python3, and fails it unless TestMain called RunHelper.
func NewInProcess(t testing.TB) *InProcess {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the in-process executor drops to uid 1000 and creates PID and user namespaces")
	}
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("needs %s for the executor's zygote: %v", python, err)
	}
	if !helperCalled.Load() {
		t.Fatal("runtimetest.InProcess: TestMain must call runtimetest.RunHelper() first (the executor re-executes the test binary)")
	}
	if _, err := innerFilter(); err != nil {
		t.Fatalf("seccomp.InnerFilter: %v", err)
	}
	r := &InProcess{Python: python}
	t.Cleanup(r.Close)
	return r
}

// WorkspaceRoot returns a new directory, removed when t ends, under which
// workspaces for InProcess may go: SandboxUID can traverse it (t.TempDir's
// parents are root's alone), and so the directories of the tenants named,
// made in it ahead of the session layer. That layer makes a tenant's
// directory 0700 (a real runtime reaches a workspace through a bind mount;
// InProcess's executor reaches it by its host path) and leaves one that
// exists alone.
func WorkspaceRoot(t testing.TB, tenants ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbx-inproc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range append([]string{dir}, tenants...) {
		if d != dir {
			d = filepath.Join(dir, d)
			if err := os.Mkdir(d, 0o711); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// validID is what a sandbox id may look like, as for the OCI runtime.
var validID = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// VolumeResolver maps a Spec's volume name to the host directory the
// sandbox's executor works in (workspace.Volumes over the session layer's
// workspace root, say).
type VolumeResolver interface {
	VolumeDir(ctx context.Context, name string) (string, error)
}

// workspaceDir is the host directory the sandbox's executor works in: the
// one place that reads where a Spec's workspace is.
func (r *InProcess) workspaceDir(ctx context.Context, spec runtime.Spec) (string, error) {
	if r.Volumes == nil {
		return "", fmt.Errorf("the in-process runtime has no volume resolver (InProcess.Volumes): %w", errdefs.ErrFailedPrecondition)
	}
	return r.Volumes.VolumeDir(ctx, spec.Volume)
}

// checkWorkspace refuses a workspace user code could not use: not a
// directory, not SandboxUID's, or behind a directory SandboxUID cannot
// traverse. A real runtime would chown and mount it; here the executor
// reaches it by its host path.
func checkWorkspace(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("workspace %q is not an absolute path: %w", dir, errdefs.ErrInvalidArgument)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(dir, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return fmt.Errorf("workspace %q is not a directory (%v): %w", dir, err, errdefs.ErrInvalidArgument)
	}
	if st.Uid != SandboxUID || st.Gid != SandboxUID {
		return fmt.Errorf("workspace %q is owned by %d:%d, not the sandbox user %d:%d (the in-process runtime changes no owner): %w",
			dir, st.Uid, st.Gid, SandboxUID, SandboxUID, errdefs.ErrInvalidArgument)
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		if err := syscall.Stat(p, &st); err != nil {
			return fmt.Errorf("workspace %q: %s: %v: %w", dir, p, err, errdefs.ErrInvalidArgument)
		}
		if st.Mode&0o001 == 0 && !(st.Uid == SandboxUID && st.Mode&0o100 != 0) {
			return fmt.Errorf("workspace %q: uid %d cannot traverse %s (mode %o; see WorkspaceRoot): %w",
				dir, SandboxUID, p, st.Mode&0o7777, errdefs.ErrInvalidArgument)
		}
		if p == "/" {
			return nil
		}
	}
}

// Create starts an executor over the spec's workspace and returns once it
// answers /health as ready. A failed Create leaves nothing behind.
func (r *InProcess) Create(ctx context.Context, spec runtime.Spec) (_ *runtime.Info, err error) {
	if !validID.MatchString(spec.ID) {
		return nil, fmt.Errorf("sandbox id %q: want 1-64 of [a-zA-Z0-9_-]: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if spec.Network {
		return nil, fmt.Errorf("sandbox %s: network access is not supported: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	ws, err := r.workspaceDir(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if err := checkWorkspace(ws); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	b := &box{
		info: runtime.Info{
			ID: spec.ID, State: runtime.StateCreating, Runtime: "inprocess",
			Image: spec.Image, Volume: spec.Volume, Resources: spec.Resources.WithDefaults(),
			Labels: maps.Clone(spec.Labels), CreatedAt: time.Now().UTC(),
		},
		created: make(chan struct{}), served: make(chan struct{}), logs: &logTail{},
		conns: map[*conn]struct{}{},
	}
	r.mu.Lock()
	if r.boxes == nil {
		r.boxes = map[string]*box{}
	}
	if _, ok := r.boxes[spec.ID]; ok {
		r.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	max := r.MaxSandboxes
	if max <= 0 {
		max = defaultMaxSandboxes
	}
	if len(r.boxes) >= max {
		r.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: the in-process runtime holds its limit of %d sandboxes: %w", spec.ID, max, errdefs.ErrResourceExhausted)
	}
	r.boxes[spec.ID] = b
	r.mu.Unlock()
	defer close(b.created)
	defer func() {
		if err != nil {
			r.end(b)
			r.mu.Lock()
			delete(r.boxes, spec.ID)
			r.mu.Unlock()
			if b.ctl != "" {
				os.RemoveAll(b.ctl)
			}
		}
	}()

	filter, err := innerFilter()
	if err != nil {
		return nil, err
	}
	// A short path: a unix socket's must stay under 108 bytes.
	if b.ctl, err = os.MkdirTemp("", "sbxp-"); err != nil {
		return nil, err
	}
	b.sock = filepath.Join(b.ctl, "executor.sock")
	srv, err := executor.New(executor.Config{
		SocketPath: b.sock, Workspace: ws, Python: r.Python, UID: SandboxUID, GID: SandboxUID,
		Preload: spec.Preload, SeccompFilter: filter, UserEnv: spec.Env,
		// The helpers' environment: nothing of the tenant's (Config.Env).
		Env:    []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"},
		Logger: slog.New(slog.NewJSONHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	sctx, stop := context.WithCancel(context.Background())
	b.stop = stop
	var serveErr error
	go func() {
		defer close(b.served)
		serveErr = srv.Serve(sctx)
	}()
	// Wait for the executor, unless it gave up before answering.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go func() {
		select {
		case <-b.served:
			wcancel()
		case <-wctx.Done():
		}
	}()
	c := execclient.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", b.sock)
	})
	err = waitReady(wctx, c)
	c.Close()
	if err != nil {
		select {
		case <-b.served:
			if serveErr != nil {
				err = serveErr
			}
		default:
		}
		return nil, fmt.Errorf("sandbox %s: %w; executor log: %s", spec.ID, err, b.logs.String())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b.info.State = runtime.StateRunning
	info := b.info
	info.Labels = maps.Clone(info.Labels)
	return &info, nil
}

// waitReady polls the executor's health every millisecond or two until
// it is ready: the client's WaitReady backs off to 100 ms, which would be
// most of what a start here takes.
func waitReady(ctx context.Context, c *execclient.Client) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		h, err := c.Health(ctx)
		if err == nil && h.Ready {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("not ready (preload error: %q)", h.PreloadError)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("executor not ready: %w (last: %v)", context.Cause(ctx), err)
		case <-t.C:
		}
	}
}

// end stops b's executor, if it runs, and waits until it has stopped:
// every connection Dial gave is closed first, as a killed sandbox's would
// break, then Serve kills the runs and the zygote and returns.
func (r *InProcess) end(b *box) {
	r.mu.Lock()
	b.info.State = runtime.StateStopped
	conns := b.conns
	b.conns = map[*conn]struct{}{}
	r.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
	if b.stop != nil { // Serve was started
		b.stop()
		<-b.served
	}
}

// get returns the sandbox id once its Create is over (so that nothing
// stops a sandbox while it starts); ErrNotFound if there is none.
func (r *InProcess) get(id string) (*box, error) {
	r.mu.Lock()
	b := r.boxes[id]
	r.mu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	<-b.created
	return b, nil
}

// Dial connects to the sandbox's executor; ErrUnavailable unless it runs.
func (r *InProcess) Dial(ctx context.Context, id string) (net.Conn, error) {
	b, err := r.get(id)
	if err != nil {
		return nil, err
	}
	if err := r.usable(b); err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", b.sock)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %v: %w", id, err, errdefs.ErrUnavailable)
	}
	c := &conn{Conn: nc, r: r, b: b}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.info.State != runtime.StateRunning {
		nc.Close()
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, b.info.State, errdefs.ErrUnavailable)
	}
	b.conns[c] = struct{}{}
	return c, nil
}

// usable is nil if b runs (not paused, stopped or gone).
func (r *InProcess) usable(b *box) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.info.State != runtime.StateRunning {
		return fmt.Errorf("sandbox %s is %s: %w", b.info.ID, b.info.State, errdefs.ErrUnavailable)
	}
	return nil
}

// conn is a connection Dial gave: Stop breaks it, a pause refuses its
// writes.
type conn struct {
	net.Conn
	r    *InProcess
	b    *box
	once sync.Once
}

func (c *conn) Write(p []byte) (int, error) {
	if err := c.r.usable(c.b); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.r.mu.Lock()
		delete(c.b.conns, c)
		c.r.mu.Unlock()
	})
	return c.Conn.Close()
}

// move changes a sandbox's state from one to another, or says why not.
func (r *InProcess) move(id, op string, from, to runtime.State) error {
	b, err := r.get(id)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.info.State != from {
		return &runtime.StateError{ID: id, Op: op, State: b.info.State}
	}
	b.info.State = to
	return nil
}

// Pause marks a running sandbox paused (see InProcess).
func (r *InProcess) Pause(ctx context.Context, id string) error {
	return r.move(id, "pause", runtime.StateRunning, runtime.StatePaused)
}

// Resume marks a paused sandbox running.
func (r *InProcess) Resume(ctx context.Context, id string) error {
	return r.move(id, "resume", runtime.StatePaused, runtime.StateRunning)
}

// Stop ends the sandbox's executor as a kill from outside would: its
// connections break, its runs and zygote are killed; Inspect then says
// stopped. It waits for all of that.
func (r *InProcess) Stop(ctx context.Context, id string) error {
	b, err := r.get(id)
	if err != nil {
		return err
	}
	r.end(b)
	return nil
}

// Terminate ends the sandbox as a Pod's deletion does: its executor is
// told to shut down (the kubelet's SIGTERM) and answers the runs it has
// as cancelled on its way out; then the sandbox is stopped.
func (r *InProcess) Terminate(ctx context.Context, id string) error {
	b, err := r.get(id)
	if err != nil {
		return err
	}
	if b.stop != nil {
		b.stop()
		<-b.served
	}
	r.end(b)
	return nil
}

// Destroy stops the sandbox and forgets it. The workspace stays: it is the
// caller's.
func (r *InProcess) Destroy(ctx context.Context, id string) error {
	b, err := r.get(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	r.end(b)
	r.mu.Lock()
	if r.boxes[id] == b {
		delete(r.boxes, id)
	}
	r.mu.Unlock()
	return os.RemoveAll(b.ctl)
}

// Close destroys every sandbox.
func (r *InProcess) Close() {
	r.mu.Lock()
	ids := make([]string, 0, len(r.boxes))
	for id := range r.boxes {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	for _, id := range ids {
		r.Destroy(context.Background(), id)
	}
}

// Inspect reports one sandbox.
func (r *InProcess) Inspect(ctx context.Context, id string) (*runtime.Info, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.boxes[id]
	if b == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	info := b.info
	info.Labels = maps.Clone(info.Labels)
	return &info, nil
}

// Stats reports no usage (no cgroup holds the executor) and the limits
// the sandbox was created with.
func (r *InProcess) Stats(ctx context.Context, id string) (*runtime.Stats, error) {
	info, err := r.Inspect(ctx, id)
	if err != nil {
		return nil, err
	}
	return &runtime.Stats{Limits: info.Resources}, nil
}

// List reports this instance's sandboxes.
func (r *InProcess) List(ctx context.Context) ([]runtime.Info, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]runtime.Info, 0, len(r.boxes))
	for _, b := range r.boxes {
		info := b.info
		info.Labels = maps.Clone(info.Labels)
		out = append(out, info)
	}
	return out, nil
}

// Logs returns the end of the sandbox's executor log, for a failing
// test's message.
func (r *InProcess) Logs(id string) string {
	r.mu.Lock()
	b := r.boxes[id]
	r.mu.Unlock()
	if b == nil {
		return ""
	}
	return b.logs.String()
}

var _ runtime.Runtime = (*InProcess)(nil)

// logTail keeps the last logTailMax bytes written to it.
type logTail struct {
	mu sync.Mutex
	b  []byte
}

const logTailMax = 64 << 10

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if over := len(l.b) - logTailMax; over > 0 {
		l.b = l.b[over:]
		if i := bytes.IndexByte(l.b, '\n'); i >= 0 {
			l.b = l.b[i+1:]
		}
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}
