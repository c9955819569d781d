package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

func newManager(t testing.TB, rt runtime.Runtime, configure ...func(*Options)) *Manager {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	blobs, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	me := workspace.Owner{UID: os.Getuid(), GID: os.Getgid()}
	opt := Options{
		Store: st, Templates: template.NewStore(filepath.Join(dir, "templates")),
		Runtime:      func(string) (runtime.Runtime, error) { return rt, nil },
		WorkspaceDir: filepath.Join(dir, "workspaces"), Owners: workspace.Owners{Root: me, User: me},
		Snapshots: snapshot.New(blobs, "snapshots", snapshot.Limits{}), ReapBatch: 256,
	}
	for _, f := range configure {
		f(&opt)
	}
	m := New(opt)
	t.Cleanup(m.Close)
	return m
}

// attach gives a session a (fake) running sandbox, as a start would.
func attach(t testing.TB, m *Manager, rt *runtimetest.Fake, tenant, id string) {
	t.Helper()
	ctx := context.Background()
	k := key{tenant, id}
	sbid := "sbx-" + id
	rt.Add(sbid)
	e := m.entry(k)
	e.mu.Lock()
	err := e.slot.Move(sandbox.SlotRunning, sandbox.Attach(rt, sbid), nil)
	e.unlock()
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := m.locks.lock(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	rec, err := m.opt.Store.GetSession(ctx, tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	rec.SandboxID = sbid
	if err := m.save(ctx, rec); err != nil {
		t.Fatal(err)
	}
}

func TestTransitions(t *testing.T) {
	for from, tos := range transitions {
		for _, to := range []string{api.StatusPending, api.StatusRunning, api.StatusPaused, api.StatusHibernated, api.StatusError, api.StatusTerminated} {
			allowed := from == to
			for _, x := range tos {
				allowed = allowed || x == to
			}
			if canMove(from, to) != allowed {
				t.Errorf("canMove(%s, %s) = %v", from, to, !allowed)
			}
		}
	}
	if canMove(api.StatusTerminated, api.StatusRunning) || canMove(api.StatusHibernated, api.StatusPaused) {
		t.Error("a terminated session came back, or a hibernated one was paused")
	}
	err := error(&TransitionError{Session: "s", From: api.StatusHibernated, To: api.StatusPaused})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("%v is not ErrFailedPrecondition", err)
	}
}

func TestLifecycleWithoutSandbox(t *testing.T) {
	m := newManager(t, runtimetest.NewFake())
	ctx := context.Background()
	s, created, err := m.Create(ctx, "t", CreateRequest{ID: "s"})
	if err != nil || !created || s.Status != api.StatusRunning || s.SandboxState != api.SandboxNone {
		t.Fatalf("create: %+v %v %v", s, created, err)
	}
	if s.DueAt.IsZero() || !s.DueAt.Equal(s.LastActivityAt.Add(DefaultHibernateTimeout)) {
		t.Errorf("a session without a sandbox is due at %v, want its hibernate timeout after %v", s.DueAt, s.LastActivityAt)
	}
	f, err := m.OpenFiles(ctx, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Hibernate(ctx, "t", "s"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("hibernate during a file call: %v, want failed precondition", err)
	}
	if err := os.WriteFile(filepath.Join(m.opt.WorkspaceDir, "t", "s", "kept.txt"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if s, err = m.Hibernate(ctx, "t", "s"); err != nil || s.Status != api.StatusHibernated {
		t.Fatalf("hibernate: %+v %v", s, err)
	}
	if _, err := m.Pause(ctx, "t", "s"); !errors.As(err, new(*TransitionError)) {
		t.Errorf("pause of a hibernated session: %v, want a TransitionError", err)
	}
	f, err = m.OpenFiles(ctx, "t", "s")
	if err != nil || f.Session.Status != api.StatusRunning {
		t.Fatalf("file call on a hibernated session: %+v %v", f, err)
	}
	b, err := os.ReadFile(filepath.Join(m.opt.WorkspaceDir, "t", "s", "kept.txt"))
	f.Close()
	if string(b) != "kept" {
		t.Errorf("after hibernation: %q %v", b, err)
	}
}

// The reaper over 1,000 sessions: bounded batches, every due session
// handled, and the right action for each state.
func TestReaperThousandSessions(t *testing.T) {
	rt := runtimetest.NewFake()
	m := newManager(t, rt)
	var (
		mu     sync.Mutex
		passes []time.Duration
	)
	m.opt.Reaped = func(d time.Duration, n int) {
		mu.Lock()
		passes = append(passes, d)
		mu.Unlock()
	}
	ctx := context.Background()
	const n, withSandbox = 1000, 600
	for i := range n {
		id := fmt.Sprintf("s%04d", i)
		if _, _, err := m.Create(ctx, "t", CreateRequest{ID: id, IdleTimeout: 60 * time.Second, HibernateTimeout: 120 * time.Second, TTL: 300 * time.Second}); err != nil {
			t.Fatal(err)
		}
		if i < withSandbox {
			attach(t, m, rt, "t", id)
		}
	}
	base := time.Now()
	reapAll := func(at time.Duration) (acted, rounds int) {
		for {
			k := m.Reaper().Pass(ctx, base.Add(at))
			if k == 0 {
				return acted, rounds
			}
			acted += k
			rounds++
		}
	}
	// Nothing is due yet.
	if got := m.Reaper().Pass(ctx, base.Add(30*time.Second)); got != 0 {
		t.Errorf("%d sessions acted on before any timeout", got)
	}
	// One session is busy: the reaper leaves it.
	lease, err := m.Acquire(ctx, "t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	acted, rounds := reapAll(61 * time.Second)
	if acted != withSandbox-1 || rt.Count(runtime.StatePaused) != withSandbox-1 || rounds < (withSandbox-1)/m.opt.ReapBatch {
		t.Errorf("idle pass: acted on %d in %d passes, %d paused; want %d", acted, rounds, rt.Count(runtime.StatePaused), withSandbox-1)
	}
	counts, _ := m.opt.Store.CountSessions(ctx)
	if counts[api.StatusPaused] != withSandbox-1 || counts[api.StatusRunning] != n-withSandbox+1 {
		t.Errorf("after the idle pass: %v", counts)
	}
	lease.Release()

	// The busy one is paused first, then all are hibernated. Its release
	// was its last activity, however long the passes above took (seconds
	// under -race): the clock of this pass counts from it.
	acted, _ = reapAll(time.Since(base) + 121*time.Second)
	counts, _ = m.opt.Store.CountSessions(ctx)
	if counts[api.StatusHibernated] != n || acted != n+1 {
		t.Errorf("hibernate pass: acted on %d; %v", acted, counts)
	}
	if left := rt.Len(); left != 0 {
		t.Errorf("%d sandboxes left after hibernation", left)
	}
	acted, _ = reapAll(301 * time.Second)
	counts, _ = m.opt.Store.CountSessions(ctx)
	if counts[api.StatusTerminated] != n || acted != n {
		t.Errorf("expiry pass: acted on %d; %v", acted, counts)
	}
	mu.Lock()
	var longest time.Duration
	for _, d := range passes {
		longest = max(longest, d)
	}
	t.Logf("%d passes, the longest %v", len(passes), longest)
	mu.Unlock()
}

// The reaper skips a session whose lock a request holds: it never waits
// on a handler.
func TestReaperSkipsLockedSessions(t *testing.T) {
	rt := runtimetest.NewFake()
	m := newManager(t, rt)
	ctx := context.Background()
	m.Create(ctx, "t", CreateRequest{ID: "held", IdleTimeout: 1 * time.Second})
	attach(t, m, rt, "t", "held")
	unlock, err := m.locks.lock(ctx, key{"t", "held"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() { done <- m.Reaper().Pass(ctx, time.Now().Add(time.Minute)) }()
	select {
	case got := <-done:
		if got != 0 {
			t.Errorf("acted on a locked session")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reaper waited on a session's lock")
	}
	unlock()
	if got := m.Reaper().Pass(ctx, time.Now().Add(time.Minute)); got != 1 {
		t.Errorf("acted on %d sessions once the lock was free, want 1", got)
	}
}

// heldBlobs is a blob store whose manifest writes wait until release is
// closed, announcing each on held: a snapshot that takes as long as a
// test likes.
type heldBlobs struct {
	blob.Store
	held    chan struct{}
	release chan struct{}
}

func (h *heldBlobs) Put(ctx context.Context, key string, r io.Reader) (int64, error) {
	if strings.Contains(key, "/manifests/") {
		h.held <- struct{}{}
		<-h.release
	}
	return h.Store.Put(ctx, key, r)
}

// A snapshot in progress holds its own session only: counting the
// server's sandboxes (every start and /metrics does) does not wait for it.
func TestSnapshotDoesNotBlockCounts(t *testing.T) {
	rt := runtimetest.NewFake()
	blobs, err := blobfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	held := &heldBlobs{Store: blobs, held: make(chan struct{}), release: make(chan struct{})}
	m := newManager(t, rt, func(o *Options) { o.Snapshots = snapshot.New(held, "snapshots", snapshot.Limits{}) })
	ctx := context.Background()
	for _, id := range []string{"slow", "other"} {
		if _, _, err := m.Create(ctx, "t", CreateRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
		attach(t, m, rt, "t", id)
	}
	done := make(chan error, 1)
	go func() {
		_, err := m.Snapshots().Create(ctx, "t", "slow")
		done <- err
	}()
	<-held.held // the snapshot is writing its manifest now
	counted := make(chan map[string]int, 1)
	go func() { counted <- m.SandboxCounts() }()
	select {
	case c := <-counted:
		if c[api.SandboxRunning]+c[api.SandboxPaused] != 2 {
			t.Errorf("counts during a snapshot: %v, want 2 sandboxes", c)
		}
	case <-time.After(10 * time.Second):
		t.Error("SandboxCounts waited for another session's snapshot")
	}
	close(held.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c := m.SandboxCounts(); c[api.SandboxRunning] != 2 || rt.Count(runtime.StateRunning) != 2 {
		t.Errorf("after the snapshot: %v, %d running; want both thawed", c, rt.Count(runtime.StateRunning))
	}
}

// A workspace past the snapshot limits cannot be hibernated, and the
// session goes on as it was: sandbox running, files in place.
func TestHibernateRefusedKeepsSession(t *testing.T) {
	rt := runtimetest.NewFake()
	blobs, err := blobfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(t, rt, func(o *Options) { o.Snapshots = snapshot.New(blobs, "snapshots", snapshot.Limits{MaxEntries: 10}) })
	ctx := context.Background()
	if _, _, err := m.Create(ctx, "t", CreateRequest{ID: "big"}); err != nil {
		t.Fatal(err)
	}
	attach(t, m, rt, "t", "big")
	dir := filepath.Join(m.opt.WorkspaceDir, "t", "big")
	for i := range 20 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Hibernate(ctx, "t", "big"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("hibernate: %v, want ErrResourceExhausted", err)
	}
	s, err := m.Get(ctx, "t", "big")
	if err != nil || s.Status != api.StatusRunning || s.SandboxState != api.SandboxRunning || rt.Count(runtime.StateRunning) != 1 {
		t.Errorf("after a refused hibernation: %+v %v; %d sandboxes running", s, err, rt.Count(runtime.StateRunning))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f19")); string(b) != "x" {
		t.Errorf("a file after a refused hibernation: %q %v", b, err)
	}
}
