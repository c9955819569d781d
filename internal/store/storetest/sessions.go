package storetest

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

func testSessionCRUD(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	want := newSession("t1", "s1", t0)
	if err := s.CreateSession(ctx, want); err != nil {
		t.Fatalf("CreateSession = %v", err)
	}
	got, err := s.GetSession(ctx, "t1", "s1")
	if err != nil {
		t.Fatalf("GetSession = %v", err)
	}
	if d := diffSession(got, want); d != "" {
		t.Errorf("after create: %s", d)
	}

	// Update replaces every field, clearing some and changing the rest.
	upd := &store.Session{
		Tenant: "t1", ID: "s1", Status: "error", TemplateID: "node", SandboxID: "", Error: "boom",
		Metadata: map[string]string{"agent_id": "a9"}, Config: json.RawMessage(`{"ttl":60}`),
		CreatedAt: t0.Add(-time.Minute), UpdatedAt: t0.Add(time.Second), LastActivityAt: time.Time{}, ExpiresAt: t0.Add(2 * time.Hour),
	}
	want.SandboxID = "sb-1"
	if err := s.UpdateSession(ctx, want); err != nil {
		t.Fatalf("UpdateSession = %v", err)
	}
	if got, _ := s.GetSession(ctx, "t1", "s1"); got == nil || got.SandboxID != "sb-1" {
		t.Errorf("after setting SandboxID: %+v", got)
	}
	upd.Revision = want.Revision
	if err := s.UpdateSession(ctx, upd); err != nil {
		t.Fatalf("UpdateSession = %v", err)
	}
	got, err = s.GetSession(ctx, "t1", "s1")
	if err != nil {
		t.Fatalf("GetSession = %v", err)
	}
	if d := diffSession(got, upd); d != "" {
		t.Errorf("after update: %s", d)
	}
	// The metadata filter follows the update: the old pair is gone.
	for _, tc := range []struct {
		meta map[string]string
		want int
	}{
		{map[string]string{"user_id": "u1"}, 0},
		{map[string]string{"agent_id": "a9"}, 1},
	} {
		list, _, err := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1", Metadata: tc.meta})
		if err != nil || len(list) != tc.want {
			t.Errorf("ListSessions(%v) after update = %d sessions, %v; want %d", tc.meta, len(list), err, tc.want)
		}
	}

	// No metadata and no config: an empty map and nil come back.
	bare := &store.Session{Tenant: "t1", ID: "bare", CreatedAt: t0}
	if err := s.CreateSession(ctx, bare); err != nil {
		t.Fatalf("CreateSession(bare) = %v", err)
	}
	got, err = s.GetSession(ctx, "t1", "bare")
	if err != nil {
		t.Fatalf("GetSession(bare) = %v", err)
	}
	if got.Metadata == nil || len(got.Metadata) != 0 || got.Config != nil {
		t.Errorf("bare session: Metadata = %#v, Config = %q; want an empty map and nil", got.Metadata, got.Config)
	}

	if err := s.DeleteSession(ctx, "t1", "s1"); err != nil {
		t.Fatalf("DeleteSession = %v", err)
	}
	if _, err := s.GetSession(ctx, "t1", "s1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetSession after delete = %v, want ErrNotFound", err)
	}
	if err := s.DeleteSession(ctx, "t1", "s1"); err != nil {
		t.Errorf("DeleteSession of an absent session = %v, want nil", err)
	}
	// The id is free again, and nothing of the old session shows.
	again := newSession("t1", "s1", t0)
	again.Metadata = nil
	if err := s.CreateSession(ctx, again); err != nil {
		t.Fatalf("CreateSession after delete = %v", err)
	}
	if list, _, _ := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1", Metadata: map[string]string{"agent_id": "a9"}}); len(list) != 0 {
		t.Errorf("a deleted session's metadata still matches: %d sessions", len(list))
	}
}

