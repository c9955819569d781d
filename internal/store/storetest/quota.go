package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/store"
)

func testTenantUsage(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if u, err := s.TenantUsage(ctx, "t1"); err != nil || u != (store.TenantUsage{}) {
		t.Errorf("TenantUsage of an empty store = %+v, %v", u, err)
	}
	if u, err := s.TotalUsage(ctx); err != nil || u != (store.TenantUsage{}) {
		t.Errorf("TotalUsage of an empty store = %+v, %v", u, err)
	}
	for i, c := range []struct {
		tenant, status string
		disk           int64
	}{{"t1", "running", 100}, {"t1", "paused", 50}, {"t1", "terminated", 1000}, {"t1", "hibernated", 7}, {"t2", "running", 400}} {
		sess := newSession(c.tenant, fmt.Sprintf("s-%d", i), t0)
		sess.Status, sess.DiskMB = c.status, c.disk
		if err := s.CreateSession(ctx, sess); err != nil {
			t.Fatal(err)
		}
	}
	// Terminated sessions and other tenants' do not count.
	if u, err := s.TenantUsage(ctx, "t1"); err != nil || u != (store.TenantUsage{Sessions: 3, DiskMB: 157}) {
		t.Errorf("TenantUsage(t1) = %+v, %v; want 3 sessions, 157 MB", u, err)
	}
	// Every tenant's, but for the terminated.
	if u, err := s.TotalUsage(ctx); err != nil || u != (store.TenantUsage{Sessions: 4, DiskMB: 557}) {
		t.Errorf("TotalUsage = %+v, %v; want 4 sessions, 557 MB", u, err)
	}
	// DiskMB round-trips and follows updates.
	got, err := s.GetSession(ctx, "t2", "s-4")
	if err != nil || got.DiskMB != 400 {
		t.Fatalf("GetSession: DiskMB %v, %v", got, err)
	}
	got.Status = "terminated"
	if err := s.UpdateSession(ctx, got); err != nil {
		t.Fatal(err)
	}
	if u, err := s.TenantUsage(ctx, "t2"); err != nil || u != (store.TenantUsage{}) {
		t.Errorf("TenantUsage(t2) after terminating its session = %+v, %v", u, err)
	}
	if u, err := s.TotalUsage(ctx); err != nil || u != (store.TenantUsage{Sessions: 3, DiskMB: 157}) {
		t.Errorf("TotalUsage after terminating t2's session = %+v, %v", u, err)
	}
}

func testTrimExecutions(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if _, err := s.TrimExecutions(ctx, "t1", "s1", 0); err == nil {
		t.Error("TrimExecutions with keep 0 succeeded")
	}
	statuses := []string{"completed", "running", "failed", "completed", "pending", "completed", "timeout", "completed"}
	for i, st := range statuses {
		x := newExecution("t1", fmt.Sprintf("x%d", i), "s1", t0.Add(time.Duration(i)*time.Second))
		x.Status = st
		if err := s.CreateExecution(ctx, x); err != nil {
			t.Fatal(err)
		}
		// Another session's and another tenant's are not touched.
		for _, o := range []*store.Execution{newExecution("t1", fmt.Sprintf("o%d", i), "s2", t0), newExecution("t2", fmt.Sprintf("p%d", i), "s1", t0)} {
			o.Status = "completed"
			if err := s.CreateExecution(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Keep the newest 3 (x7, x6, x5); of the older ones, x4 (pending) and
	// x1 (running) stay.
	n, err := s.TrimExecutions(ctx, "t1", "s1", 3)
	if err != nil || n != 3 {
		t.Fatalf("TrimExecutions = %d, %v; want 3 removed", n, err)
	}
	page, _, err := s.ListExecutions(ctx, "t1", "s1", 100, "")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range page {
		ids = append(ids, x.ID)
	}
	if fmt.Sprint(ids) != "[x7 x6 x5 x4 x1]" {
		t.Errorf("left %v, want [x7 x6 x5 x4 x1]", ids)
	}
	for _, k := range [][2]string{{"t1", "s2"}, {"t2", "s1"}} {
		if page, _, err := s.ListExecutions(ctx, k[0], k[1], 100, ""); err != nil || len(page) != len(statuses) {
			t.Errorf("%s/%s has %d executions (%v), want %d", k[0], k[1], len(page), err, len(statuses))
		}
	}
	// Fewer than keep: nothing to do.
	if n, err := s.TrimExecutions(ctx, "t1", "s1", 100); err != nil || n != 0 {
		t.Errorf("TrimExecutions(keep 100) = %d, %v", n, err)
	}
}
