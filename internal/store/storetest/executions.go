package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

func newExecution(tenant, id, sessionID string, created time.Time) *store.Execution {
	return &store.Execution{
		Tenant: tenant, ID: id, SessionID: sessionID, Status: "pending",
		Language: "python", ConversationID: "c1", ContextID: "ctx1",
		Request:   json.RawMessage(`{"code":"print(1)","timeout_ms":1000}`),
		CreatedAt: created, Owner: "replica-1",
	}
}

func testExecutionCRUD(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	x := newExecution("t1", "x1", "s1", t0)
	if err := s.CreateExecution(ctx, x); err != nil {
		t.Fatalf("CreateExecution = %v", err)
	}
	got, err := s.GetExecution(ctx, "t1", "x1")
	if err != nil {
		t.Fatalf("GetExecution = %v", err)
	}
	if d := diffExecution(got, x); d != "" {
		t.Errorf("after create: %s", d)
	}
	if got.Result != nil || !got.StartedAt.IsZero() || !got.FinishedAt.IsZero() {
		t.Errorf("unfinished execution: Result %q, StartedAt %v, FinishedAt %v; want nil and zero", got.Result, got.StartedAt, got.FinishedAt)
	}
	// Each step of an execution's life replaces the record, every field.
	for _, step := range []func(x *store.Execution){
		func(x *store.Execution) { x.Status, x.StartedAt = "running", t0.Add(time.Millisecond) },
		func(x *store.Execution) {
			x.SessionID, x.Language, x.ConversationID, x.ContextID, x.Owner = "s2", "node", "", "", "replica-2"
			x.Request, x.StartedAt = nil, time.Time{}
			x.Result = json.RawMessage(`{"stdout":"so far"}`)
		},
		func(x *store.Execution) {
			x.Status, x.FinishedAt = "completed", t0.Add(time.Second)
			x.Result = json.RawMessage(`{"stdout":"1\n","exit_code":0}`)
		},
	} {
		step(x)
		if err := s.UpdateExecution(ctx, x); err != nil {
			t.Fatalf("UpdateExecution = %v", err)
		}
		got, err := s.GetExecution(ctx, "t1", "x1")
		if err != nil {
			t.Fatalf("GetExecution = %v", err)
		}
		if d := diffExecution(got, x); d != "" {
			t.Errorf("after update to %s: %s", x.Status, d)
		}
	}
	// Finished, the record is final: neither a late progress write nor
	// another outcome replaces it.
	want := *x
	for _, status := range []string{"running", "failed"} {
		late := want
		late.Status, late.Result = status, json.RawMessage(`{"error":"late"}`)
		if err := s.UpdateExecution(ctx, &late); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("UpdateExecution of a finished execution to %s = %v, want ErrConflict", status, err)
		}
	}
	if got, err := s.GetExecution(ctx, "t1", "x1"); err != nil {
		t.Fatal(err)
	} else if d := diffExecution(got, &want); d != "" {
		t.Errorf("a finished execution after refused updates: %s", d)
	}
}

func testExecutionErrors(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if err := s.CreateExecution(ctx, newExecution("t1", "x1", "s1", t0)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"create existing", s.CreateExecution(ctx, newExecution("t1", "x1", "s2", t0)), errdefs.ErrAlreadyExists},
		{"create existing id in another tenant", s.CreateExecution(ctx, newExecution("t2", "x1", "s1", t0)), errdefs.ErrAlreadyExists},
		{"update absent", s.UpdateExecution(ctx, newExecution("t1", "nope", "s1", t0)), errdefs.ErrNotFound},
		{"get absent", func() error { _, err := s.GetExecution(ctx, "t1", "nope"); return err }(), errdefs.ErrNotFound},
		{"create without tenant", s.CreateExecution(ctx, newExecution("", "x2", "s1", t0)), errdefs.ErrInvalidArgument},
		{"create without id", s.CreateExecution(ctx, newExecution("t1", "", "s1", t0)), errdefs.ErrInvalidArgument},
		{"create without session", s.CreateExecution(ctx, newExecution("t1", "x3", "", t0)), errdefs.ErrInvalidArgument},
		{"create without created_at", s.CreateExecution(ctx, newExecution("t1", "x4", "s1", time.Time{})), errdefs.ErrInvalidArgument},
		{"create nil", s.CreateExecution(ctx, nil), errdefs.ErrInvalidArgument},
		{"update nil", s.UpdateExecution(ctx, nil), errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, tc.want) {
				t.Errorf("got %v, want %v", tc.err, tc.want)
			}
		})
	}
	got, err := s.GetExecution(ctx, "t1", "x1")
	if err != nil {
		t.Fatal(err)
	}
	if d := diffExecution(got, newExecution("t1", "x1", "s1", t0)); d != "" {
		t.Errorf("after failed creates: %s", d)
	}
}