func testSessionErrors(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if err := s.CreateSession(ctx, newSession("t1", "s1", t0)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"create existing", s.CreateSession(ctx, newSession("t1", "s1", t0.Add(time.Hour))), errdefs.ErrAlreadyExists},
		{"update absent", s.UpdateSession(ctx, newSession("t1", "nope", t0)), errdefs.ErrNotFound},
		{"create without tenant", s.CreateSession(ctx, newSession("", "s2", t0)), errdefs.ErrInvalidArgument},
		{"create without id", s.CreateSession(ctx, newSession("t1", "", t0)), errdefs.ErrInvalidArgument},
		{"create without created_at", s.CreateSession(ctx, newSession("t1", "s3", time.Time{})), errdefs.ErrInvalidArgument},
		{"create nil", s.CreateSession(ctx, nil), errdefs.ErrInvalidArgument},
		{"update without created_at", s.UpdateSession(ctx, newSession("t1", "s1", time.Time{})), errdefs.ErrInvalidArgument},
		{"update nil", s.UpdateSession(ctx, nil), errdefs.ErrInvalidArgument},
		{"get absent", func() error { _, err := s.GetSession(ctx, "t1", "nope"); return err }(), errdefs.ErrNotFound},
		{"list without tenant", func() error { _, _, err := s.ListSessions(ctx, store.SessionFilter{}); return err }(), errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, tc.want) {
				t.Errorf("got %v, want %v", tc.err, tc.want)
			}
		})
	}
	// The failed create did not touch the existing session.
	got, err := s.GetSession(ctx, "t1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	want := newSession("t1", "s1", t0)
	want.Revision = 1
	if d := diffSession(got, want); d != "" {
		t.Errorf("after a failed create: %s", d)
	}
}

// listAll pages through ListSessions and returns the ids in order, failing
// on a page larger than limit or an id seen twice.
func listAll(t *testing.T, s store.Store, f store.SessionFilter) []string {
	t.Helper()
	var ids []string
	seen := map[string]bool{}
	for page := 0; ; page++ {
		if page > 1000 {
			t.Fatal("more than 1000 pages")
		}
		list, next, err := s.ListSessions(ctx, f)
		if err != nil {
			t.Fatalf("ListSessions(page %d) = %v", page, err)
		}
		if f.Limit > 0 && len(list) > f.Limit {
			t.Fatalf("page %d has %d sessions, limit %d", page, len(list), f.Limit)
		}
		if next != "" && len(list) != f.Limit && f.Limit > 0 {
			t.Errorf("page %d has %d sessions and a next page; want full pages before the last", page, len(list))
		}
		for _, sess := range list {
			if seen[sess.ID] {
				t.Errorf("session %q listed twice", sess.ID)
			}
			seen[sess.ID] = true
			ids = append(ids, sess.ID)
		}
		if next == "" {
			return ids
		}
		f.PageToken = next
	}
}

