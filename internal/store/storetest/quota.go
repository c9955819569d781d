package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
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

func testTrimTenantExecutions(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if _, _, err := s.TrimTenantExecutions(ctx, "t1", -1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("TrimTenantExecutions(-1) = %v, want invalid argument", err)
	}
	if n, kept, err := s.TrimTenantExecutions(ctx, "t1", 0); err != nil || n != 0 || kept != 0 {
		t.Errorf("TrimTenantExecutions of no executions = %d, %d, %v", n, kept, err)
	}
	// Records of 100 bytes each (request 40, result 60), over two
	// sessions, newest last; another tenant's alongside.
	statuses := []string{"completed", "running", "failed", "completed", "pending", "completed", "timeout", "completed"}
	for i, st := range statuses {
		x := newExecution("t1", fmt.Sprintf("x%d", i), fmt.Sprintf("s%d", i%2), t0.Add(time.Duration(i)*time.Second))
		x.Status = st
		x.Request = json.RawMessage(`{"code":"` + strings.Repeat("c", 29) + `"}`)
		x.Result = json.RawMessage(`{"stdout":"` + strings.Repeat("o", 47) + `"}`)
		if store.RecordBytes(x) != 100 {
			t.Fatalf("record of %d bytes, want 100", store.RecordBytes(x))
		}
		if err := s.CreateExecution(ctx, x); err != nil {
			t.Fatal(err)
		}
		o := newExecution("t2", fmt.Sprintf("p%d", i), "s0", t0)
		o.Status = "completed"
		if err := s.CreateExecution(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// Within the bound: nothing goes, and the size is told.
	if n, kept, err := s.TrimTenantExecutions(ctx, "t1", 800); err != nil || n != 0 || kept != 800 {
		t.Fatalf("TrimTenantExecutions(800) = %d, %d, %v; want 0 removed, 800 kept", n, kept, err)
	}
	// 350 bytes: x7, x6, x5 (300), then x4 (pending, 400) stays; x3 goes
	// with every finished one older (x2, x0); x1 (running) stays.
	n, kept, err := s.TrimTenantExecutions(ctx, "t1", 350)
	if err != nil || n != 3 || kept != 500 {
		t.Fatalf("TrimTenantExecutions(350) = %d, %d, %v; want 3 removed, 500 kept", n, kept, err)
	}
	var left []string
	for _, sid := range []string{"s0", "s1"} {
		page, _, err := s.ListExecutions(ctx, "t1", sid, 100, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range page {
			left = append(left, x.ID)
		}
	}
	slices.Sort(left)
	if fmt.Sprint(left) != "[x1 x4 x5 x6 x7]" {
		t.Errorf("left %v, want [x1 x4 x5 x6 x7]", left)
	}
	// An update counts the record's new size.
	x, err := s.GetExecution(ctx, "t1", "x4")
	if err != nil {
		t.Fatal(err)
	}
	x.Status, x.Result = "completed", json.RawMessage(`{"stdout":"`+strings.Repeat("o", 147)+`"}`)
	if err := s.UpdateExecution(ctx, x); err != nil {
		t.Fatal(err)
	}
	if n, kept, err := s.TrimTenantExecutions(ctx, "t1", 10000); err != nil || n != 0 || kept != 600 {
		t.Errorf("after x4 grew by 100 bytes: %d, %d, %v; want 600 kept", n, kept, err)
	}
	// 0: every finished record goes; the running one stays.
	if n, kept, err := s.TrimTenantExecutions(ctx, "t1", 0); err != nil || n != 4 || kept != 100 {
		t.Errorf("TrimTenantExecutions(0) = %d, %d, %v; want 4 removed, 100 kept", n, kept, err)
	}
	if page, _, err := s.ListExecutions(ctx, "t2", "s0", 100, ""); err != nil || len(page) != len(statuses) {
		t.Errorf("another tenant's executions: %d, %v", len(page), err)
	}
}
