package storetest

import (
	"errors"
	"slices"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

func testDeleteSessionCascades(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	for _, k := range [][2]string{{"t1", "s1"}, {"t1", "s2"}, {"t2", "s1"}} {
		tenant, id := k[0], k[1]
		if err := s.CreateSession(ctx, newSession(tenant, id, t0)); err != nil {
			t.Fatal(err)
		}
		for _, x := range []string{"x1", "x2", "x3"} {
			if err := s.CreateExecution(ctx, newExecution(tenant, tenant+id+x, id, t0)); err != nil {
				t.Fatal(err)
			}
		}
		for _, u := range []*store.Upload{upload(tenant, id, "f", ""), upload(tenant, id, "d/g", "c1")} {
			if err := s.PutUpload(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.DeleteSession(ctx, "t1", "s1"); err != nil {
		t.Fatalf("DeleteSession = %v", err)
	}
	for _, tc := range []struct {
		tenant, id string
		gone       bool
	}{
		{"t1", "s1", true},
		{"t1", "s2", false},
		{"t2", "s1", false},
	} {
		_, err := s.GetSession(ctx, tc.tenant, tc.id)
		xs, _, xerr := s.ListExecutions(ctx, tc.tenant, tc.id, 0, "")
		n, uerr := s.CountUploads(ctx, tc.tenant, tc.id)
		if err := errors.Join(xerr, uerr); err != nil {
			t.Fatal(err)
		}
		wantX, wantU := 3, 2
		if tc.gone {
			wantX, wantU = 0, 0
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("GetSession(%s, %s) = %v, want ErrNotFound", tc.tenant, tc.id, err)
			}
			if _, err := s.GetExecution(ctx, tc.tenant, tc.tenant+tc.id+"x1"); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("GetExecution of a deleted session's = %v, want ErrNotFound", err)
			}
		} else if err != nil {
			t.Errorf("GetSession(%s, %s) = %v", tc.tenant, tc.id, err)
		}
		if len(xs) != wantX || n != wantU {
			t.Errorf("%s/%s: %d executions, %d uploads; want %d, %d", tc.tenant, tc.id, len(xs), n, wantX, wantU)
		}
	}
	if counts, err := s.CountExecutions(ctx); err != nil || counts["pending"] != 6 {
		t.Errorf("CountExecutions = %v, %v; want 6 pending", counts, err)
	}
}

// testTenantIsolation has tenant t2 try every call on what tenant t1 owns,
// with t2 holding a session of the same id.
func testTenantIsolation(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	a := newSession("t1", "same", t0)
	a.Metadata = map[string]string{"user_id": "alice"}
	b := newSession("t2", "same", t0)
	b.Status, b.Metadata = "running", map[string]string{"user_id": "bob"}
	for _, sess := range []*store.Session{a, b} {
		if err := s.CreateSession(ctx, sess); err != nil {
			t.Fatalf("CreateSession(%s) = %v", sess.Tenant, err)
		}
	}
	xa := newExecution("t1", "xa", "same", t0)
	if err := s.CreateExecution(ctx, xa); err != nil {
		t.Fatal(err)
	}
	if err := s.PutUpload(ctx, upload("t1", "same", "secret.txt", "c1")); err != nil {
		t.Fatal(err)
	}

	// Reads.
	got, err := s.GetSession(ctx, "t2", "same")
	if err != nil || diffSession(got, b) != "" {
		t.Errorf("t2's session = %+v, %v; want its own", got, err)
	}
	if _, err := s.GetSession(ctx, "t3", "same"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetSession from a third tenant = %v, want ErrNotFound", err)
	}
	if _, err := s.GetExecution(ctx, "t2", "xa"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetExecution of t1's from t2 = %v, want ErrNotFound", err)
	}
	if xs, _, err := s.ListExecutions(ctx, "t2", "same", 0, ""); err != nil || len(xs) != 0 {
		t.Errorf("ListExecutions from t2 = %d, %v; want none", len(xs), err)
	}
	for _, f := range []store.SessionFilter{
		{Tenant: "t2"},
		{Tenant: "t2", Metadata: map[string]string{"user_id": "alice"}},
		{Tenant: "t2", Status: "pending"},
	} {
		list, _, err := s.ListSessions(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, sess := range list {
			if sess.Tenant != "t2" {
				t.Errorf("ListSessions(%+v) returned %s's session", f, sess.Tenant)
			}
		}
		if f.Metadata != nil || f.Status != "" {
			if len(list) != 0 {
				t.Errorf("ListSessions(%+v) = %d sessions, want none", f, len(list))
			}
		}
	}
	if n, err := s.CountUploads(ctx, "t2", "same"); err != nil || n != 0 {
		t.Errorf("CountUploads from t2 = %d, %v", n, err)
	}
	if got := uploadPaths(t, s, "t2", "same", "c1"); len(got) != 0 {
		t.Errorf("ListUploads from t2 = %v", got)
	}

	// Writes.
	hijack := *xa
	hijack.Tenant, hijack.Status = "t2", "cancelled"
	if err := s.UpdateExecution(ctx, &hijack); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("UpdateExecution of t1's from t2 = %v, want ErrNotFound", err)
	}
	b.Status = "paused"
	if err := s.UpdateSession(ctx, b); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		s.DeleteExecutions(ctx, "t2", "same"),
		s.DeleteUploads(ctx, "t2", "same", ""),
		s.DeleteConversationUploads(ctx, "t2", "same", "c1"),
		s.DeleteSession(ctx, "t2", "same"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}

	// t1's records are as they were.
	if got, err := s.GetSession(ctx, "t1", "same"); err != nil || diffSession(got, a) != "" {
		t.Errorf("t1's session after t2's calls = %+v, %v; want %+v", got, err, a)
	}
	if got, err := s.GetExecution(ctx, "t1", "xa"); err != nil || diffExecution(got, xa) != "" {
		t.Errorf("t1's execution after t2's calls = %+v, %v", got, err)
	}
	if got := uploadPaths(t, s, "t1", "same", "c1"); !slices.Equal(got, []string{"secret.txt"}) {
		t.Errorf("t1's uploads after t2's calls = %v", got)
	}
	if list, _, err := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1", Metadata: map[string]string{"user_id": "alice"}}); err != nil || len(list) != 1 {
		t.Errorf("t1's metadata filter after t2's calls = %d, %v", len(list), err)
	}
}