func testSessionPagination(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	// Three sessions share each creation time, so the order within a time
	// (by id, descending) and a page boundary inside a tie both count.
	const n = 23
	var want []string
	for i := range n {
		id := fmt.Sprintf("s-%02d", i)
		if err := s.CreateSession(ctx, newSession("t1", id, t0.Add(time.Duration(i/3)*time.Second))); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	slices.Reverse(want) // newest first, and ids ascend with time here
	for _, limit := range []int{1, 2, 3, 5, 7, 23, 24, 100} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			if got := listAll(t, s, store.SessionFilter{Tenant: "t1", Limit: limit}); !slices.Equal(got, want) {
				t.Errorf("pages = %v\nwant %v", got, want)
			}
		})
	}

	// A session created while a client pages does not shift the pages it
	// has yet to read: it is newer than the position in the token.
	first, next, err := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1", Limit: 10})
	if err != nil || len(first) != 10 || next == "" {
		t.Fatalf("first page = %d sessions, %q, %v", len(first), next, err)
	}
	if err := s.CreateSession(ctx, newSession("t1", "newest", t0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	got := []string{}
	for _, sess := range first {
		got = append(got, sess.ID)
	}
	got = append(got, listAll(t, s, store.SessionFilter{Tenant: "t1", Limit: 10, PageToken: next})...)
	if !slices.Equal(got, want) {
		t.Errorf("pages with a create between them = %v\nwant %v", got, want)
	}
}

func testSessionFilters(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	statuses := []string{"pending", "running", "paused", "running", "error", "terminated"}
	var all []*store.Session
	for i := range 30 {
		sess := newSession("t1", fmt.Sprintf("s-%02d", i), t0.Add(time.Duration(i)*time.Second))
		sess.Status = statuses[i%len(statuses)]
		sess.Metadata = map[string]string{"user_id": fmt.Sprintf("u%d", i%3), "agent_id": fmt.Sprintf("a%d", i%2)}
		if i%5 == 0 {
			sess.Metadata["team"] = "" // an empty value is a value
		}
		if i == 7 {
			sess.Metadata = nil
		}
		if err := s.CreateSession(ctx, sess); err != nil {
			t.Fatal(err)
		}
		all = append(all, sess)
	}
	// Another tenant's sessions match the same filters and must not show.
	for i := range 5 {
		other := newSession("t2", fmt.Sprintf("s-%02d", i), t0)
		other.Status = "running"
		other.Metadata = map[string]string{"user_id": "u0", "agent_id": "a0"}
		if err := s.CreateSession(ctx, other); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		status string
		meta   map[string]string
	}{
		{"all", "", nil},
		{"status", "running", nil},
		{"status none", "hibernated", nil},
		{"one pair", "", map[string]string{"user_id": "u1"}},
		{"two pairs", "", map[string]string{"user_id": "u1", "agent_id": "a0"}},
		{"status and pair", "running", map[string]string{"user_id": "u0"}},
		{"empty value", "", map[string]string{"team": ""}},
		{"absent key", "", map[string]string{"nope": "x"}},
		{"value of another key", "", map[string]string{"user_id": "a0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want []string
			for _, sess := range slices.Backward(all) {
				if tc.status != "" && sess.Status != tc.status {
					continue
				}
				match := true
				for k, v := range tc.meta {
					if got, ok := sess.Metadata[k]; !ok || got != v {
						match = false
					}
				}
				if match {
					want = append(want, sess.ID)
				}
			}
			got := listAll(t, s, store.SessionFilter{Tenant: "t1", Status: tc.status, Metadata: tc.meta, Limit: 4})
			if !slices.Equal(got, want) {
				t.Errorf("ListSessions(status %q, metadata %v) = %v\nwant %v", tc.status, tc.meta, got, want)
			}
		})
	}
	// Listed sessions are whole records.
	list, _, err := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1", Limit: 30})
	if err != nil || len(list) != 30 {
		t.Fatalf("ListSessions = %d, %v", len(list), err)
	}
	for i, got := range list {
		if d := diffSession(got, all[len(all)-1-i]); d != "" {
			t.Errorf("listed %s: %s", got.ID, d)
		}
	}
}

func testPageLimits(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	for i := range store.DefaultPageSize + 1 {
		if err := s.CreateSession(ctx, newSession("t1", fmt.Sprintf("s-%03d", i), t0.Add(time.Duration(i)*time.Millisecond))); err != nil {
			t.Fatal(err)
		}
		x := newExecution("t1", fmt.Sprintf("x-%03d", i), "s-000", t0.Add(time.Duration(i)*time.Millisecond))
		if err := s.CreateExecution(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		limit    int
		wantLen  int
		wantNext bool
		wantErr  error
	}{
		{0, store.DefaultPageSize, true, nil},
		{1, 1, true, nil},
		{store.DefaultPageSize + 1, store.DefaultPageSize + 1, false, nil},
		{store.MaxPageSize, store.DefaultPageSize + 1, false, nil},
		{-1, 0, false, errdefs.ErrInvalidArgument},
		{store.MaxPageSize + 1, 0, false, errdefs.ErrInvalidArgument},
	} {
		t.Run(fmt.Sprintf("limit=%d", tc.limit), func(t *testing.T) {
			list, next, err := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1", Limit: tc.limit})
			if !errors.Is(err, tc.wantErr) || len(list) != tc.wantLen || (next != "") != tc.wantNext {
				t.Errorf("ListSessions = %d sessions, next %q, %v; want %d, next %v, %v", len(list), next, err, tc.wantLen, tc.wantNext, tc.wantErr)
			}
			xs, next, err := s.ListExecutions(ctx, "t1", "s-000", tc.limit, "")
			if !errors.Is(err, tc.wantErr) || len(xs) != tc.wantLen || (next != "") != tc.wantNext {
				t.Errorf("ListExecutions = %d executions, next %q, %v; want %d, next %v, %v", len(xs), next, err, tc.wantLen, tc.wantNext, tc.wantErr)
			}
		})
	}
}

func testBadPageToken(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if err := s.CreateSession(ctx, newSession("t1", "s1", t0)); err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	for _, tok := range []string{
		"!!!",
		"not a token",
		b64([]byte("no separator")),
		b64([]byte("x:s1")),
		b64([]byte("123:")),
		b64([]byte(":s1")),
		b64([]byte("99999999999999999999999:s1")),
	} {
		t.Run(tok, func(t *testing.T) {
			if _, _, err := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1", PageToken: tok}); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ListSessions = %v, want ErrInvalidArgument", err)
			}
			if _, _, err := s.ListExecutions(ctx, "t1", "s1", 0, tok); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ListExecutions = %v, want ErrInvalidArgument", err)
			}
		})
	}
}

