package session

import (
	"context"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
)

// noPause is a fake runtime that says it cannot freeze a sandbox, as a
// runtime of Pods cannot.
func noPause() *runtimetest.Fake {
	rt := runtimetest.NewFake()
	rt.Declare(runtime.Capabilities{Stats: true})
	return rt
}

// An idle session on a runtime that cannot pause is hibernated at its
// idle timeout, not paused: a paused sandbox would hold as much as a
// running one. Its sandbox is never asked to freeze.
func TestIdleWithoutPauseHibernates(t *testing.T) {
	rt := noPause()
	m := newManager(t, rt)
	ctx := context.Background()
	if _, _, err := m.Create(ctx, "t", CreateRequest{ID: "s", IdleTimeout: 60 * time.Second, HibernateTimeout: 600 * time.Second, TTL: 3600 * time.Second}); err != nil {
		t.Fatal(err)
	}
	attach(t, m, rt, "t", "s")
	if got := m.Reaper().Pass(ctx, time.Now().Add(61*time.Second)); got != 1 {
		t.Fatalf("the reaper acted on %d sessions at the idle timeout, want 1", got)
	}
	if s, err := m.Get(ctx, "t", "s"); err != nil || s.Status != api.StatusHibernated {
		t.Fatalf("after the idle timeout: %v; want hibernated", statusOf(s, err))
	}
	if n := rt.Calls("Pause") + rt.Calls("Resume"); n != 0 {
		t.Errorf("the runtime that cannot pause was asked to pause or resume %d times", n)
	}
	if rt.Len() != 0 {
		t.Errorf("%d sandboxes left after hibernation", rt.Len())
	}
}

// The same idle session on a runtime that can pause is paused, as
// before: the fallback is for runtimes without the capability only.
func TestIdleWithPausePauses(t *testing.T) {
	rt := runtimetest.NewFake()
	m := newManager(t, rt)
	ctx := context.Background()
	if _, _, err := m.Create(ctx, "t", CreateRequest{ID: "s", IdleTimeout: 60 * time.Second, HibernateTimeout: 600 * time.Second, TTL: 3600 * time.Second}); err != nil {
		t.Fatal(err)
	}
	attach(t, m, rt, "t", "s")
	m.Reaper().Pass(ctx, time.Now().Add(61*time.Second))
	if s, err := m.Get(ctx, "t", "s"); err != nil || s.Status != api.StatusPaused || rt.Count(runtime.StatePaused) != 1 {
		t.Fatalf("after the idle timeout: %v, %d frozen; want paused", statusOf(s, err), rt.Count(runtime.StatePaused))
	}
}

// A pause asked for on a runtime that cannot freeze keeps the session's
// sandbox, unfrozen, and marks the session paused; resuming uses it
// again. The runtime is never asked to pause or resume.
func TestPauseWithoutPauser(t *testing.T) {
	rt := noPause()
	m := newManager(t, rt)
	ctx := context.Background()
	withSandbox(t, m, rt, "s")
	s, err := m.Pause(ctx, "t", "s")
	if err != nil || s.Status != api.StatusPaused {
		t.Fatalf("pause: %v", statusOf(s, err))
	}
	if _, state, _, err := m.SandboxOf(ctx, "t", "s"); err != nil || state != api.SandboxPaused {
		t.Errorf("sandbox after pause: %s, %v; want paused", state, err)
	}
	if rt.Count(runtime.StateRunning) != 1 {
		t.Errorf("the sandbox is not kept: %d running", rt.Count(runtime.StateRunning))
	}
	s, err = m.Resume(ctx, "t", "s")
	if err != nil || s.Status != api.StatusRunning {
		t.Fatalf("resume: %v", statusOf(s, err))
	}
	if _, state, _, err := m.SandboxOf(ctx, "t", "s"); err != nil || state != api.SandboxRunning {
		t.Errorf("sandbox after resume: %s, %v; want running", state, err)
	}
	if n := rt.Calls("Pause") + rt.Calls("Resume"); n != 0 {
		t.Errorf("the runtime that cannot pause was asked to pause or resume %d times", n)
	}
}

// statusOf is a session's status, or the error that came instead.
func statusOf(s *Session, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return s.Status
}