// listExecutions pages through a session's executions and returns the ids
// in order, failing on an id seen twice.
func listExecutions(t *testing.T, s store.Store, tenant, sessionID string, limit int) []string {
	t.Helper()
	ids := []string{}
	seen := map[string]bool{}
	tok := ""
	for page := 0; page < 1000; page++ {
		list, next, err := s.ListExecutions(ctx, tenant, sessionID, limit, tok)
		if err != nil {
			t.Fatalf("ListExecutions(page %d) = %v", page, err)
		}
		if len(list) > limit || (next != "" && len(list) != limit) {
			t.Fatalf("page %d has %d executions (limit %d, next %q)", page, len(list), limit, next)
		}
		for _, x := range list {
			if seen[x.ID] || x.Tenant != tenant || x.SessionID != sessionID {
				t.Errorf("listed %s/%s/%s (seen before: %v)", x.Tenant, x.SessionID, x.ID, seen[x.ID])
			}
			seen[x.ID] = true
			ids = append(ids, x.ID)
		}
		if next == "" {
			return ids
		}
		tok = next
	}
	t.Fatal("more than 1000 pages")
	return nil
}

func testExecutionPagination(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	const n = 17
	var want []string
	for i := range n {
		id := fmt.Sprintf("x-%02d", i)
		if err := s.CreateExecution(ctx, newExecution("t1", id, "s1", t0.Add(time.Duration(i/4)*time.Second))); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
		// Executions of another session and of another tenant's session
		// of the same id interleave with them.
		if err := s.CreateExecution(ctx, newExecution("t1", "other-"+id, "s2", t0)); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateExecution(ctx, newExecution("t2", "t2-"+id, "s1", t0)); err != nil {
			t.Fatal(err)
		}
	}
	slices.Reverse(want)
	for _, limit := range []int{1, 4, 5, 16, 17, 18} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			if got := listExecutions(t, s, "t1", "s1", limit); !slices.Equal(got, want) {
				t.Errorf("pages = %v\nwant %v", got, want)
			}
		})
	}
	if got := listExecutions(t, s, "t1", "nope", 10); len(got) != 0 {
		t.Errorf("executions of an unknown session = %v", got)
	}
}