func testConcurrentCreate(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	const n = 50
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			sess := newSession("t1", "same", t0)
			sess.SandboxID = fmt.Sprint(i)
			errs[i] = s.CreateSession(ctx, sess)
		})
	}
	close(start)
	wg.Wait()
	created := 0
	for _, err := range errs {
		switch {
		case err == nil:
			created++
		case errors.Is(err, errdefs.ErrAlreadyExists):
		default:
			t.Errorf("CreateSession = %v, want nil or ErrAlreadyExists", err)
		}
	}
	if created != 1 {
		t.Errorf("%d of %d concurrent creates of one id succeeded, want 1", created, n)
	}
}

// testConcurrentMixed runs the control plane's calls from many goroutines
// at once: none may fail for the store's own locking.
func testConcurrentMixed(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	const n = 32
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make(chan error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			errs <- func() error {
				id := fmt.Sprintf("s-%02d", i)
				sess := newSession("t1", id, t0.Add(time.Duration(i)*time.Second))
				if err := s.CreateSession(ctx, sess); err != nil {
					return err
				}
				for j := range 5 {
					sess.Status, sess.UpdatedAt = "running", t0.Add(time.Duration(j)*time.Minute)
					if err := s.UpdateSession(ctx, sess); err != nil {
						return err
					}
					if _, err := s.GetSession(ctx, "t1", id); err != nil {
						return err
					}
					x := newExecution("t1", fmt.Sprintf("%s-x%d", id, j), id, t0)
					if err := s.CreateExecution(ctx, x); err != nil {
						return err
					}
					x.Status = "completed"
					if err := s.UpdateExecution(ctx, x); err != nil {
						return err
					}
					if err := s.PutUpload(ctx, &store.Upload{Tenant: "t1", SessionID: id, Path: fmt.Sprint(j), CreatedAt: t0}); err != nil {
						return err
					}
					if _, _, err := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1", Metadata: map[string]string{"user_id": "u1"}}); err != nil {
						return err
					}
				}
				if i%2 == 0 {
					return s.DeleteSession(ctx, "t1", id)
				}
				return nil
			}()
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	got := listAll(t, s, store.SessionFilter{Tenant: "t1", Limit: 7})
	if len(got) != n/2 {
		t.Errorf("%d sessions left, want %d", len(got), n/2)
	}
	counts, err := s.CountExecutions(ctx)
	if err != nil || !maps.Equal(counts, map[string]int{"completed": n / 2 * 5}) {
		t.Errorf("CountExecutions = %v, %v; want %d completed", counts, err, n/2*5)
	}
}

func testCountSessions(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if got, err := s.CountSessions(ctx); err != nil || len(got) != 0 {
		t.Errorf("CountSessions of an empty store = %v, %v", got, err)
	}
	want := map[string]int{}
	for i, st := range []string{"pending", "running", "running", "paused", "terminated", "running"} {
		// Every tenant counts, and the same id in two tenants is two.
		sess := newSession(fmt.Sprintf("t%d", i%2), fmt.Sprintf("s-%d", i/2), t0)
		sess.Status = st
		if err := s.CreateSession(ctx, sess); err != nil {
			t.Fatal(err)
		}
		want[st]++
	}
	if got, err := s.CountSessions(ctx); err != nil || !maps.Equal(got, want) {
		t.Errorf("CountSessions = %v, %v; want %v", got, err, want)
	}
}

