package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
	"github.com/sbx-sandbox/sbx/internal/webhook"
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

// fast is a retry schedule for tests: 4 attempts, 5 ms apart and up.
var fast = webhook.Retry{Attempts: 4, Base: 5 * time.Millisecond, Max: 20 * time.Millisecond}

// rig is a store, an event log and a webhook service on it.
type rig struct {
	st  store.Store
	log *events.Log
	svc *webhook.Service
}

func newRig(t *testing.T, st store.Store, configure func(*webhook.Options)) *rig {
	t.Helper()
	if st == nil {
		st = openStore(t)
	}
	l := events.New(events.Options{Store: st, Log: quiet()})
	opt := webhook.Options{Store: st, Events: l, Log: quiet(), AllowPrivate: true, Retry: fast, Poll: 20 * time.Millisecond}
	if configure != nil {
		configure(&opt)
	}
	r := &rig{st: st, log: l, svc: webhook.New(opt)}
	t.Cleanup(func() {
		r.svc.Close()
		r.log.Close()
	})
	return r
}

// emit records n events of session s for tenant and waits until they are in.
func (r *rig) emit(t *testing.T, tenant, s string, n int) {
	t.Helper()
	for range n {
		r.log.Emit(events.Event{Tenant: tenant, SessionID: s, Type: api.EventExecutionFinished, Data: api.EventData{Status: api.ExecCompleted}})
	}
	waitFor(t, "events recorded", func() bool {
		evs, _ := r.st.ListEvents(context.Background(), store.EventFilter{Tenant: tenant, Limit: 1000})
		c := 0
		for _, e := range evs {
			if e.SessionID == s {
				c++
			}
		}
		return c >= n
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// received is one request a receiver got.
type received struct {
	event    api.Event
	delivery string
	status   int
	err      error // its verification
}

// receiver is a webhook endpoint: answer says what to answer to the
// n-th (from 1) request for an event.
type receiver struct {
	*httptest.Server
	secret string
	answer func(ev api.Event, n int) int

	mu   sync.Mutex
	got  []received
	seen map[int64]int
}

func newReceiver(t *testing.T, answer func(ev api.Event, n int) int) *receiver {
	rc := &receiver{answer: answer, seen: map[int64]int{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev api.Event
		json.Unmarshal(body, &ev)
		rc.mu.Lock()
		verr := client.VerifyWebhook(rc.secret, r.Header, body, 0)
		if r.Header.Get(api.HeaderWebhookEvent) != ev.Type {
			verr = fmt.Errorf("X-Sbx-Event %q, the body says %q", r.Header.Get(api.HeaderWebhookEvent), ev.Type)
		}
		rc.seen[ev.ID]++
		status := http.StatusNoContent
		if rc.answer != nil {
			status = rc.answer(ev, rc.seen[ev.ID])
		}
		rc.got = append(rc.got, received{event: ev, delivery: r.Header.Get(api.HeaderWebhookDelivery), status: status, err: verr})
		rc.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// delivered is the events answered with a 2xx, in the order they were.
func (rc *receiver) delivered() []int64 {
	var out []int64
	for _, r := range rc.requests() {
		if r.status/100 == 2 {
			out = append(out, r.event.ID)
		}
	}
	return out
}

func (r *rig) create(t *testing.T, tenant string, req api.WebhookRequest) *api.Webhook {
	t.Helper()
	h, err := r.svc.Create(context.Background(), tenant, req)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// Signatures are HMAC-SHA256 of "timestamp.body"; the Go client verifies
// them, and refuses a wrong secret, another body and an old timestamp.
func TestSignature(t *testing.T) {
	body := []byte(`{"id":1,"type":"session.created"}`)
	now := time.Now().Unix()
	sig := webhook.Sign("s3cret-s3cret-s3cret", now, body)
	if !strings.HasPrefix(sig, "sha256=") || len(sig) != len("sha256=")+64 {
		t.Fatalf("signature %q", sig)
	}
	// Worked out apart: printf '1700000000.{}' | openssl dgst -sha256 -hmac key
	if got := webhook.Sign("key", 1700000000, []byte("{}")); got != "sha256=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae" {
		t.Errorf("Sign(key, 1700000000, {}) = %s", got)
	}
	h := http.Header{}
	h.Set(api.HeaderWebhookTimestamp, fmt.Sprint(now))
	h.Set(api.HeaderWebhookSignature, sig)
	if err := client.VerifyWebhook("s3cret-s3cret-s3cret", h, body, 0); err != nil {
		t.Errorf("a good delivery: %v", err)
	}
	for name, f := range map[string]func() error{
		"wrong secret": func() error { return client.VerifyWebhook("another-secret-000", h, body, 0) },
		"other body":   func() error { return client.VerifyWebhook("s3cret-s3cret-s3cret", h, append(body, ' '), 0) },
		"old": func() error {
			old := now - 3600
			h2 := http.Header{}
			h2.Set(api.HeaderWebhookTimestamp, fmt.Sprint(old))
			h2.Set(api.HeaderWebhookSignature, webhook.Sign("s3cret-s3cret-s3cret", old, body))
			return client.VerifyWebhook("s3cret-s3cret-s3cret", h2, body, 5*time.Minute)
		},
		"no signature": func() error {
			h2 := h.Clone()
			h2.Del(api.HeaderWebhookSignature)
			return client.VerifyWebhook("s3cret-s3cret-s3cret", h2, body, 0)
		},
	} {
		if err := f(); !errors.Is(err, client.ErrWebhookSignature) {
			t.Errorf("%s: %v, want ErrWebhookSignature", name, err)
		}
	}
}

func TestRetrySchedule(t *testing.T) {
	r := webhook.Retry{Attempts: 6, Base: time.Second, Max: 10 * time.Second}
	var got []time.Duration
	for n := 1; n <= 6; n++ {
		got = append(got, r.Delay(n))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("delays %v, want %v", got, want)
	}
}

// An event whose first attempts fail is sent again until it is taken,
// and the next event goes only after it: the receiver sees each event
// taken once, in order, every request signed, and the delivery log has
// every attempt.
func TestRetriesInOrder(t *testing.T) {
	r := newRig(t, nil, nil)
	rc := newReceiver(t, func(ev api.Event, n int) int {
		if ev.Data.Status == api.ExecCompleted && n <= 2 {
			return http.StatusServiceUnavailable // each event fails twice
		}
		return http.StatusOK
	})
	h := r.create(t, "a", api.WebhookRequest{URL: rc.URL, Events: []string{"execution.*"}})
	rc.mu.Lock()
	rc.secret = h.Secret
	rc.mu.Unlock()
	r.svc.Start()
	r.log.Emit(events.Event{Tenant: "a", SessionID: "s", Type: api.EventSessionCreated}) // not of its types
	r.emit(t, "a", "s", 5)
	waitFor(t, "5 events delivered", func() bool { return len(rc.delivered()) == 5 })
	reqs := rc.requests()
	var last int64
	for i, q := range reqs {
		if q.err != nil {
			t.Errorf("request %d: %v", i, q.err)
		}
		if q.event.Type != api.EventExecutionFinished {
			t.Errorf("request %d: type %s, which the webhook does not want", i, q.event.Type)
		}
		if q.event.ID < last {
			t.Errorf("request %d: event %d after event %d", i, q.event.ID, last)
		}
		if q.event.ID > last && i > 0 && reqs[i-1].status/100 != 2 {
			t.Errorf("request %d: event %d sent before event %d was taken", i, q.event.ID, last)
		}
		if want := fmt.Sprintf("%s-%d", h.WebhookID, q.event.ID); q.delivery != want {
			t.Errorf("request %d: X-Sbx-Delivery %q, want %q", i, q.delivery, want)
		}
		last = q.event.ID
	}
	if len(reqs) != 15 {
		t.Errorf("%d requests, want 15 (3 per event)", len(reqs))
	}
	var log *api.WebhookDeliveryList
	waitFor(t, "the last attempt in the log", func() bool {
		var err error
		log, err = r.svc.Deliveries(context.Background(), "a", h.WebhookID)
		return err == nil && log.After == last
	})
	if len(log.Deliveries) != 15 {
		t.Fatalf("delivery log: %d attempts, after %d; want 15, %d", len(log.Deliveries), log.After, last)
	}
	newest := log.Deliveries[0]
	if !newest.OK || !newest.Final || newest.Attempt != 3 || newest.EventID != last || newest.StatusCode != http.StatusOK {
		t.Errorf("newest attempt: %+v", newest)
	}
	if d := log.Deliveries[2]; d.OK || d.Final || d.Attempt != 1 || d.StatusCode != http.StatusServiceUnavailable || d.Error == "" {
		t.Errorf("a failed attempt: %+v", d)
	}
}

// An event that is never taken is given up after the last attempt, and
// the next is sent.
func TestGiveUp(t *testing.T) {
	r := newRig(t, nil, nil)
	var first atomic.Int64
	rc := newReceiver(t, func(ev api.Event, n int) int {
		first.CompareAndSwap(0, ev.ID)
		if ev.ID == first.Load() {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	h := r.create(t, "a", api.WebhookRequest{URL: rc.URL})
	rc.secret = h.Secret
	r.svc.Start()
	r.emit(t, "a", "s", 2)
	waitFor(t, "the second event delivered", func() bool { return len(rc.delivered()) == 1 })
	reqs := rc.requests()
	if len(reqs) != fast.Attempts+1 {
		t.Fatalf("%d requests, want %d attempts of the first event and one of the second", len(reqs), fast.Attempts)
	}
	var log *api.WebhookDeliveryList
	waitFor(t, "the last attempt in the log", func() bool {
		log, _ = r.svc.Deliveries(context.Background(), "a", h.WebhookID)
		return log != nil && len(log.Deliveries) == fast.Attempts+1
	})
	gaveUp := log.Deliveries[1]
	if gaveUp.OK || !gaveUp.Final || gaveUp.Attempt != fast.Attempts || gaveUp.StatusCode != 500 {
		t.Errorf("the last attempt of the first event: %+v", gaveUp)
	}
}

// A webhook resumes after a restart (a new service on the store) where
// the last one stopped: nothing delivered is sent again, nothing is lost.
func TestResume(t *testing.T) {
	st := openStore(t)
	rc := newReceiver(t, nil)
	r1 := newRig(t, st, nil)
	h := r1.create(t, "a", api.WebhookRequest{URL: rc.URL})
	rc.secret = h.Secret
	r1.svc.Start()
	r1.emit(t, "a", "s", 3)
	waitFor(t, "3 delivered", func() bool { return len(rc.delivered()) == 3 })
	r1.svc.Close()
	r1.emit(t, "a", "s2", 2)
	r2 := newRig(t, st, nil)
	r2.svc.Start()
	waitFor(t, "5 delivered", func() bool { return len(rc.delivered()) >= 5 })
	time.Sleep(100 * time.Millisecond) // anything sent twice would come now
	seen := map[string]int{}
	for _, q := range rc.requests() {
		seen[q.delivery]++
		if q.err != nil {
			t.Error(q.err)
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
	if len(seen) != 5 {
		t.Errorf("%d deliveries, want 5", len(seen))
	}
}

// Only the leader delivers.
func TestLeaderOnly(t *testing.T) {
	var lead atomic.Bool
	r := newRig(t, nil, func(o *webhook.Options) { o.Leader = lead.Load })
	rc := newReceiver(t, nil)
	h := r.create(t, "a", api.WebhookRequest{URL: rc.URL})
	rc.secret = h.Secret
	r.svc.Start()
	r.emit(t, "a", "s", 1)
	time.Sleep(200 * time.Millisecond) // ten polls
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("a process that does not lead sent %d requests", n)
	}
	lead.Store(true)
	waitFor(t, "delivered once leading", func() bool { return len(rc.delivered()) == 1 })
}

// The deliveries of a webhook stop when it is deleted.
func TestDeleteStops(t *testing.T) {
	r := newRig(t, nil, nil)
	rc := newReceiver(t, nil)
	h := r.create(t, "a", api.WebhookRequest{URL: rc.URL})
	rc.secret = h.Secret
	r.svc.Start()
	r.emit(t, "a", "s", 1)
	waitFor(t, "delivered", func() bool { return len(rc.delivered()) == 1 })
	if err := r.svc.Delete(context.Background(), "a", h.WebhookID); err != nil {
		t.Fatal(err)
	}
	r.emit(t, "a", "s2", 2)
	time.Sleep(200 * time.Millisecond)
	if n := len(rc.requests()); n != 1 {
		t.Errorf("%d requests after the webhook was deleted, want the 1 before", n)
	}
	if _, err := r.svc.Deliveries(context.Background(), "a", h.WebhookID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deliveries of a deleted webhook: %v", err)
	}
}

// A tenant has at most MaxPerTenant webhooks, however many creates come
// at once; another tenant's are not its to see or delete.
func TestCapAndTenancy(t *testing.T) {
	r := newRig(t, nil, func(o *webhook.Options) { o.MaxPerTenant = 5 })
	ctx := context.Background()
	var wg sync.WaitGroup
	var ok, full atomic.Int64
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.svc.Create(ctx, "a", api.WebhookRequest{URL: "http://127.0.0.1:1/hook"})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, errdefs.ErrResourceExhausted):
				full.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	list, err := r.svc.List(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if ok.Load() != 5 || full.Load() != 7 || len(list) != 5 {
		t.Fatalf("%d created, %d refused, %d listed; want 5, 7, 5", ok.Load(), full.Load(), len(list))
	}
	for _, h := range list {
		if h.Secret != "" {
			t.Errorf("a listing shows a secret")
		}
	}
	id := list[0].WebhookID
	if _, err := r.svc.Get(ctx, "b", id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("tenant b reads a's webhook: %v", err)
	}
	if err := r.svc.Delete(ctx, "b", id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("tenant b deletes a's webhook: %v", err)
	}
	if _, err := r.svc.Deliveries(ctx, "b", id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("tenant b reads a's delivery log: %v", err)
	}
	if l, _ := r.svc.List(ctx, "b"); len(l) != 0 {
		t.Errorf("tenant b lists %d webhooks", len(l))
	}
	if _, err := r.svc.Get(ctx, "a", id); err != nil {
		t.Errorf("a's webhook after b's tries: %v", err)
	}
}

// Tenant b's webhook is never sent tenant a's events.
func TestTenantEvents(t *testing.T) {
	r := newRig(t, nil, nil)
	rc := newReceiver(t, nil)
	h := r.create(t, "b", api.WebhookRequest{URL: rc.URL})
	rc.secret = h.Secret
	r.svc.Start()
	r.emit(t, "a", "a-session", 3)
	r.emit(t, "b", "b-session", 1)
	waitFor(t, "b's event", func() bool { return len(rc.delivered()) == 1 })
	time.Sleep(100 * time.Millisecond)
	for _, q := range rc.requests() {
		if q.event.SessionID != "b-session" {
			t.Errorf("b's webhook got %+v", q.event)
		}
	}
}

func TestCreateValidation(t *testing.T) {
	r := newRig(t, nil, func(o *webhook.Options) { o.AllowPrivate = false })
	for _, req := range []api.WebhookRequest{
		{URL: "ftp://example.com/x"},
		{URL: "example.com/x"},
		{URL: "http://user:pw@example.com/x"},
		{URL: "http://127.0.0.1:7070/api"},
		{URL: "http://[::1]:5432/"},
		{URL: "http://169.254.169.254/latest/meta-data"},
		{URL: "http://10.0.0.5/"},
		{URL: "http://localhost:7070/"},
		{URL: "http://db.localhost/"},
		{URL: "https://example.com/" + strings.Repeat("x", 2100)},
		{URL: "https://example.com/x", Events: []string{"session.nope"}},
		{URL: "https://example.com/x", Secret: "short"},
	} {
		if _, err := r.svc.Create(context.Background(), "a", req); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%.80s %v: %v, want invalid argument", req.URL, req.Events, err)
		}
	}
	h, err := r.svc.Create(context.Background(), "a", api.WebhookRequest{URL: "https://example.com/hook", Events: []string{"session.*", "execution.finished"}, Secret: "0123456789abcdef"})
	if err != nil || h.Secret != "0123456789abcdef" || fmt.Sprint(h.Events) != "[session.* execution.finished]" {
		t.Fatalf("%+v %v", h, err)
	}
	h, err = r.svc.Create(context.Background(), "a", api.WebhookRequest{URL: "https://example.com/all"})
	if err != nil || !strings.HasPrefix(h.Secret, "whsec_") || fmt.Sprint(h.Events) != "[*]" {
		t.Fatalf("%+v %v", h, err)
	}
}

// Without AllowPrivate a name that resolves to a loopback address is
// refused when it is dialled: the attempt fails, nothing is received,
// and the log says why.
func TestRefusesPrivateWhenDialled(t *testing.T) {
	st := openStore(t)
	rc := newReceiver(t, nil)
	port := rc.URL[strings.LastIndex(rc.URL, ":")+1:]
	// Registered by a server that allows private addresses (a name that
	// is not localhost's would pass the check at registration anyway, and
	// resolve to loopback later), delivered by one that does not.
	h := newRig(t, st, nil).create(t, "a", api.WebhookRequest{URL: "http://localhost:" + port + "/hook"})
	r := newRig(t, st, func(o *webhook.Options) { o.AllowPrivate = false; o.Retry.Attempts = 2 })
	r.svc.Start()
	r.emit(t, "a", "s", 1)
	var log *api.WebhookDeliveryList
	waitFor(t, "the event given up", func() bool {
		var err error
		log, err = r.svc.Deliveries(context.Background(), "a", h.WebhookID)
		return err == nil && len(log.Deliveries) > 0 && log.Deliveries[0].Final
	})
	if n := len(rc.requests()); n != 0 {
		t.Errorf("the receiver on loopback got %d requests", n)
	}
	if d := log.Deliveries[0]; d.OK || d.StatusCode != 0 || !strings.Contains(d.Error, "may not reach") {
		t.Errorf("attempt: %+v", d)
	}
}
