package session

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
)

// Held lists the running and paused sandboxes this process holds, and
// SandboxOf says what a session has, tenant by tenant; the sandboxes
// destroyed are heard of first.
func TestHeldAndSandboxOf(t *testing.T) {
	rt := runtimetest.NewFake()
	var mu sync.Mutex
	var destroyed []string
	m := newManager(t, rt, func(o *Options) {
		o.Destroying = func(_ context.Context, r runtime.Runtime, id string) {
			if _, err := r.(runtime.StatsReader).Stats(context.Background(), id); err != nil {
				t.Errorf("Destroying %s: the sandbox cannot be read any more: %v", id, err)
			}
			mu.Lock()
			destroyed = append(destroyed, id)
			mu.Unlock()
		}
	})
	ctx := context.Background()
	withSandbox(t, m, rt, "s1")
	if _, _, err := m.Create(ctx, "t", CreateRequest{ID: "s2"}); err != nil {
		t.Fatal(err)
	}
	held := m.Held()
	want := SandboxRef{Tenant: "t", Session: "s1", ID: "sbx-s1", Runtime: rt, Volume: "t/s1"}
	if len(held) != 1 || held[0] != want {
		t.Fatalf("held: %+v, want only %+v", held, want)
	}

	check := func(tenant, id, wantState string, wantRef bool) {
		t.Helper()
		_, state, ref, err := m.SandboxOf(ctx, tenant, id)
		if err != nil || state != wantState || (ref != nil) != wantRef {
			t.Errorf("SandboxOf(%s, %s): %s, %+v, %v; want %s (a sandbox to read: %v)", tenant, id, state, ref, err, wantState, wantRef)
		}
	}
	check("t", "s1", api.SandboxRunning, true)
	check("t", "s2", api.SandboxNone, false)
	if _, _, _, err := m.SandboxOf(ctx, "other", "s1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's session: %v, want ErrNotFound", err)
	}

	if _, err := m.Pause(ctx, "t", "s1"); err != nil {
		t.Fatal(err)
	}
	if held = m.Held(); len(held) != 1 || !held[0].Paused {
		t.Errorf("held after a pause: %+v, want s1 paused", held)
	}
	check("t", "s1", api.SandboxPaused, true)

	if _, err := m.Hibernate(ctx, "t", "s1"); err != nil {
		t.Fatal(err)
	}
	if held = m.Held(); len(held) != 0 {
		t.Errorf("held after hibernation: %+v, want none", held)
	}
	check("t", "s1", SandboxHibernated, false)
	mu.Lock()
	if !slices.Equal(destroyed, []string{"sbx-s1"}) {
		t.Errorf("destroyed: %v, want sbx-s1 heard of", destroyed)
	}
	mu.Unlock()

	withSandbox(t, m, rt, "s3")
	if _, err := m.Delete(ctx, "t", "s3"); err != nil {
		t.Fatal(err)
	}
	check("t", "s3", api.SandboxNone, false)
	mu.Lock()
	if !slices.Equal(destroyed, []string{"sbx-s1", "sbx-s3"}) {
		t.Errorf("destroyed: %v, want sbx-s3 heard of too", destroyed)
	}
	mu.Unlock()
}

// A replica that does not hold a session's sandbox reads the one the
// record names (same host), and lets its own older one go for it.
func TestSandboxOfElsewhere(t *testing.T) {
	rt := runtimetest.NewFake()
	a, b := twoReplicas(t, rt)
	ctx := context.Background()
	withSandbox(t, a, rt, "s")
	if len(b.Held()) != 0 {
		t.Errorf("b holds %+v, having served no call", b.Held())
	}
	_, state, ref, err := b.SandboxOf(ctx, "t", "s")
	if err != nil || state != api.SandboxRunning || ref == nil || ref.ID != "sbx-s" || ref.Runtime != rt || ref.Paused {
		t.Fatalf("SandboxOf through b: %s, %+v, %v; want sbx-s running", state, ref, err)
	}
	if _, err := a.Pause(ctx, "t", "s"); err != nil {
		t.Fatal(err)
	}
	if _, state, ref, err = b.SandboxOf(ctx, "t", "s"); err != nil || state != api.SandboxPaused || ref == nil || !ref.Paused {
		t.Errorf("SandboxOf through b after a pause in a: %s, %+v, %v; want paused", state, ref, err)
	}

	// b holds an older sandbox than the record names: the record wins.
	attach(t, b, rt, "t", "s")
	rec, err := a.opt.Store.GetSession(ctx, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	rt.Add("sbx-new")
	rec.SandboxID, rec.Status = "sbx-new", api.StatusRunning
	if err := a.write(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, state, ref, err = b.SandboxOf(ctx, "t", "s"); err != nil || state != api.SandboxRunning || ref == nil || ref.ID != "sbx-new" {
		t.Errorf("SandboxOf through b, holding an older sandbox: %s, %+v, %v; want sbx-new", state, ref, err)
	}
}
