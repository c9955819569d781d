package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/webhook"
)

// withEvents makes webhooks fast to retry and lets them reach the test's
// receivers on loopback.
func withEvents(c *app.Config) {
	c.Events.WebhookAllowPrivate = true
	c.Events.WebhookRetry = webhook.Retry{Attempts: 3, Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	c.Events.Poll = 20 * time.Millisecond
}

// eventsOf reads every event of the session (or all, for "") after after.
func eventsOf(t *testing.T, c *client.Client, sid string, after int64) []api.Event {
	t.Helper()
	var out []api.Event
	for {
		page, err := c.ListEvents(context.Background(), client.EventsOptions{SessionID: sid, After: after, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page.Events...)
		if len(page.Events) == 0 {
			return out
		}
		after = page.NextAfter
	}
}

func typesOf(evs []api.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// waitEvents polls the session's events until there are at least n.
func waitEvents(t *testing.T, c *client.Client, sid string, n int) []api.Event {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		evs := eventsOf(t, c, sid, 0)
		if len(evs) >= n {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events of %q after 20s, want %d: %v", len(evs), sid, n, typesOf(evs))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Every lifecycle change is an event, in order, with what it did: read
// as pages, as a stream, and from the middle with Last-Event-ID.
func TestSessionEvents(t *testing.T) {
	ts := startConfigured(t, withEvents)
	c := ts.client("")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.Events(ctx, client.EventsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()

	const sid = "ev1"
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid, Metadata: map[string]string{"user_id": "alice"}, EnvVars: map[string]string{"TOKEN": "hunter2"}}); err != nil {
		t.Fatal(err)
	}
	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	_, err = c.PauseSession(ctx, sid)
	step("pause", err)
	_, err = c.ListFiles(ctx, sid, client.ListFilesOptions{}) // a file call thaws it
	step("list files", err)
	_, err = c.HibernateSession(ctx, sid)
	step("hibernate", err)
	_, err = c.ListFiles(ctx, sid, client.ListFilesOptions{}) // and restores it
	step("list files", err)
	snap, err := c.CreateSnapshot(ctx, sid)
	step("snapshot", err)
	_, err = c.RestoreSnapshot(ctx, sid, snap.SnapshotID)
	step("restore", err)
	_, err = c.Keepalive(ctx, sid, 0) // no event
	step("keepalive", err)
	_, err = c.DeleteSession(ctx, sid)
	step("delete", err)

	want := []string{
		api.EventSessionCreated, api.EventSessionPaused, api.EventSessionResumed, api.EventSessionHibernated,
		api.EventSessionRestored, api.EventSessionSnapshot, api.EventSessionSnapshotRestored, api.EventSessionTerminated,
	}
	evs := waitEvents(t, c, sid, len(want))
	if got := typesOf(evs); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	status := []string{api.StatusRunning, api.StatusPaused, api.StatusRunning, api.StatusHibernated, api.StatusRunning, api.StatusRunning, api.StatusRunning, api.StatusTerminated}
	for i, e := range evs {
		if e.ID != int64(i+1) || e.SessionID != sid || e.Data.Status != status[i] || e.Data.TemplateID == "" || e.CreatedAt.IsZero() {
			t.Errorf("event %d: %+v", i, e)
		}
	}
	if evs[0].Data.Metadata["user_id"] != "alice" || evs[1].Data.Reason != "request" || evs[5].Data.SnapshotID != snap.SnapshotID {
		t.Errorf("data: created %+v, paused %+v, snapshot %+v", evs[0].Data, evs[1].Data, evs[5].Data)
	}
	raw, _ := json.Marshal(evs)
	if strings.Contains(string(raw), "hunter2") {
		t.Errorf("an event holds an environment variable's value: %s", raw)
	}

	// The stream has them too, in the same order.
	for i, w := range want {
		ev, err := stream.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type != w || ev.ID != int64(i+1) {
			t.Errorf("stream event %d: %d %s, want %d %s", i, ev.ID, ev.Type, i+1, w)
		}
	}

	// Resumed from the middle: Last-Event-ID wins over ?after=.
	resp, body := streamUntil(t, ts, "/api/v1/events?after=1", "id: 8\n", "Last-Event-ID", "5")
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if ids := sseIDs(body); fmt.Sprint(ids) != "[6 7 8]" {
		t.Errorf("resumed after 5: ids %v\n%s", ids, body)
	}
	// Filtered: skipped events move the id on.
	_, body = streamUntil(t, ts, "/api/v1/sessions/"+sid+"/events?types=session.paused,session.snapshot", "id: 8\n")
	if !strings.Contains(body, "event: session.paused") || !strings.Contains(body, "event: session.snapshot\n") ||
		strings.Contains(body, "session.created") || !strings.Contains(body, "id: 8\n") {
		t.Errorf("filtered stream:\n%s", body)
	}
	page, err := c.ListEvents(ctx, client.EventsOptions{Types: []string{"session.hibernated", "session.restored"}})
	if err != nil || len(page.Events) != 2 || page.Events[0].Type != api.EventSessionHibernated || page.NextAfter != 8 {
		t.Errorf("filtered page: %+v %v", page, err)
	}
	for _, bad := range []string{"?types=nope", "?after=-1", "?limit=0", "?session_id=a/b"} {
		if resp, b := ts.do(t, "GET", "/api/v1/events"+bad, "", nil); resp.StatusCode != 400 {
			t.Errorf("%s: %d %s", bad, resp.StatusCode, b)
		}
	}
	if resp, b := ts.do(t, "GET", "/api/v1/sessions/nosuch/events", "", nil); resp.StatusCode != 404 {
		t.Errorf("events of no session: %d %s", resp.StatusCode, b)
	}
}

// streamUntil reads an event stream until what came has the line last
// (or a generous deadline passes), and returns what came.
func streamUntil(t *testing.T, ts *testServer, path, last string, hdr ...string) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+path, nil)
	req.Header.Set("Accept", "text/event-stream")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body strings.Builder
	buf := make([]byte, 4096)
	for !strings.Contains(body.String(), last) {
		n, err := resp.Body.Read(buf)
		body.Write(buf[:n])
		if err != nil {
			break // the end, or the deadline: the caller's checks say what is missing
		}
	}
	return resp, body.String()
}

func sseIDs(body string) []string {
	var ids []string
	for _, block := range strings.Split(body, "\n\n") {
		if strings.Contains(block, "\ndata: ") && strings.HasPrefix(block, "id: ") {
			ids = append(ids, strings.TrimPrefix(strings.SplitN(block, "\n", 2)[0], "id: "))
		}
	}
	return ids
}

// Without a runtime an execution never runs: its session tells of the
// start that failed, and the execution of its end, after a resume that
// tries to start a sandbox.
func TestExecutionEventsWithoutRuntime(t *testing.T) {
	ts := startConfigured(t, withEvents)
	c := ts.client("")
	ctx := context.Background()
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "x"}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Submit(ctx, "x", api.ExecuteRequest{Code: "print(1)"})
	if err != nil {
		t.Fatal(err)
	}
	evs := waitEvents(t, c, "x", 4)
	want := []string{api.EventSessionCreated, api.EventSessionStarting, api.EventSessionError, api.EventExecutionFinished}
	if got := typesOf(evs); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	fin := evs[3].Data
	if fin.ExecutionID != sub.ExecutionID || fin.Status != api.ExecFailed || fin.ErrorType != api.ErrTypeSandboxUnavailable || fin.Language != "python" {
		t.Errorf("execution.finished: %+v", fin)
	}
	if evs[2].Data.Error == "" || evs[2].Data.Status != api.StatusError {
		t.Errorf("session.error: %+v", evs[2].Data)
	}
}

// A tenant's streams, pages and webhooks never show another's events,
// and another's session's events are 404.
func TestEventTenancy(t *testing.T) {
	ts := startConfigured(t, withEvents, "key-alpha-123:alpha", "key-beta-4567:beta")
	alpha, beta := ts.client("key-alpha-123"), ts.client("key-beta-4567")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bs, err := beta.Events(ctx, client.EventsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	if _, _, err := alpha.CreateSession(ctx, api.CreateSessionRequest{SessionID: "a1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := alpha.DeleteSession(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := beta.CreateSession(ctx, api.CreateSessionRequest{SessionID: "b1"}); err != nil {
		t.Fatal(err)
	}
	ev, err := bs.Next()
	if err != nil || ev.SessionID != "b1" || ev.ID != 1 || ev.Type != api.EventSessionCreated {
		t.Fatalf("beta's first event: %+v %v", ev, err)
	}
	if l := eventsOf(t, beta, "", 0); len(l) != 1 {
		t.Errorf("beta's events: %v", typesOf(l))
	}
	if l := eventsOf(t, alpha, "", 0); len(l) != 2 || l[0].SessionID != "a1" {
		t.Errorf("alpha's events: %+v", l)
	}
	if _, err := beta.SessionEvents(ctx, "a1", 0, 0); !client.IsNotFound(err) {
		t.Errorf("beta reads alpha's session's events: %v", err)
	}
	if p, err := beta.ListEvents(ctx, client.EventsOptions{SessionID: ""}); err != nil || len(p.Events) != 1 {
		t.Errorf("beta's page: %+v %v", p, err)
	}
	resp, b := ts.do(t, "GET", "/api/v1/events?session_id=a1", "", nil, "X-API-Key", "key-beta-4567")
	if resp.StatusCode != 200 || strings.Contains(string(b), "a1") {
		t.Errorf("beta filtering on alpha's session: %d %s", resp.StatusCode, b)
	}
}

// hookReceiver collects the deliveries a webhook gets, verified.
type hookReceiver struct {
	*httptest.Server
	mu     sync.Mutex
	secret string
	got    []api.Event
	errs   []error
}

func newHookReceiver(t *testing.T) *hookReceiver {
	h := &hookReceiver{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		if err := client.VerifyWebhook(h.secret, r.Header, body, 0); err != nil {
			h.errs = append(h.errs, err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev api.Event
		if err := json.Unmarshal(body, &ev); err != nil {
			h.errs = append(h.errs, err)
		}
		h.got = append(h.got, ev)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hookReceiver) events() ([]api.Event, []error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]api.Event(nil), h.got...), append([]error(nil), h.errs...)
}

// Webhooks over HTTP: created (secret once), listed, delivered signed
// and in order, their log read, deleted; another tenant's are 404; the
// cap is 429; loopback is refused unless the server allows it.
func TestWebhooksHTTP(t *testing.T) {
	ts := startConfigured(t, func(c *app.Config) { withEvents(c); c.Events.MaxWebhooks = 3 }, "key-alpha-123:alpha", "key-beta-4567:beta")
	alpha, beta := ts.client("key-alpha-123"), ts.client("key-beta-4567")
	ctx := context.Background()
	rc := newHookReceiver(t)
	h, err := alpha.CreateWebhook(ctx, api.WebhookRequest{URL: rc.URL + "/hook", Events: []string{"session.*"}})
	if err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	rc.secret = h.Secret
	rc.mu.Unlock()
	if got, err := alpha.GetWebhook(ctx, h.WebhookID); err != nil || got.Secret != "" || got.URL != rc.URL+"/hook" {
		t.Errorf("get: %+v %v", got, err)
	}
	if l, err := alpha.ListWebhooks(ctx); err != nil || len(l) != 1 || l[0].Secret != "" {
		t.Errorf("list: %+v %v", l, err)
	}
	for _, sid := range []string{"w1", "w2"} {
		if _, _, err := alpha.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid}); err != nil {
			t.Fatal(err)
		}
		if _, err := alpha.PauseSession(ctx, sid); err != nil {
			t.Fatal(err)
		}
		if _, err := alpha.DeleteSession(ctx, sid); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	var got []api.Event
	for len(got) < 6 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		got, _ = rc.events()
	}
	_, errs := rc.events()
	if len(errs) > 0 {
		t.Errorf("deliveries that did not verify: %v", errs)
	}
	var seen []string
	for i, e := range got {
		seen = append(seen, e.SessionID+" "+e.Type)
		if i > 0 && e.ID <= got[i-1].ID {
			t.Errorf("event %d after %d", e.ID, got[i-1].ID)
		}
	}
	want := "[w1 session.created w1 session.paused w1 session.terminated w2 session.created w2 session.paused w2 session.terminated]"
	if fmt.Sprint(seen) != want {
		t.Errorf("delivered %v, want %s", seen, want)
	}
	log, err := alpha.WebhookDeliveries(ctx, h.WebhookID)
	if err != nil || len(log.Deliveries) < 6 || !log.Deliveries[0].OK {
		t.Errorf("delivery log: %+v %v", log, err)
	}

	// Beta cannot see, read or delete alpha's webhook.
	if _, err := beta.GetWebhook(ctx, h.WebhookID); !client.IsNotFound(err) {
		t.Errorf("beta get: %v", err)
	}
	if _, err := beta.WebhookDeliveries(ctx, h.WebhookID); !client.IsNotFound(err) {
		t.Errorf("beta deliveries: %v", err)
	}
	if err := beta.DeleteWebhook(ctx, h.WebhookID); !client.IsNotFound(err) {
		t.Errorf("beta delete: %v", err)
	}
	if l, _ := beta.ListWebhooks(ctx); len(l) != 0 {
		t.Errorf("beta lists %v", l)
	}

	// The cap.
	for range 2 {
		if _, err := alpha.CreateWebhook(ctx, api.WebhookRequest{URL: rc.URL + "/more"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = alpha.CreateWebhook(ctx, api.WebhookRequest{URL: rc.URL + "/one-too-many"})
	if ae, ok := err.(*client.APIError); !ok || ae.StatusCode != 429 {
		t.Errorf("past the cap: %v", err)
	}
	if err := alpha.DeleteWebhook(ctx, h.WebhookID); err != nil {
		t.Fatal(err)
	}
	if _, err := alpha.GetWebhook(ctx, h.WebhookID); !client.IsNotFound(err) {
		t.Errorf("after delete: %v", err)
	}
	resp, b := ts.do(t, "POST", "/api/v1/webhooks", "application/json", strings.NewReader(`{"url":"http://x.example/","bogus":1}`), "X-API-Key", "key-alpha-123")
	if resp.StatusCode != 400 {
		t.Errorf("unknown field: %d %s", resp.StatusCode, b)
	}

	// A server that does not allow private destinations refuses them.
	strict := start(t)
	for _, u := range []string{rc.URL, "http://localhost:7070/", "http://169.254.169.254/latest/meta-data/"} {
		_, err := strict.client("").CreateWebhook(ctx, api.WebhookRequest{URL: u})
		if ae, ok := err.(*client.APIError); !ok || ae.StatusCode != 400 {
			t.Errorf("%s on a strict server: %v", u, err)
		}
	}
}

// Events and metrics read while sessions change state: every reader sees
// ids 1, 2, 3... with no gap and no repeat, pages and streams alike.
func TestEventsWhileChanging(t *testing.T) {
	ts := startConfigured(t, withEvents)
	c := ts.client("")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const sessions, rounds = 4, 5
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sid := fmt.Sprintf("busy-%d", i)
			if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid}); err != nil {
				errs <- err
				return
			}
			for range rounds {
				for _, f := range []func() error{
					func() error { _, err := c.PauseSession(ctx, sid); return err },
					func() error { _, err := c.ListFiles(ctx, sid, client.ListFilesOptions{}); return err },
					func() error { _, err := c.HibernateSession(ctx, sid); return err },
					func() error { _, err := c.ListFiles(ctx, sid, client.ListFilesOptions{}); return err },
				} {
					if err := f(); err != nil {
						errs <- err
						return
					}
				}
			}
			if _, err := c.DeleteSession(ctx, sid); err != nil {
				errs <- err
			}
		}()
	}
	total := sessions * (2 + 4*rounds)
	readers := make(chan []int64, 3)
	var rwg sync.WaitGroup
	for r := range 3 {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			var ids []int64
			if r == 0 { // a stream
				s, err := c.Events(ctx, client.EventsOptions{})
				if err != nil {
					errs <- err
					return
				}
				defer s.Close()
				for len(ids) < total {
					ev, err := s.Next()
					if err != nil {
						errs <- err
						break
					}
					ids = append(ids, ev.ID)
				}
			} else { // pages, and the metrics, as fast as they come
				after := int64(0)
				deadline := time.Now().Add(30 * time.Second)
				for len(ids) < total && time.Now().Before(deadline) {
					page, err := c.ListEvents(ctx, client.EventsOptions{After: after, Limit: 3})
					if err != nil {
						errs <- err
						break
					}
					for _, e := range page.Events {
						ids = append(ids, e.ID)
					}
					after = page.NextAfter
					if resp, _ := ts.do(t, "GET", "/metrics", "", nil); resp.StatusCode != 200 {
						errs <- fmt.Errorf("metrics: %d", resp.StatusCode)
					}
				}
			}
			readers <- ids
		}()
	}
	wg.Wait()
	rwg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	close(readers)
	for ids := range readers {
		if len(ids) != total {
			t.Errorf("a reader saw %d events, want %d", len(ids), total)
		}
		for i, id := range ids {
			if id != int64(i+1) {
				t.Fatalf("a reader saw event %d at %d: %v", id, i, ids)
			}
		}
	}
}

