//go:build integration

package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
)

// hookLog is a webhook receiver in the test process (the replicas run
// with --webhook-allow-private): each delivery it verified, by its
// X-Sbx-Delivery.
type hookLog struct {
	*httptest.Server
	mu     sync.Mutex
	secret string
	got    []api.Event
	times  map[string]int
	bad    []string
}

func newHookLog(t *testing.T) *hookLog {
	h := &hookLog{times: map[string]int{}}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		if err := client.VerifyWebhook(h.secret, r.Header, body, 0); err != nil {
			h.bad = append(h.bad, err.Error())
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev api.Event
		json.Unmarshal(body, &ev)
		h.got = append(h.got, ev)
		h.times[r.Header.Get(api.HeaderWebhookDelivery)]++
	}))
	t.Cleanup(h.Close)
	return h
}

// of returns the session's events delivered so far, in the order they came.
func (h *hookLog) of(sid string) []api.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []api.Event
	for _, e := range h.got {
		if e.SessionID == sid {
			out = append(out, e)
		}
	}
	return out
}

func types(evs []api.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// 11. Events made through any replica are in one order that a stream on
// another replica follows; the webhook is sent each once, by the replica
// that leads, and when that one dies, the next one goes on from its
// cursor: nothing is lost.
func (cl *cluster) testEventsAcross(t *testing.T) {
	cl.ensureAll(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lead, holder := cl.leader(t, leaderTTL+2*reapInterval)
	var others []int
	for i := range cl.reps {
		if i != lead {
			others = append(others, i)
		}
	}
	a, b := others[0], others[1]
	t.Logf("the leader is replica %d (%s); the stream is on replica %d", lead, holder, b)

	hooks := newHookLog(t)
	h, err := cl.c(a).CreateWebhook(ctx, api.WebhookRequest{URL: hooks.URL, Events: []string{"session.*", "execution.*"}})
	if err != nil {
		t.Fatal(err)
	}
	hooks.mu.Lock()
	hooks.secret = h.Secret
	hooks.mu.Unlock()
	const sid = "events-across"
	stream, err := cl.c(b).Events(ctx, client.EventsOptions{SessionID: sid})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var seen []api.Event
	next := func(want string) {
		t.Helper()
		ev, err := stream.Next()
		if err != nil {
			t.Fatalf("the stream on replica %d after %v: %v", b, types(seen), err)
		}
		seen = append(seen, *ev)
		if ev.Type != want {
			t.Fatalf("the stream on replica %d: %v, want %s last\nlogs:\n%s", b, types(seen), want, cl.logs(40, sid))
		}
	}

	cl.create(t, a, api.CreateSessionRequest{SessionID: sid})
	next(api.EventSessionCreated)
	cl.exec(t, lead, sid, api.ExecuteRequest{Code: "print(1)"})
	next(api.EventSessionStarting)
	next(api.EventSessionRunning)
	next(api.EventExecutionStarted)
	// An execution's end is recorded beside its result, not before it:
	// the next change through another replica waits until it is seen.
	next(api.EventExecutionFinished)
	if _, err := cl.c(b).PauseSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	next(api.EventSessionPaused)
	if _, err := cl.c(a).ResumeSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	next(api.EventSessionResumed)
	if _, err := cl.c(lead).DeleteSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	next(api.EventSessionTerminated)
	for i := 1; i < len(seen); i++ {
		if seen[i].ID <= seen[i-1].ID {
			t.Errorf("the stream: event %d after %d", seen[i].ID, seen[i-1].ID)
		}
	}

	waitDelivered := func(sid string, n int, within time.Duration) []api.Event {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			got := hooks.of(sid)
			if len(got) >= n {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("the webhook got %v of %s in %v, want %d events\nlogs:\n%s", types(got), sid, within, n, cl.logs(40, "webhook"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	got := waitDelivered(sid, len(seen), time.Minute)
	if !slices.Equal(types(got), types(seen)) {
		t.Errorf("the webhook got %v, the stream %v", types(got), types(seen))
	}
	hooks.mu.Lock()
	for id, n := range hooks.times {
		if n != 1 {
			t.Errorf("delivery %s came %d times", id, n)
		}
	}
	if len(hooks.bad) > 0 {
		t.Errorf("deliveries that did not verify: %v", hooks.bad)
	}
	hooks.mu.Unlock()

	// The leader dies; what happens meanwhile is delivered by the next.
	cl.stop(t, lead, syscall.SIGKILL)
	const sid2 = "events-failover"
	cl.create(t, a, api.CreateSessionRequest{SessionID: sid2})
	if _, err := cl.c(b).PauseSession(ctx, sid2); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.c(a).DeleteSession(ctx, sid2); err != nil {
		t.Fatal(err)
	}
	got = waitDelivered(sid2, 3, leaderTTL+2*beatEvery+30*time.Second)
	if want := []string{api.EventSessionCreated, api.EventSessionPaused, api.EventSessionTerminated}; !slices.Equal(types(got), want) {
		t.Errorf("after the failover the webhook got %v, want %v", types(got), want)
	}
	newLead, holder := cl.leader(t, time.Second)
	t.Logf("replica %d (%s) delivers now", newLead, holder)
	log, err := cl.c(b).WebhookDeliveries(ctx, h.WebhookID)
	if err != nil || len(log.Deliveries) < len(seen)+3 || !log.Deliveries[0].OK {
		t.Errorf("the delivery log through replica %d: %+v %v", b, log, err)
	}
	if err := cl.c(b).DeleteWebhook(ctx, h.WebhookID); err != nil {
		t.Error(err)
	}
}
