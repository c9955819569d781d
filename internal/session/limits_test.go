package session

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/store"
)

func withLimits(m *Manager, per map[string]Limits) {
	m.opt.Limits = func(tenant string) Limits { return per[tenant] }
}

func TestSessionQuotas(t *testing.T) {
	m := newManager(t, runtimetest.NewFake())
	withLimits(m, map[string]Limits{"small": {Sessions: 5, DiskMB: 1000}})
	ctx := context.Background()

	// Twenty creates at once: exactly five get a session.
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := m.Create(ctx, "small", CreateRequest{ID: fmt.Sprintf("s%d", i), Resources: Resources{DiskMB: 100}})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, errdefs.ErrResourceExhausted):
				refused.Add(1)
			default:
				t.Errorf("create: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 5 || refused.Load() != 15 {
		t.Fatalf("%d created, %d refused; want 5 and 15", ok.Load(), refused.Load())
	}
	// Creating one that exists costs nothing and is not refused.
	list, _, err := m.List(ctx, store.SessionFilter{Tenant: "small", Status: api.StatusRunning})
	if err != nil || len(list) != 5 {
		t.Fatalf("list: %d, %v", len(list), err)
	}
	if _, created, err := m.Create(ctx, "small", CreateRequest{ID: list[0].ID}); err != nil || created {
		t.Errorf("create of an existing session at the limit: created %v, %v", created, err)
	}
	// Another tenant is not held by this one's limits.
	if _, _, err := m.Create(ctx, "other", CreateRequest{ID: "x"}); err != nil {
		t.Errorf("another tenant: %v", err)
	}
	// A deleted session frees its place; the disk sum holds too.
	if _, err := m.Delete(ctx, "small", list[0].ID); err != nil {
		t.Fatal(err)
	}
	_, _, err = m.Create(ctx, "small", CreateRequest{ID: "big", Resources: Resources{DiskMB: 700}})
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("400 MB in use, 700 more, limit 1000: %v", err)
	}
	if _, _, err := m.Create(ctx, "small", CreateRequest{ID: "fits", Resources: Resources{DiskMB: 600}}); err != nil {
		t.Errorf("400 MB in use, 600 more, limit 1000: %v", err)
	}
}