// The reaper's changes are events too, with reason idle (and ttl): a
// session without a sandbox hibernates after its hibernate_timeout and
// expires at its TTL.
func TestReaperEvents(t *testing.T) {
	ts := startConfigured(t, func(c *app.Config) { withEvents(c); c.ReapInterval = 50 * time.Millisecond })
	c := ts.client("")
	if _, _, err := c.CreateSession(context.Background(), api.CreateSessionRequest{SessionID: "idle", HibernateTimeout: 1, Timeout: 3}); err != nil {
		t.Fatal(err)
	}
	evs := waitEvents(t, c, "idle", 3)
	want := []string{api.EventSessionCreated, api.EventSessionHibernated, api.EventSessionExpired}
	if got := typesOf(evs); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if evs[1].Data.Reason != "idle" || evs[2].Data.Reason != "ttl" || evs[2].Data.Status != api.StatusTerminated {
		t.Errorf("hibernated %+v, expired %+v", evs[1].Data, evs[2].Data)
	}
}

// A tenant may hold --limits streams=N event streams open; the next is
// 429, and another tenant's streams are not counted against it.
func TestEventStreamCap(t *testing.T) {
	const maxStreams = 8
	ts := startConfigured(t, func(c *app.Config) { withEvents(c); c.Limits.Streams = maxStreams }, "key-alpha-123:alpha", "key-beta-4567:beta")
	open := func(key string) (*http.Response, context.CancelFunc) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/api/v1/events", nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp, cancel
	}
	for range maxStreams {
		resp, cancel := open("key-alpha-123")
		defer cancel()
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream: %d", resp.StatusCode)
		}
	}
	resp, cancel := open("key-alpha-123")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cancel()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("one stream past the cap: %d %s", resp.StatusCode, b)
	}
	resp, cancel = open("key-beta-4567")
	resp.Body.Close()
	cancel()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("another tenant's stream: %d", resp.StatusCode)
	}
}
