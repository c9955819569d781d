package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// testDocuments: create, read, compare-and-swap, list by prefix and page,
// delete with and without a revision, and tenant isolation.
func testDocuments(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	d := &store.Document{Kind: "template", Tenant: "acme", Key: "py", Value: json.RawMessage(`{"v":1}`)}
	if err := s.PutDocument(ctx, d); err != nil {
		t.Fatal(err)
	}
	if d.Revision != 1 || d.CreatedAt.IsZero() || !d.CreatedAt.Equal(d.UpdatedAt) {
		t.Errorf("created: revision %d, created %v, updated %v", d.Revision, d.CreatedAt, d.UpdatedAt)
	}
	again := &store.Document{Kind: "template", Tenant: "acme", Key: "py", Value: json.RawMessage(`{}`)}
	if err := s.PutDocument(ctx, again); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second create = %v; want ErrAlreadyExists", err)
	}
	got, err := s.GetDocument(ctx, "template", "acme", "py")
	if err != nil || got.Revision != 1 || !isJSON(got.Value, `{"v":1}`) || !sameTime(got.CreatedAt, d.CreatedAt) {
		t.Fatalf("GetDocument = %+v, %v", got, err)
	}
	// Two writers read revision 1; one wins.
	a, b := *got, *got
	a.Value, b.Value = json.RawMessage(`{"v":2}`), json.RawMessage(`{"v":3}`)
	if err := s.PutDocument(ctx, &a); err != nil || a.Revision != 2 || !sameTime(a.CreatedAt, d.CreatedAt) {
		t.Fatalf("update: %v, revision %d, created %v", err, a.Revision, a.CreatedAt)
	}
	if err := s.PutDocument(ctx, &b); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("stale update = %v; want ErrConflict", err)
	}
	if got, _ := s.GetDocument(ctx, "template", "acme", "py"); got == nil || !isJSON(got.Value, `{"v":2}`) {
		t.Errorf("after the stale update: %+v", got)
	}
	// Other tenants and kinds see nothing of it.
	if _, err := s.GetDocument(ctx, "template", "evil", "py"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("other tenant's get = %v; want ErrNotFound", err)
	}
	if _, err := s.GetDocument(ctx, "webhook", "acme", "py"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("other kind's get = %v; want ErrNotFound", err)
	}
	evil := &store.Document{Kind: "template", Tenant: "evil", Key: "py", Value: json.RawMessage(`{}`), Revision: 2}
	if err := s.PutDocument(ctx, evil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("other tenant's update = %v; want ErrNotFound", err)
	}
	if err := s.DeleteDocument(ctx, "template", "evil", "py", 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("other tenant's delete = %v; want ErrNotFound", err)
	}
	// Delete: a stale revision is refused, the right one or 0 deletes.
	if err := s.DeleteDocument(ctx, "template", "acme", "py", 1); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("stale delete = %v; want ErrConflict", err)
	}
	if err := s.DeleteDocument(ctx, "template", "acme", "py", 2); err != nil {
		t.Errorf("delete: %v", err)
	}
	if err := s.DeleteDocument(ctx, "template", "acme", "py", 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second delete = %v; want ErrNotFound", err)
	}
	if err := s.PutDocument(ctx, &a); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("update of a deleted document = %v; want ErrNotFound", err)
	}
}