func TestSandboxQuotas(t *testing.T) {
	rt := runtimetest.NewFake()
	m := newManager(t, rt)
	withLimits(m, map[string]Limits{"t": {Sandboxes: 2, MemoryMB: 1500, CPU: 1.5}})
	ctx := context.Background()
	mk := func(tenant, id string, mem int64, cpu float64) *Session {
		s, _, err := m.Create(ctx, tenant, CreateRequest{ID: id, Resources: Resources{MemoryMB: mem, CPU: cpu}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	live := func(s *Session) {
		attach(t, m, rt, s.Tenant, s.ID)
		e := m.entry(key{s.Tenant, s.ID})
		e.setRes(s.Config.Resources.MemoryMB, s.Config.Resources.CPU)
	}
	a := mk("t", "a", 1000, 1)
	live(a)
	for _, tc := range []struct {
		name     string
		mem      int64
		cpu      float64
		exceeded bool
	}{
		{"fits", 500, 0.5, false},
		{"memory", 600, 0.5, true},
		{"cpu", 256, 0.6, true},
	} {
		s := mk("t", tc.name, tc.mem, tc.cpu)
		err := m.admission.admitSandbox(s)
		if got := errors.Is(err, errdefs.ErrResourceExhausted); got != tc.exceeded {
			t.Errorf("%s: admit = %v, want exceeded %v", tc.name, err, tc.exceeded)
		}
	}
	b := mk("t", "b", 256, 0.25)
	live(b)
	// Two live: a third is refused by kick itself, with a message naming
	// the limit, and nothing starts.
	c := mk("t", "c", 64, 0.1)
	_, err := m.starts.kick(m.entry(key{"t", "c"}), c)
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("third sandbox: %v", err)
	}
	t.Logf("refused: %v", err)
	if st := m.entry(key{"t", "c"}); st.slot.State() != sandbox.SlotNone {
		t.Errorf("a refused start left state %s", st.slot.State())
	}
	// Another tenant is unaffected.
	o := mk("o", "x", 4096, 4)
	if err := m.admission.admitSandbox(o); err != nil {
		t.Errorf("another tenant: %v", err)
	}
}

func TestHistoryLimit(t *testing.T) {
	m := newManager(t, runtimetest.NewFake())
	withLimits(m, map[string]Limits{"t": {History: 7}})
	if m.Limits("t").History != 7 || m.Limits("u").History != 0 {
		t.Errorf("History = %d, %d", m.Limits("t").History, m.Limits("u").History)
	}
}

func TestSnapshotLimit(t *testing.T) {
	m := newManager(t, runtimetest.NewFake())
	withLimits(m, map[string]Limits{"t": {Snapshots: 2}})
	ctx := context.Background()
	if _, _, err := m.Create(ctx, "t", CreateRequest{ID: "s"}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 2 {
		snap, err := m.Snapshots().Create(ctx, "t", "s")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, snap.ID)
	}
	if _, err := m.Snapshots().Create(ctx, "t", "s"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("third snapshot: %v, want the limit", err)
	}
	if err := m.Snapshots().Delete(ctx, "t", "s", ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshots().Create(ctx, "t", "s"); err != nil {
		t.Errorf("a snapshot after deleting one: %v", err)
	}
}

// What a tenant keeps in the blob store is counted from the blob store
// and bounded: snapshots are refused at the limit until the collector has
// removed what deleted ones held, and other tenants are not affected.
func TestStoredLimit(t *testing.T) {
	m := newManager(t, runtimetest.NewFake())
	withLimits(m, map[string]Limits{"t": {StoredMB: 4}, "u": {StoredMB: 4}})
	ctx := context.Background()
	for _, tenant := range []string{"t", "u"} {
		if _, _, err := m.Create(ctx, tenant, CreateRequest{ID: "s"}); err != nil {
			t.Fatal(err)
		}
	}
	fill := func(tenant, name string) {
		t.Helper()
		b := make([]byte, 3<<20)
		rand.Read(b)
		if err := os.WriteFile(filepath.Join(filepath.Join(m.opt.WorkspaceDir, tenant, "s"), name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for i := range 2 { // 3 MiB stored, then 6: the second is let in under the limit
		fill("t", fmt.Sprint(i))
		snap, err := m.Snapshots().Create(ctx, "t", "s")
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		ids = append(ids, snap.ID)
	}
	if n, err := m.Stored().Bytes(ctx, "t"); err != nil || n < 6<<20 || n > 7<<20 {
		t.Errorf("stored: %d bytes, %v; want 6 MiB and a manifest", n, err)
	}
	_, err := m.Snapshots().Create(ctx, "t", "s")
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "stored") {
		t.Fatalf("a snapshot past the limit: %v", err)
	}
	fill("u", "0")
	if _, err := m.Snapshots().Create(ctx, "u", "s"); err != nil {
		t.Errorf("another tenant's snapshot: %v", err)
	}
	// A fresh count from the blob store (another server's, or after a
	// restart) says the same.
	m.Stored().Collected()
	if _, err := m.Snapshots().Create(ctx, "t", "s"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a snapshot past the limit, counted afresh: %v", err)
	}
	for _, id := range ids {
		if err := m.Snapshots().Delete(ctx, "t", "s", id); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(filepath.Join(m.opt.WorkspaceDir, "t", "s"), "0")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.opt.Snapshots.Collect(ctx, 0); err != nil {
		t.Fatal(err)
	}
	m.Stored().Collected()
	if _, err := m.Snapshots().Create(ctx, "t", "s"); err != nil {
		t.Errorf("a snapshot once collected: %v", err)
	}
}

// A session's snapshots are listed by id (which is by time), and go with
// the session.
func TestSnapshotsListedAndDropped(t *testing.T) {
	m := newManager(t, runtimetest.NewFake())
	ctx := context.Background()
	if _, _, err := m.Create(ctx, "t", CreateRequest{ID: "s"}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 3 {
		snap, err := m.Snapshots().Create(ctx, "t", "s")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, snap.ID)
	}
	slices.Sort(ids)
	list, err := m.Snapshots().List(ctx, "t", "s")
	var got []string
	for _, s := range list {
		got = append(got, s.ID)
	}
	if err != nil || !slices.Equal(got, ids) {
		t.Errorf("Snapshots = %v, %v; want %v", got, err, ids)
	}
	count := func() (n int) {
		m.opt.Snapshots.List(ctx, "t/s/", func(blob.Info) error { n++; return nil })
		return n
	}
	if n := count(); n != 3 {
		t.Fatalf("%d manifests before the session's delete", n)
	}
	if _, err := m.Delete(ctx, "t", "s"); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Errorf("%d snapshots left after the session's delete", n)
	}
}

// The disk quotas of every tenant's sessions together stay within what
// the workspace file system backs (DiskCapacityMB), whatever each
// tenant's own limit says: creates from many tenants at once never pass
// it, a refusal is 429 (retryable: a delete frees room), and terminated
// sessions free their share.
func TestDiskCapacity(t *testing.T) {
	m := newManager(t, runtimetest.NewFake(), func(o *Options) { o.DiskCapacityMB = 1000 })
	ctx := context.Background()
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := m.Create(ctx, fmt.Sprintf("t%d", i), CreateRequest{ID: "s", Resources: Resources{DiskMB: 300}})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, errdefs.ErrResourceExhausted):
				if !strings.Contains(err.Error(), "workspace file system backs 1000 MiB") {
					t.Errorf("refusal does not say why: %v", err)
				}
				refused.Add(1)
			default:
				t.Errorf("create: %v", err)
			}
		}()
	}
	wg.Wait()
	// Three of 300 fit in 1000; a create may be refused while another
	// finishes recording, never let past the bound.
	if u, err := m.opt.Store.TotalUsage(ctx); err != nil || u.DiskMB > 1000 || ok.Load() < 1 || ok.Load() > 3 || ok.Load()+refused.Load() != 20 {
		t.Fatalf("%d created (%+v, %v), %d refused; want at most 1000 MiB promised", ok.Load(), u, err, refused.Load())
	}
	u, _ := m.opt.Store.TotalUsage(ctx)
	room := 1000 - u.DiskMB
	if _, _, err := m.Create(ctx, "late", CreateRequest{ID: "fits", Resources: Resources{DiskMB: room}}); err != nil {
		t.Fatalf("a session for the %d MiB left: %v", room, err)
	}
	if _, _, err := m.Create(ctx, "late", CreateRequest{ID: "over", Resources: Resources{DiskMB: 16}}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("past the file system: %v", err)
	}
	if _, err := m.Delete(ctx, "late", "fits"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Create(ctx, "late", CreateRequest{ID: "over", Resources: Resources{DiskMB: 16}}); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
}
