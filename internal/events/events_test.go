package events_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Events emitted from many goroutines are all recorded, numbered 1..n per
// tenant, each goroutine's in the order it emitted them; Last and
// Changed follow the appends.
func TestLogOrder(t *testing.T) {
	st := openStore(t)
	l := events.New(events.Options{Store: st, Log: quiet()})
	defer l.Close()
	changed := l.Changed()
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tenant := "a"
				if w%2 == 1 {
					tenant = "b"
				}
				l.Emit(events.Event{Tenant: tenant, SessionID: fmt.Sprintf("s%d", w), Type: api.EventExecutionStarted,
					Data: api.EventData{ExecutionID: fmt.Sprint(i)}})
			}
		}()
	}
	wg.Wait()
	waitFor(t, "every event recorded", func() bool { return l.Last("a") == writers/2*each && l.Last("b") == writers/2*each })
	select {
	case <-changed:
	default:
		t.Error("Changed was not closed by the appends")
	}
	for _, tenant := range []string{"a", "b"} {
		var all []*store.Event
		for after := int64(0); ; {
			page, err := st.ListEvents(context.Background(), store.EventFilter{Tenant: tenant, After: after, Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			all = append(all, page...)
			after = page[len(page)-1].Seq
		}
		next := map[string]int{}
		for i, e := range all {
			if e.Seq != int64(i+1) {
				t.Fatalf("tenant %s: event %d has number %d", tenant, i, e.Seq)
			}
			got := events.ToAPI(e)
			if want := fmt.Sprint(next[e.SessionID]); got.Data.ExecutionID != want {
				t.Fatalf("tenant %s: %s's events out of order: %s where %s was next", tenant, e.SessionID, got.Data.ExecutionID, want)
			}
			next[e.SessionID]++
		}
		if len(all) != writers/2*each {
			t.Errorf("tenant %s: %d events, want %d", tenant, len(all), writers/2*each)
		}
	}
}

// failing is a store whose appends fail while down is set.
type failing struct {
	store.Store
	down  atomic.Bool
	tries atomic.Int64
}

func (f *failing) AppendEvent(ctx context.Context, e *store.Event) error {
	f.tries.Add(1)
	if f.down.Load() {
		return fmt.Errorf("the store is away: %w", errdefs.ErrUnavailable)
	}
	return f.Store.AppendEvent(ctx, e)
}

func (f *failing) AppendEvents(ctx context.Context, events []*store.Event) error {
	f.tries.Add(1)
	if f.down.Load() {
		return fmt.Errorf("the store is away: %w", errdefs.ErrUnavailable)
	}
	return f.Store.AppendEvents(ctx, events)
}

// An append that keeps failing is given up after a few tries, and what
// comes after it is recorded; Record never waits longer than it may.
func TestLogFailures(t *testing.T) {
	f := &failing{Store: openStore(t)}
	l := events.New(events.Options{Store: f, Log: quiet(), Shared: true, RecordWait: 50 * time.Millisecond})
	defer l.Close()
	f.down.Store(true)
	start := time.Now()
	l.Record(context.Background(), events.Event{Tenant: "t", Type: api.EventSessionCreated})
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Record waited %v for a store that is away", d)
	}
	waitFor(t, "the failing append to be given up", func() bool { return f.tries.Load() >= 5 })
	f.down.Store(false)
	l.Record(context.Background(), events.Event{Tenant: "t", Type: api.EventSessionTerminated})
	waitFor(t, "the next event recorded", func() bool { return l.Last("t") == 1 })
	evs, err := f.ListEvents(context.Background(), store.EventFilter{Tenant: "t"})
	if err != nil || len(evs) != 1 || evs[0].Type != api.EventSessionTerminated {
		t.Fatalf("events: %v %v; want the one after the failure", evs, err)
	}
}

// Record on a shared store returns once its event is in: a reader sees
// it at once.
func TestRecordWaits(t *testing.T) {
	st := openStore(t)
	l := events.New(events.Options{Store: st, Log: quiet(), Shared: true})
	defer l.Close()
	for i := range 20 {
		l.Record(context.Background(), events.Event{Tenant: "t", SessionID: "s", Type: api.EventSessionPaused})
		evs, err := st.ListEvents(context.Background(), store.EventFilter{Tenant: "t", After: int64(i)})
		if err != nil || len(evs) != 1 {
			t.Fatalf("after Record %d: %d events after %d (%v), want 1", i, len(evs), i, err)
		}
	}
}