// testListDocuments: prefixes (including ones with bytes that sort
// around them), paging with after, and other tenants and kinds left out.
func testListDocuments(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	keys := []string{"a", "conv/u1/a", "conv/u1/b", "conv/u1/c", "conv/u10/a", "conv/u2/a", "conv~", "é"}
	for _, k := range keys {
		for _, tenant := range []string{"acme", "other"} {
			if err := s.PutDocument(ctx, &store.Document{Kind: "conversation", Tenant: tenant, Key: k, Value: json.RawMessage(`"` + tenant + `"`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.PutDocument(ctx, &store.Document{Kind: "webhook", Tenant: "acme", Key: "conv/u1/z", Value: json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	list := func(prefix, after string, limit int) string {
		t.Helper()
		docs, err := s.ListDocuments(ctx, "conversation", "acme", prefix, after, limit)
		if err != nil {
			t.Fatalf("ListDocuments(%q, %q, %d) = %v", prefix, after, limit, err)
		}
		var got []string
		for _, d := range docs {
			if d.Tenant != "acme" || d.Kind != "conversation" || !isJSON(d.Value, `"acme"`) || d.Revision != 1 {
				t.Errorf("listed %+v", d)
			}
			got = append(got, d.Key)
		}
		return strings.Join(got, " ")
	}
	for _, tc := range []struct {
		prefix, after string
		limit         int
		want          string
	}{
		{"", "", 100, strings.Join(keys, " ")},
		{"conv/u1/", "", 100, "conv/u1/a conv/u1/b conv/u1/c"},
		{"conv/u1", "", 100, "conv/u1/a conv/u1/b conv/u1/c conv/u10/a"},
		{"conv/u1/", "conv/u1/a", 100, "conv/u1/b conv/u1/c"},
		{"conv/u1/", "", 2, "conv/u1/a conv/u1/b"},
		{"", "conv/u2/a", 100, "conv~ é"},
		{"", "a", 1, "conv/u1/a"},
		{"nothing", "", 100, ""},
	} {
		if got := list(tc.prefix, tc.after, tc.limit); got != tc.want {
			t.Errorf("ListDocuments(%q, %q, %d) = %q; want %q", tc.prefix, tc.after, tc.limit, got, tc.want)
		}
	}
	for _, limit := range []int{0, -1, 1001} {
		if _, err := s.ListDocuments(ctx, "conversation", "acme", "", "", limit); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("limit %d: %v; want ErrInvalidArgument", limit, err)
		}
	}
}

// testDocumentErrors: what a backend refuses.
func testDocumentErrors(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	for name, d := range map[string]*store.Document{
		"no kind":     {Tenant: "a", Key: "k", Value: json.RawMessage(`1`)},
		"no tenant":   {Kind: "x", Key: "k", Value: json.RawMessage(`1`)},
		"no key":      {Kind: "x", Tenant: "a", Value: json.RawMessage(`1`)},
		"long key":    {Kind: "x", Tenant: "a", Key: strings.Repeat("k", store.MaxDocumentKey+1), Value: json.RawMessage(`1`)},
		"not JSON":    {Kind: "x", Tenant: "a", Key: "k", Value: json.RawMessage(`{`)},
		"no value":    {Kind: "x", Tenant: "a", Key: "k"},
		"large value": {Kind: "x", Tenant: "a", Key: "k", Value: json.RawMessage(`"` + strings.Repeat("v", store.MaxDocumentValue) + `"`)},
	} {
		if err := s.PutDocument(ctx, d); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: PutDocument = %v; want ErrInvalidArgument", name, err)
		}
	}
	if _, err := s.GetDocument(ctx, "x", "", "k"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("GetDocument without a tenant = %v", err)
	}
	if err := s.DeleteDocument(ctx, "", "a", "k", 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("DeleteDocument without a kind = %v", err)
	}
}

// testConcurrentDocumentUpdates: writers that read, change and write back,
// retrying on ErrConflict, lose no update.
func testConcurrentDocumentUpdates(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if err := s.PutDocument(ctx, &store.Document{Kind: "counter", Tenant: "a", Key: "n", Value: json.RawMessage(`0`)}); err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 5
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			for range each {
				for {
					d, err := s.GetDocument(ctx, "counter", "a", "n")
					if err != nil {
						errs <- err
						return
					}
					var n int
					json.Unmarshal(d.Value, &n)
					d.Value = json.RawMessage(fmt.Sprint(n + 1))
					err = s.PutDocument(ctx, d)
					if errors.Is(err, errdefs.ErrConflict) || errors.Is(err, errdefs.ErrUnavailable) {
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					break
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	d, err := s.GetDocument(ctx, "counter", "a", "n")
	if err != nil || !isJSON(d.Value, fmt.Sprint(writers*each)) || d.Revision != writers*each+1 {
		t.Errorf("after %d updates: %+v, %v", writers*each, d, err)
	}
}

// testEvents: numbering per tenant, listing after a number, by session,
// limits, and trimming that keeps the numbering going.
func testEvents(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	appendEvent := func(tenant, session, typ string, at time.Time) int64 {
		t.Helper()
		e := &store.Event{Tenant: tenant, SessionID: session, Type: typ, Data: json.RawMessage(`{"x":1}`), CreatedAt: at}
		if err := s.AppendEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
		return e.Seq
	}
	for i := range 5 {
		if got := appendEvent("acme", fmt.Sprintf("s%d", i%2), "session.created", t0.Add(time.Duration(i)*time.Minute)); got != int64(i+1) {
			t.Errorf("acme's event %d numbered %d", i+1, got)
		}
	}
	if got := appendEvent("other", "s0", "session.created", t0); got != 1 {
		t.Errorf("other tenant's first event numbered %d; want 1", got)
	}
	list := func(f store.EventFilter) []int64 {
		t.Helper()
		events, err := s.ListEvents(ctx, f)
		if err != nil {
			t.Fatalf("ListEvents(%+v) = %v", f, err)
		}
		var seqs []int64
		for _, e := range events {
			if e.Tenant != f.Tenant || e.Type != "session.created" || !isJSON(e.Data, `{"x":1}`) || e.CreatedAt.IsZero() {
				t.Errorf("listed %+v", e)
			}
			seqs = append(seqs, e.Seq)
		}
		return seqs
	}
	for _, tc := range []struct {
		f    store.EventFilter
		want string
	}{
		{store.EventFilter{Tenant: "acme"}, "[1 2 3 4 5]"},
		{store.EventFilter{Tenant: "acme", After: 3}, "[4 5]"},
		{store.EventFilter{Tenant: "acme", Limit: 2}, "[1 2]"},
		{store.EventFilter{Tenant: "acme", SessionID: "s1"}, "[2 4]"},
		{store.EventFilter{Tenant: "acme", SessionID: "s0", After: 1}, "[3 5]"},
		{store.EventFilter{Tenant: "other"}, "[1]"},
		{store.EventFilter{Tenant: "nobody"}, "[]"},
	} {
		if got := fmt.Sprint(list(tc.f)); got != tc.want {
			t.Errorf("ListEvents(%+v) = %s; want %s", tc.f, got, tc.want)
		}
	}
	// Trim all but acme's last: numbering goes on at 6, not at 2.
	n, err := s.TrimEvents(ctx, t0.Add(4*time.Minute))
	if err != nil || n != 5 {
		t.Errorf("TrimEvents = %d, %v; want 5 (acme's first four, other's one)", n, err)
	}
	if got := fmt.Sprint(list(store.EventFilter{Tenant: "acme"})); got != "[5]" {
		t.Errorf("after the trim: %s; want [5]", got)
	}
	if _, err := s.TrimEvents(ctx, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := appendEvent("acme", "s0", "session.created", t0); got != 6 {
		t.Errorf("first event after a trim of all numbered %d; want 6", got)
	}
	for name, f := range map[string]store.EventFilter{
		"no tenant":      {},
		"limit over":     {Tenant: "a", Limit: 1001},
		"negative limit": {Tenant: "a", Limit: -1},
		"negative after": {Tenant: "a", After: -1},
	} {
		if _, err := s.ListEvents(ctx, f); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: ListEvents = %v; want ErrInvalidArgument", name, err)
		}
	}
	for name, e := range map[string]*store.Event{
		"no tenant": {Type: "x", CreatedAt: t0},
		"no type":   {Tenant: "a", CreatedAt: t0},
		"no time":   {Tenant: "a", Type: "x"},
	} {
		if err := s.AppendEvent(ctx, e); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: AppendEvent = %v; want ErrInvalidArgument", name, err)
		}
	}
}

// testConcurrentEvents: appenders at once get the numbers 1..n, each once,
// and a reader that polls while they append never sees a number before it
// has seen every smaller one (numbers follow commit order).
func testConcurrentEvents(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	const appenders, each = 8, 10
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen = map[int64]bool{}
		errs = make(chan error, appenders+1)
		done = make(chan struct{})
	)
	for a := range appenders {
		wg.Go(func() {
			// Half the appenders write their events two at a time, with
			// another tenant's between: batches lock two tenants' counters.
			for i := 0; i < each; {
				evs := []*store.Event{{Tenant: "acme", Type: "execution.started", CreatedAt: time.Now()}}
				if a%2 == 1 {
					evs = append(evs, &store.Event{Tenant: "other", Type: "execution.started", CreatedAt: time.Now()},
						&store.Event{Tenant: "acme", Type: "execution.finished", CreatedAt: time.Now()})
				}
				err := s.AppendEvents(ctx, evs)
				for errors.Is(err, errdefs.ErrUnavailable) {
					err = s.AppendEvents(ctx, evs)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, e := range evs {
					if e.Tenant != "acme" {
						continue
					}
					if seen[e.Seq] {
						errs <- fmt.Errorf("number %d given twice", e.Seq)
					}
					seen[e.Seq] = true
					i++
				}
				mu.Unlock()
			}
		})
	}
	var reader sync.WaitGroup
	reader.Go(func() {
		var last int64
		for {
			select {
			case <-done:
				return
			default:
			}
			events, err := s.ListEvents(ctx, store.EventFilter{Tenant: "acme", After: last, Limit: 1000})
			if err != nil {
				errs <- err
				return
			}
			for _, e := range events {
				if e.Seq != last+1 {
					errs <- fmt.Errorf("a reader after %d saw %d first: an event committed out of order", last, e.Seq)
					return
				}
				last = e.Seq
			}
		}
	})
	wg.Wait()
	close(done)
	reader.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	events, err := s.ListEvents(ctx, store.EventFilter{Tenant: "acme", Limit: 1000})
	if err != nil || len(events) != appenders*each {
		t.Fatalf("ListEvents = %d events, %v; want %d", len(events), err, appenders*each)
	}
	for i, e := range events {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d numbered %d", i+1, e.Seq)
		}
	}
}

// isJSON reports whether a is the JSON text b, as a store may reformat it.
func isJSON(a json.RawMessage, b string) bool { return sameJSON(a, json.RawMessage(b)) }

// testAppendEvents: a batch of several tenants' events numbers each
// tenant's in order, after what the tenant had; a batch with a bad event
// records none of its events.
func testAppendEvents(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	first := &store.Event{Tenant: "b", Type: "session.created", CreatedAt: t0}
	if err := s.AppendEvent(ctx, first); err != nil || first.Seq != 1 {
		t.Fatalf("AppendEvent = %v, seq %d", err, first.Seq)
	}
	batch := []*store.Event{
		{Tenant: "b", SessionID: "s1", Type: "execution.started", CreatedAt: t0},
		{Tenant: "a", SessionID: "s2", Type: "execution.started", CreatedAt: t0},
		{Tenant: "b", SessionID: "s1", Type: "execution.finished", CreatedAt: t0},
		{Tenant: "a", SessionID: "s2", Type: "execution.finished", CreatedAt: t0},
	}
	if err := s.AppendEvents(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range batch {
		got = append(got, fmt.Sprintf("%s%d", e.Tenant, e.Seq))
	}
	if want := "b2 a1 b3 a2"; strings.Join(got, " ") != want {
		t.Errorf("numbers %v; want %s", got, want)
	}
	evs, err := s.ListEvents(ctx, store.EventFilter{Tenant: "b"})
	if err != nil || len(evs) != 3 || evs[1].Type != "execution.started" || evs[2].Type != "execution.finished" {
		t.Errorf("b's events: %v %v", evs, err)
	}
	bad := []*store.Event{
		{Tenant: "a", Type: "x", CreatedAt: t0},
		{Tenant: "a", Type: "x"}, // no time
	}
	if err := s.AppendEvents(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a batch with a bad event = %v; want ErrInvalidArgument", err)
	}
	if evs, _ := s.ListEvents(ctx, store.EventFilter{Tenant: "a"}); len(evs) != 2 {
		t.Errorf("after the refused batch a has %d events; want 2", len(evs))
	}
	if err := s.AppendEvents(ctx, nil); err != nil {
		t.Errorf("an empty batch: %v", err)
	}
}
