package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// testSessionRevisions: a session is created at revision 1, each update
// moves it on by one, and an update from a stale read changes nothing.
func testSessionRevisions(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	sess := newSession("t1", "s1", t0)
	sess.Revision = 7 // the store's to set, not the caller's
	if err := s.CreateSession(ctx, sess); err != nil {
		t.Fatal(err)
	}
	if sess.Revision != 1 {
		t.Errorf("after CreateSession the caller's Revision = %d, want 1", sess.Revision)
	}
	got, err := s.GetSession(ctx, "t1", "s1")
	if err != nil || got.Revision != 1 {
		t.Fatalf("GetSession after create = %+v, %v; want revision 1", got, err)
	}

	// An update from the read succeeds and gives the caller the new
	// revision.
	stale := *got
	got.Status = "running"
	if err := s.UpdateSession(ctx, got); err != nil {
		t.Fatalf("UpdateSession at the revision read = %v", err)
	}
	if got.Revision != 2 {
		t.Errorf("after UpdateSession the caller's Revision = %d, want 2", got.Revision)
	}
	// The caller can go on writing with the struct it has.
	got.Error = "again"
	if err := s.UpdateSession(ctx, got); err != nil || got.Revision != 3 {
		t.Fatalf("a second UpdateSession of the same struct = %v, revision %d; want nil, 3", err, got.Revision)
	}
	want := *got

	// An update from the first read is a conflict, and changes nothing:
	// not the record, its metadata, or the caller's revision.
	stale.Status, stale.Metadata = "paused", map[string]string{"user_id": "mallory"}
	err = s.UpdateSession(ctx, &stale)
	if !errors.Is(err, errdefs.ErrConflict) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("UpdateSession from a stale read = %v, want ErrConflict (and so ErrFailedPrecondition)", err)
	}
	if errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("UpdateSession from a stale read = %v, which is also ErrNotFound", err)
	}
	if stale.Revision != 1 {
		t.Errorf("after a conflict the caller's Revision = %d, want 1 as read", stale.Revision)
	}
	if got, err := s.GetSession(ctx, "t1", "s1"); err != nil {
		t.Fatal(err)
	} else if d := diffSession(got, &want); d != "" {
		t.Errorf("after a conflicting update: %s", d)
	}
	if list, _, err := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1", Metadata: map[string]string{"user_id": "mallory"}}); err != nil || len(list) != 0 {
		t.Errorf("a conflicting update's metadata matches: %d sessions, %v", len(list), err)
	}
	// A revision ahead of the record's is no better.
	ahead := want
	ahead.Revision = 99
	if err := s.UpdateSession(ctx, &ahead); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("UpdateSession at a revision the record never had = %v, want ErrConflict", err)
	}

	// Absent is ErrNotFound, not a conflict, whatever the revision; so is
	// another tenant's session of that id.
	for _, k := range []struct{ tenant, id string }{{"t1", "nope"}, {"t2", "s1"}} {
		for _, rev := range []int64{0, 1, 3} {
			absent := newSession(k.tenant, k.id, t0)
			absent.Revision = rev
			if err := s.UpdateSession(ctx, absent); !errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrConflict) {
				t.Errorf("UpdateSession(%s/%s, revision %d) = %v, want ErrNotFound only", k.tenant, k.id, rev, err)
			}
		}
	}

	// A session created again after a delete starts again at 1.
	if err := s.DeleteSession(ctx, "t1", "s1"); err != nil {
		t.Fatal(err)
	}
	again := newSession("t1", "s1", t0)
	if err := s.CreateSession(ctx, again); err != nil || again.Revision != 1 {
		t.Fatalf("CreateSession after delete = %v, revision %d; want nil, 1", err, again.Revision)
	}

	// Every read returns the revision: the lists too.
	more := newSession("t1", "s2", t0)
	more.SandboxID, more.DueAt, more.Status = "sbx-2", t0, "running"
	if err := s.CreateSession(ctx, more); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := s.UpdateSession(ctx, more); err != nil {
			t.Fatal(err)
		}
	}
	list, _, err := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	due, err := s.ListDueSessions(ctx, t0, 10)
	if err != nil {
		t.Fatal(err)
	}
	sandboxes, err := s.ListSandboxSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string][]*store.Session{"ListSessions": list, "ListDueSessions": due, "ListSandboxSessions": sandboxes} {
		found := false
		for _, x := range l {
			if x.ID == "s2" {
				found = true
				if x.Revision != 5 {
					t.Errorf("%s: revision %d, want 5", name, x.Revision)
				}
			}
		}
		if !found {
			t.Errorf("%s did not list s2", name)
		}
	}
}

// testConcurrentUpdate runs read-modify-writes of one session from the
// same read at once: exactly one may win, and the record is the winner's,
// metadata included.
func testConcurrentUpdate(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if err := s.CreateSession(ctx, newSession("t1", "s1", t0)); err != nil {
		t.Fatal(err)
	}
	read, err := s.GetSession(ctx, "t1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make([]error, n)
		mine  = make([]store.Session, n)
	)
	for i := range n {
		mine[i] = *read
		mine[i].SandboxID = fmt.Sprintf("sbx-%d", i)
		mine[i].Metadata = map[string]string{"writer": fmt.Sprint(i)}
		wg.Go(func() {
			<-start
			errs[i] = s.UpdateSession(ctx, &mine[i])
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Errorf("writers %d and %d both won", winner, i)
			}
			winner = i
		case errors.Is(err, errdefs.ErrConflict):
		default:
			t.Errorf("writer %d: UpdateSession = %v, want nil or ErrConflict", i, err)
		}
	}
	if winner < 0 {
		t.Fatalf("no writer of %d won: %v", n, errs)
	}
	got, err := s.GetSession(ctx, "t1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	want := mine[winner]
	if want.Revision != 2 {
		t.Errorf("the winner's Revision = %d, want 2", want.Revision)
	}
	if d := diffSession(got, &want); d != "" {
		t.Errorf("after the race: %s", d)
	}
	for i := range n {
		list, _, err := s.ListSessions(ctx, store.SessionFilter{Tenant: "t1", Metadata: map[string]string{"writer": fmt.Sprint(i)}})
		if err != nil {
			t.Fatal(err)
		}
		if matched := len(list) == 1; matched != (i == winner) {
			t.Errorf("writer %d's metadata matches %d sessions (winner %d)", i, len(list), winner)
		}
	}
}