func testUnfinishedAndCounts(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if got, err := s.ListUnfinishedExecutions(ctx); err != nil || len(got) != 0 {
		t.Errorf("ListUnfinishedExecutions of an empty store = %v, %v", got, err)
	}
	if got, err := s.CountExecutions(ctx); err != nil || len(got) != 0 {
		t.Errorf("CountExecutions of an empty store = %v, %v", got, err)
	}
	var wantUnfinished []string
	wantCounts := map[string]int{}
	statuses := []string{"pending", "running", "completed", "failed", "timeout", "cancelled", "running"}
	for i, st := range statuses {
		for _, tenant := range []string{"t1", "t2"} {
			id := fmt.Sprintf("%s-%d", tenant, i)
			x := newExecution(tenant, id, "s1", t0.Add(time.Duration(i)*time.Second))
			x.Status = st
			if err := s.CreateExecution(ctx, x); err != nil {
				t.Fatal(err)
			}
			if st == "pending" || st == "running" {
				wantUnfinished = append(wantUnfinished, id)
			}
			wantCounts[st]++
		}
	}
	got, err := s.ListUnfinishedExecutions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range got {
		ids = append(ids, x.ID)
		if x.Status != "pending" && x.Status != "running" {
			t.Errorf("unfinished %s has status %s", x.ID, x.Status)
		}
	}
	slices.Sort(ids)
	slices.Sort(wantUnfinished)
	if !slices.Equal(ids, wantUnfinished) {
		t.Errorf("ListUnfinishedExecutions = %v, want %v", ids, wantUnfinished)
	}
	if got, err := s.CountExecutions(ctx); err != nil || !maps.Equal(got, wantCounts) {
		t.Errorf("CountExecutions = %v, %v; want %v", got, err, wantCounts)
	}

	// What the server does at start: fail them. Then none is left.
	for _, x := range got {
		x.Status, x.FinishedAt = "failed", t0.Add(time.Hour)
		if err := s.UpdateExecution(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.ListUnfinishedExecutions(ctx); err != nil || len(got) != 0 {
		t.Errorf("ListUnfinishedExecutions after failing them = %d, %v", len(got), err)
	}
}

func testDeleteExecutions(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	for _, x := range []*store.Execution{
		newExecution("t1", "a", "s1", t0),
		newExecution("t1", "b", "s1", t0),
		newExecution("t1", "c", "s2", t0),
		newExecution("t2", "d", "s1", t0),
	} {
		if err := s.CreateExecution(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateSession(ctx, newSession("t1", "s1", t0)); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteExecutions(ctx, "t1", "s1"); err != nil {
		t.Fatalf("DeleteExecutions = %v", err)
	}
	if err := s.DeleteExecutions(ctx, "t1", "s1"); err != nil {
		t.Errorf("DeleteExecutions again = %v", err)
	}
	for _, tc := range []struct {
		tenant, id string
		want       error
	}{
		{"t1", "a", errdefs.ErrNotFound},
		{"t1", "b", errdefs.ErrNotFound},
		{"t1", "c", nil},
		{"t2", "d", nil},
	} {
		if _, err := s.GetExecution(ctx, tc.tenant, tc.id); !errors.Is(err, tc.want) {
			t.Errorf("GetExecution(%s, %s) = %v, want %v", tc.tenant, tc.id, err, tc.want)
		}
	}
	// The session itself stays: the layer above terminates a session by
	// dropping its history and keeping its record.
	if _, err := s.GetSession(ctx, "t1", "s1"); err != nil {
		t.Errorf("GetSession after DeleteExecutions = %v", err)
	}
}

// A listing has every field of the records but their request and result,
// and does not read those: a page of 50 executions with 1 MiB results
// each allocates far less than the results (the bound is generous: this
// is not a benchmark).
func testExecutionSummaries(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	big := json.RawMessage(`{"stdout":"` + strings.Repeat("x", 1<<20) + `"}`)
	const n = 50
	for i := range n {
		x := newExecution("t1", fmt.Sprintf("x-%02d", i), "s1", t0.Add(time.Duration(i)*time.Second))
		x.Request = big
		switch i % 3 {
		case 1:
			x.Status, x.StartedAt = "running", t0.Add(time.Hour)
		case 2:
			x.Status, x.StartedAt, x.FinishedAt, x.Result = "completed", t0.Add(time.Hour), t0.Add(time.Hour+1500*time.Microsecond), big
		}
		if err := s.CreateExecution(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	list, _, err := s.ListExecutions(ctx, "t1", "s1", n, "")
	runtime.ReadMemStats(&after)
	if err != nil || len(list) != n {
		t.Fatalf("ListExecutions = %d, %v", len(list), err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Errorf("listing %d executions allocated %d MiB: it read their requests or results", n, grew>>20)
	}
	for _, got := range list {
		x, err := s.GetExecution(ctx, "t1", got.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := x.Summary()
		if got.Tenant != want.Tenant || got.SessionID != want.SessionID || got.Status != want.Status ||
			got.Language != want.Language || got.ConversationID != want.ConversationID || got.ContextID != want.ContextID ||
			!got.CreatedAt.Equal(want.CreatedAt) || !got.StartedAt.Equal(want.StartedAt) || !got.FinishedAt.Equal(want.FinishedAt) {
			t.Errorf("listed %+v, want %+v", got, want)
		}
	}
}