func testTimeRoundTrip(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	east := time.FixedZone("UTC+5:30", 5*3600+1800)
	for i, tc := range []struct {
		name string
		at   time.Time
	}{
		{"zero", time.Time{}},
		{"nanoseconds", t0},
		{"another zone", time.Date(2025, 6, 30, 23, 59, 59, 999999999, east)},
		{"before 1970", time.Date(1969, 7, 20, 20, 17, 40, 1000, time.UTC)},
		{"far future", time.Date(2999, 12, 31, 23, 59, 59, 999999000, time.UTC)},
		{"monotonic", time.Now()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprint(i)
			sess := newSession("t1", id, t0)
			sess.UpdatedAt, sess.LastActivityAt, sess.ExpiresAt = tc.at, tc.at, tc.at
			if !tc.at.IsZero() {
				sess.CreatedAt = tc.at
			}
			if err := s.CreateSession(ctx, sess); err != nil {
				t.Fatal(err)
			}
			got, err := s.GetSession(ctx, "t1", id)
			if err != nil {
				t.Fatal(err)
			}
			if d := diffSession(got, sess); d != "" {
				t.Errorf("session: %s", d)
			}
			if tc.at.IsZero() && !got.ExpiresAt.Equal(time.Time{}) {
				t.Errorf("zero ExpiresAt came back as %v", got.ExpiresAt)
			}
			x := newExecution("t1", id, id, sess.CreatedAt)
			x.StartedAt, x.FinishedAt = tc.at, tc.at
			if err := s.CreateExecution(ctx, x); err != nil {
				t.Fatal(err)
			}
			gx, err := s.GetExecution(ctx, "t1", id)
			if err != nil {
				t.Fatal(err)
			}
			if d := diffExecution(gx, x); d != "" {
				t.Errorf("execution: %s", d)
			}
			u := &store.Upload{Tenant: "t1", SessionID: id, Path: "f", CreatedAt: tc.at}
			if err := s.PutUpload(ctx, u); err != nil {
				t.Fatal(err)
			}
			us, err := s.ListUploads(ctx, "t1", id, "")
			if err != nil || len(us) != 1 || !sameTime(us[0].CreatedAt, tc.at) {
				t.Errorf("upload = %v, %v; want CreatedAt %v", us, err, tc.at)
			}
		})
	}
	// A page token keeps the microsecond: paging through sessions created
	// a microsecond apart loses none.
	for i := range 5 {
		if err := s.CreateSession(ctx, newSession("t2", fmt.Sprintf("m%d", i), t0.Add(time.Duration(i)*time.Microsecond))); err != nil {
			t.Fatal(err)
		}
	}
	if got := listAll(t, s, store.SessionFilter{Tenant: "t2", Limit: 1}); !slices.Equal(got, []string{"m4", "m3", "m2", "m1", "m0"}) {
		t.Errorf("pages of sessions a microsecond apart = %v", got)
	}
}

func testDueSessions(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	ids := func(list []*store.Session) []string {
		var out []string
		for _, x := range list {
			out = append(out, x.Tenant+"/"+x.ID)
		}
		return out
	}
	// Due times out of creation order, across tenants; one never due.
	for i, tc := range []struct {
		tenant, id string
		due        time.Duration // from t0; 0 is never
	}{
		{"a", "late", 3 * time.Minute},
		{"b", "early", time.Minute},
		{"a", "never", 0},
		{"b", "middle", 2 * time.Minute},
	} {
		sess := newSession(tc.tenant, tc.id, t0.Add(time.Duration(i)*time.Second))
		if tc.due != 0 {
			sess.DueAt = t0.Add(tc.due)
		}
		if err := s.CreateSession(ctx, sess); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ListDueSessions(ctx, t0.Add(2*time.Minute), 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"b/early", "b/middle"}; !slices.Equal(ids(got), want) {
		t.Errorf("due by t0+2m = %v, want %v", ids(got), want)
	}
	got, _ = s.ListDueSessions(ctx, t0.Add(time.Hour), 2)
	if want := []string{"b/early", "b/middle"}; !slices.Equal(ids(got), want) {
		t.Errorf("first 2 due by t0+1h = %v, want %v", ids(got), want)
	}
	if got[0].DueAt.IsZero() || !sameTime(got[0].DueAt, t0.Add(time.Minute)) {
		t.Errorf("DueAt = %v, want %v", got[0].DueAt, t0.Add(time.Minute))
	}
	// Rescheduling and clearing move a session in and out.
	early := got[0]
	early.DueAt = time.Time{}
	if err := s.UpdateSession(ctx, early); err != nil {
		t.Fatal(err)
	}
	got, _ = s.ListDueSessions(ctx, t0.Add(time.Hour), 10)
	if want := []string{"b/middle", "a/late"}; !slices.Equal(ids(got), want) {
		t.Errorf("after clearing early: %v, want %v", ids(got), want)
	}
	for _, n := range []int{0, -1, 1001} {
		if _, err := s.ListDueSessions(ctx, t0, n); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("limit %d: err = %v, want ErrInvalidArgument", n, err)
		}
	}
}

func testSandboxSessions(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	for i, tc := range []struct{ tenant, id, status, sandbox string }{
		{"a", "live", "running", "sbx-1"},
		{"b", "paused", "paused", "sbx-2"},
		{"a", "lazy", "running", ""},
		{"a", "gone", "terminated", "sbx-3"},
	} {
		sess := newSession(tc.tenant, tc.id, t0.Add(time.Duration(i)*time.Second))
		sess.Status, sess.SandboxID = tc.status, tc.sandbox
		if err := s.CreateSession(ctx, sess); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ListSandboxSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range got {
		ids = append(ids, x.Tenant+"/"+x.ID+"="+x.SandboxID)
	}
	slices.Sort(ids)
	if want := []string{"a/live=sbx-1", "b/paused=sbx-2"}; !slices.Equal(ids, want) {
		t.Errorf("sandbox sessions = %v, want %v", ids, want)
	}
}
