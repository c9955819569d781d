package session

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// replicas returns two managers that serve the same sessions: one store,
// one workspace directory, one runtime, as replicas on one host do.
func twoReplicas(t *testing.T, rt *runtimetest.Fake) (a, b *Manager) {
	t.Helper()
	a = newManager(t, rt, func(o *Options) { o.Replica = "a" })
	b = newManager(t, rt, func(o *Options) {
		o.Replica = "b"
		o.Store, o.WorkspaceDir, o.Snapshots = a.opt.Store, a.opt.WorkspaceDir, a.opt.Snapshots
	})
	return a, b
}

// withSandbox creates session id of tenant t through m and gives it a
// (fake) running sandbox, sbx-ID, as a start would.
func withSandbox(t *testing.T, m *Manager, rt *runtimetest.Fake, id string) {
	t.Helper()
	if _, _, err := m.Create(context.Background(), "t", CreateRequest{ID: id}); err != nil {
		t.Fatal(err)
	}
	attach(t, m, rt, "t", id)
}

func TestReplicaLockIsExclusive(t *testing.T) {
	a, b := twoReplicas(t, runtimetest.NewFake())
	ctx := context.Background()
	k := key{"t", "s"}
	unlock, err := a.locks.lock(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.locks.tryLock(ctx, k); ok {
		t.Fatal("b took the lock a holds")
	}
	got, released := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(released)
		unlockB, err := b.locks.lock(ctx, k)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		close(got)
		unlockB()
	}()
	select {
	case <-got:
		t.Fatal("b took the lock a holds")
	case <-time.After(100 * time.Millisecond):
	}
	unlock()
	<-got
	<-released // b let go too
	if holder, live, err := a.opt.Store.LeaseHolder(ctx, leaseName("session", k)); err != nil || live {
		t.Fatalf("the lease is still held after both let go: %q %v %v", holder, live, err)
	}
	// A cancelled wait says why.
	unlock, _ = a.locks.lock(ctx, k)
	defer unlock()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := b.locks.lock(cctx, k); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lock with a context that ends: %v", err)
	}
}