// Close appends what is queued, and drops what is emitted after it.
func TestCloseDrains(t *testing.T) {
	st := openStore(t)
	l := events.New(events.Options{Store: st, Log: quiet()})
	for range 100 {
		l.Emit(events.Event{Tenant: "t", Type: api.EventSessionCreated})
	}
	l.Close()
	l.Emit(events.Event{Tenant: "t", Type: api.EventSessionTerminated})
	l.Close() // twice is fine
	evs, err := st.ListEvents(context.Background(), store.EventFilter{Tenant: "t", Limit: 1000})
	if err != nil || len(evs) != 100 {
		t.Fatalf("%d events after Close (%v), want 100", len(evs), err)
	}
}

func TestParseTypes(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
		err  bool
	}{
		{in: nil, want: nil},
		{in: []string{"*"}, want: nil},
		{in: []string{"session.created", " execution.finished", "session.created"}, want: []string{"session.created", "execution.finished"}},
		{in: []string{"session.*", "*"}, want: nil},
		{in: []string{"session.*"}, want: []string{"session.*"}},
		{in: []string{"session.create"}, err: true},
		{in: []string{"nothing.*"}, err: true},
		{in: []string{"session"}, err: true},
	} {
		t.Run(fmt.Sprint(tc.in), func(t *testing.T) {
			got, err := events.ParseTypes(tc.in)
			if tc.err {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err %v, want invalid argument", err)
				}
				return
			}
			if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v %v, want %v", got, err, tc.want)
			}
		})
	}
	if !events.Matches([]string{"session.*"}, api.EventSessionPaused) || events.Matches([]string{"session.*"}, api.EventExecutionStarted) {
		t.Error("session.* matches wrongly")
	}
	if !events.Matches(nil, api.EventWebhookCreated) {
		t.Error("nil does not match everything")
	}
}

// Flush returns once what was emitted before it is in, without the
// queue's linger.
func TestFlush(t *testing.T) {
	st := openStore(t)
	l := events.New(events.Options{Store: st, Log: quiet(), Linger: time.Hour})
	defer l.Close()
	l.Flush(context.Background()) // nothing queued: at once
	for i := range 3 {
		l.Emit(events.Event{Tenant: "t", Type: api.EventSessionCreated})
		l.Flush(context.Background())
		evs, err := st.ListEvents(context.Background(), store.EventFilter{Tenant: "t"})
		if err != nil || len(evs) != i+1 {
			t.Fatalf("after Flush %d: %d events (%v)", i, len(evs), err)
		}
	}
}

// counting counts the store's append transactions.
type counting struct {
	store.Store
	calls atomic.Int64
}

func (c *counting) AppendEvent(ctx context.Context, e *store.Event) error {
	c.calls.Add(1)
	return c.Store.AppendEvent(ctx, e)
}

func (c *counting) AppendEvents(ctx context.Context, events []*store.Event) error {
	c.calls.Add(1)
	return c.Store.AppendEvents(ctx, events)
}

// Events that come while the queue lingers go to the store in one
// transaction, numbered in the order they came.
func TestBatched(t *testing.T) {
	c := &counting{Store: openStore(t)}
	l := events.New(events.Options{Store: c, Log: quiet(), Linger: time.Hour})
	for i := range 5 {
		l.Emit(events.Event{Tenant: "t", SessionID: fmt.Sprint(i), Type: api.EventExecutionStarted})
	}
	l.Close() // appends what is queued
	if n := c.calls.Load(); n != 1 {
		t.Errorf("%d append transactions for 5 events queued together; want 1", n)
	}
	evs, err := c.ListEvents(context.Background(), store.EventFilter{Tenant: "t"})
	if err != nil || len(evs) != 5 {
		t.Fatalf("events: %v %v", evs, err)
	}
	for i, e := range evs {
		if e.Seq != int64(i+1) || e.SessionID != fmt.Sprint(i) {
			t.Errorf("event %d: seq %d session %s", i, e.Seq, e.SessionID)
		}
	}
}