// A session paused through one replica, whose sandbox another holds, is
// thawed by that other's next execution: the record decides.
func TestReplicaPauseElsewhere(t *testing.T) {
	rt := runtimetest.NewFake()
	a, b := twoReplicas(t, rt)
	ctx := context.Background()
	withSandbox(t, a, rt, "s")
	l, err := a.Acquire(ctx, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	l.Release()

	// b never held the sandbox: it adopts it to freeze it.
	s, err := b.Pause(ctx, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if s.Status != api.StatusPaused || rt.Count(runtime.StatePaused) != 1 {
		t.Fatalf("after b's pause: status %s, %d frozen", s.Status, rt.Count(runtime.StatePaused))
	}
	// a still thinks it running; its execution must not use it frozen.
	l, err = a.Acquire(ctx, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if rt.Count(runtime.StateRunning) != 1 || l.SandboxID != "sbx-s" {
		t.Fatalf("a's execution got %s with %d running", l.SandboxID, rt.Count(runtime.StateRunning))
	}
	if s, _ := b.Get(ctx, "t", "s"); s.Status != api.StatusRunning {
		t.Fatalf("status after a's execution: %s", s.Status)
	}
	// While a runs it, b's explicit pause is refused, as a's own would
	// be: the store has the execution (here: a's entry has it; b knows it
	// only from the store).
	if err := a.opt.Store.CreateExecution(ctx, &store.Execution{Tenant: "t", ID: "x1", SessionID: "s", Status: api.ExecRunning, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pause(ctx, "t", "s"); !errors.As(err, new(*TransitionError)) {
		t.Fatalf("pause with an execution running in another replica: %v", err)
	}
}

// The reaper's pause of an idle session gives way to activity written
// after it read the record: an execution elsewhere started in between.
func TestReplicaIdlePauseYieldsToActivity(t *testing.T) {
	rt := runtimetest.NewFake()
	a, b := twoReplicas(t, rt)
	ctx := context.Background()
	withSandbox(t, a, rt, "s")
	unlock, ok := b.locks.tryLock(ctx, key{"t", "s"})
	if !ok {
		t.Fatal("tryLock")
	}
	defer unlock()
	rec, err := b.opt.Store.GetSession(ctx, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.replicas.sync(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// a's execution confirms its sandbox without the lock.
	if err := a.replicas.confirm(ctx, a.entry(key{"t", "s"}), a.entry(key{"t", "s"}).slot.Held()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pauses.freeze(ctx, rec, true); !errors.As(err, new(*TransitionError)) {
		t.Fatalf("idle pause after activity: %v", err)
	}
	if rt.Count(runtime.StatePaused) != 0 {
		t.Fatal("the sandbox was frozen under a's execution")
	}
	if s, _ := a.Get(ctx, "t", "s"); s.Status != api.StatusRunning {
		t.Fatalf("status: %s", s.Status)
	}
}

// A sandbox another replica hibernated away is let go, not used: the
// record no longer names it.
func TestReplicaHibernateElsewhere(t *testing.T) {
	rt := runtimetest.NewFake()
	a, b := twoReplicas(t, rt)
	ctx := context.Background()
	withSandbox(t, a, rt, "s")
	if _, err := b.Hibernate(ctx, "t", "s"); err != nil {
		t.Fatal(err)
	}
	if n := rt.Count(runtime.StateRunning) + rt.Count(runtime.StatePaused); n != 0 {
		t.Fatalf("%d sandboxes left after hibernation", n)
	}
	e := a.entry(key{"t", "s"})
	if err := a.replicas.confirm(ctx, e, e.slot.Held()); !errors.Is(err, errStale) {
		t.Fatalf("confirm of a hibernated-away sandbox: %v", err)
	}
	// Under the lock a syncs: it lets the sandbox go and restores.
	s, err := a.wakeUp(ctx, key{"t", "s"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if s.Status != api.StatusRunning || s.SandboxState != api.SandboxNone {
		t.Fatalf("after a's wake-up: %s, sandbox %s", s.Status, s.SandboxState)
	}
	// Deleted through b, the session is gone for a too.
	if _, err := b.Delete(ctx, "t", "s"); err != nil {
		t.Fatal(err)
	}
	if err := a.replicas.touchIf(ctx, key{"t", "s"}, func(*store.Session) bool { return true }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("activity on a deleted session: %v", err)
	}
}

// A sandbox the record names that a replica does not hold is adopted
// when it is live, and cleared from the record when it is gone.
func TestReplicaAdoptOrClear(t *testing.T) {
	rt := runtimetest.NewFake()
	a, b := twoReplicas(t, rt)
	ctx := context.Background()
	for _, id := range []string{"live", "gone"} {
		withSandbox(t, a, rt, id)
	}
	rt.Destroy(ctx, "sbx-gone")
	for id, want := range map[string]string{"live": api.SandboxRunning, "gone": api.SandboxNone} {
		unlock, err := b.locks.lock(ctx, key{"t", id})
		if err != nil {
			t.Fatal(err)
		}
		rec, _ := b.opt.Store.GetSession(ctx, "t", id)
		err = b.replicas.sync(ctx, rec)
		unlock()
		if err != nil {
			t.Fatal(err)
		}
		s, _ := b.Get(ctx, "t", id)
		if s.SandboxState != want {
			t.Errorf("%s: b's sandbox state %s, want %s", id, s.SandboxState, want)
		}
		if id == "gone" && s.SandboxID != "" {
			t.Errorf("the record still names a gone sandbox: %q", s.SandboxID)
		}
	}
}

// The reaper's replica destroys what dead replicas started and no record
// names, and nothing else.
func TestReplicaSweep(t *testing.T) {
	rt := runtimetest.NewFake()
	a := newManager(t, rt, func(o *Options) {
		o.Replica, o.Instance = "a", "inst"
		o.Alive = func(_ context.Context, r string) (bool, error) { return r != "dead", nil }
	})
	ctx := context.Background()
	withSandbox(t, a, rt, "s") // sbx-s, recorded
	lab := func(replica string, kv ...string) map[string]string {
		l := map[string]string{sandbox.LabelInstance: "inst", sandbox.LabelReplica: replica}
		for i := 0; i < len(kv); i += 2 {
			l[kv[i]] = kv[i+1]
		}
		return l
	}
	rt.Labelled("sbx-s", lab("dead", sandbox.LabelTenant, "t", sandbox.LabelSession, "s"))
	rt.Labelled("unrecorded-start", lab("dead", sandbox.LabelTenant, "t", sandbox.LabelSession, "s"))
	rt.Labelled("dead-pool", lab("dead", sandbox.LabelPool, "python"))
	rt.Labelled("live-pool", lab("b", sandbox.LabelPool, "python"))
	rt.Labelled("other-instance", map[string]string{sandbox.LabelInstance: "other", sandbox.LabelReplica: "dead", sandbox.LabelPool: "python"})
	a.replicas.sweep(ctx)
	for id, want := range map[string]bool{"sbx-s": true, "unrecorded-start": false, "dead-pool": false, "live-pool": true, "other-instance": true} {
		if _, err := rt.Inspect(ctx, id); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", id, err == nil, want)
		}
	}
}

// A paused session whose sandbox is gone (a replica died between
// destroying it for a hibernation and recording that) wakes up without
// it, rather than failing every call on a thaw of nothing.
func TestWakeUpSandboxGone(t *testing.T) {
	rt := runtimetest.NewFake()
	a, b := twoReplicas(t, rt)
	ctx := context.Background()
	withSandbox(t, a, rt, "s")
	if _, err := b.Pause(ctx, "t", "s"); err != nil {
		t.Fatal(err)
	}
	rt.Destroy(ctx, "sbx-s")
	for _, m := range []*Manager{b, a} { // b held it frozen; a held it running
		s, err := m.wakeUp(ctx, key{"t", "s"}, false)
		if err != nil {
			t.Fatalf("%s: wake-up with the sandbox gone: %v", m.opt.Replica, err)
		}
		if s.Status != api.StatusRunning || s.SandboxID != "" || s.SandboxState != api.SandboxNone {
			t.Fatalf("%s: after the wake-up: %s, sandbox %q (%s)", m.opt.Replica, s.Status, s.SandboxID, s.SandboxState)
		}
	}
}

// A file call open through one replica keeps another replica's
// hibernation off the workspace, as an execution does: what the call
// writes would be lost with the hibernated directory. Once it is closed
// the hibernation goes through, and the file comes back with the restore.
func TestReplicaHibernateWaitsForFileCall(t *testing.T) {
	rt := runtimetest.NewFake()
	a, b := twoReplicas(t, rt)
	ctx := context.Background()
	withSandbox(t, a, rt, "s")
	f, err := b.OpenFiles(ctx, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Hibernate(ctx, "t", "s"); !errors.As(err, new(*TransitionError)) {
		t.Fatalf("hibernate during another replica's file call: %v, want a TransitionError", err)
	}
	if err := os.WriteFile(filepath.Join(b.opt.WorkspaceDir, "t", "s", "late.txt"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A pause leaves the files where they are: it may go on.
	if _, err := a.Pause(ctx, "t", "s"); err != nil {
		t.Fatalf("pause during another replica's file call: %v", err)
	}
	f.Close()
	if _, err := a.Hibernate(ctx, "t", "s"); err != nil {
		t.Fatalf("hibernate after the file call: %v", err)
	}
	f, err = b.OpenFiles(ctx, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(b.opt.WorkspaceDir, "t", "s", "late.txt")); err != nil || string(got) != "kept" {
		t.Fatalf("after hibernate and restore: %q, %v", got, err)
	}
	// A file call open holds one lease; with none open there is none.
	if names, err := a.opt.Store.LiveLeases(ctx, filesLeasePrefix(key{"t", "s"})); err != nil || len(names) != 1 {
		t.Fatalf("file leases with one call open: %q, %v", names, err)
	}
	f.Close()
	if names, err := a.opt.Store.LiveLeases(ctx, filesLeasePrefix(key{"t", "s"})); err != nil || len(names) != 0 {
		t.Fatalf("file leases with no call open: %q, %v", names, err)
	}
}

// Checkpoints of one session through two replicas take turns: an export
// taken while another replica's checkpoint is being written would be
// written after it, older over newer, without the checkpoint lock.
func TestReplicaCheckpointsTakeTurns(t *testing.T) {
	a, b := twoReplicas(t, runtimetest.NewFake())
	ctx := context.Background()
	k := key{"t", "s"}
	var mu sync.Mutex
	workspace, checkpoint := 1, 0 // versions
	inA, bIn := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		aDone <- a.checkpointed(ctx, k, func() error {
			mu.Lock()
			exported := workspace
			mu.Unlock()
			close(inA)
			// b's checkpoint gets in here, unless it waits for ours.
			select {
			case <-bIn:
			case <-time.After(300 * time.Millisecond):
			}
			mu.Lock()
			checkpoint = exported
			mu.Unlock()
			return nil
		})
	}()
	<-inA
	mu.Lock()
	workspace = 2 // an execution through b changed the workspace
	mu.Unlock()
	if err := b.checkpointed(ctx, k, func() error {
		close(bIn)
		mu.Lock()
		checkpoint = workspace
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if checkpoint != 2 {
		t.Fatalf("the checkpoint is version %d of the workspace, after version 2 was checkpointed", checkpoint)
	}
}
