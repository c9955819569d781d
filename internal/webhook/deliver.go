package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// Retry is the schedule of attempts to deliver one event: the first at
// once, then after Base, 2*Base, 4*Base... (at most Max), each wait
// shortened or lengthened by up to a fifth at random, so that webhooks
// failing together do not retry together. After Attempts attempts the
// event is given up and the next one is sent.
type Retry struct {
	Attempts  int           // default 6
	Base, Max time.Duration // default 1s and 5 minutes
}

func (r Retry) withDefaults() Retry {
	if r.Attempts <= 0 {
		r.Attempts = 6
	}
	if r.Base <= 0 {
		r.Base = time.Second
	}
	if r.Max <= 0 {
		r.Max = 5 * time.Minute
	}
	return r
}

// Delay is the wait after attempt n (1, 2, ...) failed, before jitter.
func (r Retry) Delay(n int) time.Duration {
	d := r.Base
	for i := 1; i < n && d < r.Max; i++ {
		d *= 2
	}
	return min(d, r.Max)
}

// jitter spreads d over [0.8d, 1.2d].
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// Start starts delivering; Close stops it.
func (s *Service) Start() {
	s.wg.Add(1)
	go s.run()
}

// Close stops delivering (an attempt in flight is cut short and tried
// again by whoever delivers next) and waits for it to stop.
func (s *Service) Close() {
	s.stop()
	s.wg.Wait()
	s.client.CloseIdleConnections()
}

type workerKey struct{ tenant, id string }

// worker delivers one webhook's events, one after the other.
type worker struct {
	hook   stored
	poke   chan bool // true: look in the store, whatever this process appended
	cancel context.CancelFunc
	done   chan struct{}
}

// run is the deliverer: every Poll it looks for the webhooks (a worker
// each, while this process leads) and tells the workers to look for
// events; an event this process records tells them at once.
func (s *Service) run() {
	defer s.wg.Done()
	t := time.NewTicker(s.opt.Poll)
	defer t.Stop()
	var changed <-chan struct{}
	if s.opt.Events != nil {
		changed = s.opt.Events.Changed()
	}
	s.scan()
	for {
		poll := false
		select {
		case <-s.ctx.Done():
			s.stopWorkers(nil)
			return
		case <-t.C:
			s.scan()
			poll = true
		case <-changed:
			changed = s.opt.Events.Changed()
		}
		s.mu.Lock()
		for _, w := range s.workers {
			select {
			case w.poke <- poll:
			default:
				if poll { // a local poke is waiting: make it a poll
					select {
					case <-w.poke:
					default:
					}
					select {
					case w.poke <- true:
					default:
					}
				}
			}
		}
		s.mu.Unlock()
	}
}

// scan starts a worker for each webhook and stops those of webhooks that
// are gone or changed; all of them when this process does not lead.
func (s *Service) scan() {
	if s.opt.Leader != nil && !s.opt.Leader() {
		s.stopWorkers(nil)
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	want := map[workerKey]stored{}
	after := ""
	for {
		docs, err := s.opt.Store.ListDocuments(ctx, kindTenants, indexTenant, "", after, 1000)
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Warn("webhooks: listing the tenants with webhooks", "err", err)
			}
			return
		}
		for _, d := range docs {
			td, _, err := s.load(ctx, d.Key)
			if err != nil {
				if s.ctx.Err() == nil {
					s.log.Warn("webhooks: reading a tenant's webhooks", "tenant", d.Key, "err", err)
				}
				return
			}
			for _, h := range td.Webhooks {
				want[workerKey{d.Key, h.ID}] = h
			}
		}
		if len(docs) < 1000 {
			break
		}
		after = docs[len(docs)-1].Key
	}
	s.stopWorkers(func(k workerKey, w *worker) bool {
		h, ok := want[k]
		return !ok || !sameHook(h, w.hook)
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, h := range want {
		if s.workers[k] != nil || s.ctx.Err() != nil {
			continue
		}
		wctx, wcancel := context.WithCancel(s.ctx)
		w := &worker{hook: h, poke: make(chan bool, 1), cancel: wcancel, done: make(chan struct{})}
		w.poke <- true
		s.workers[k] = w
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer close(w.done)
			s.work(wctx, k.tenant, w)
			// Stopped on its own (another process wrote its state): the
			// next scan starts it again if this process still leads.
			s.mu.Lock()
			if s.workers[k] == w {
				delete(s.workers, k)
			}
			s.mu.Unlock()
			wcancel()
		}()
	}
}

func sameHook(a, b stored) bool {
	return a.ID == b.ID && a.URL == b.URL && a.Secret == b.Secret && slices.Equal(a.Events, b.Events)
}

// stopWorkers stops the workers which says (all for nil) and waits for
// them.
func (s *Service) stopWorkers(which func(workerKey, *worker) bool) {
	s.mu.Lock()
	var stopped []*worker
	for k, w := range s.workers {
		if which == nil || which(k, w) {
			w.cancel()
			stopped = append(stopped, w)
			delete(s.workers, k)
		}
	}
	s.mu.Unlock()
	for _, w := range stopped {
		<-w.done
	}
}

// errStopped says a worker must stop: its webhook is gone, or another
// process wrote its state (it delivers now).
var errStopped = errors.New("stopped")

// work delivers the webhook's events from its cursor on, until ctx ends
// or another process turns out to deliver it.
func (s *Service) work(ctx context.Context, tenant string, w *worker) {
	h := &w.hook
	var (
		st  *state
		rev int64
		err error
	)
	for st == nil {
		if st, rev, err = s.loadState(ctx, tenant, h); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("webhooks: reading a webhook's state", "tenant", tenant, "webhook", h.ID, "err", err)
			if !s.wait(ctx, w, tenant, -1) {
				return
			}
		}
	}
	for {
		evs, err := s.opt.Store.ListEvents(ctx, store.EventFilter{Tenant: tenant, After: st.After, Limit: 100})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("webhooks: reading events", "tenant", tenant, "err", err)
			evs = nil
		}
		skipped := false
		for _, ev := range evs {
			if !events.Matches(h.Events, ev.Type) {
				st.After, skipped = ev.Seq, true
				continue
			}
			if err := s.deliver(ctx, tenant, h, ev, st, &rev); err != nil {
				if !errors.Is(err, errStopped) && ctx.Err() == nil {
					s.log.Warn("webhooks: recording a delivery", "tenant", tenant, "webhook", h.ID, "err", err)
				}
				return
			}
			skipped = false
		}
		if skipped {
			if err := s.saveState(ctx, tenant, h, st, &rev); err != nil {
				return
			}
		}
		if len(evs) == 100 {
			continue
		}
		if !s.wait(ctx, w, tenant, st.After) {
			return
		}
	}
}

// wait waits for a poke that may bring events after after: a poll, or an
// event this process appended beyond it. It reports false when ctx ends.
func (s *Service) wait(ctx context.Context, w *worker, tenant string, after int64) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case poll := <-w.poke:
			if poll || after < 0 || s.opt.Events == nil || s.opt.Events.Last(tenant) > after {
				return true
			}
		}
	}
}

// deliver sends one event until it is taken (a 2xx) or Retry gives up,
// recording each attempt in the webhook's state; the last one moves its
// cursor past the event.
func (s *Service) deliver(ctx context.Context, tenant string, h *stored, ev *store.Event, st *state, rev *int64) error {
	// Deleted since the last scan (by any replica): nothing more goes.
	if _, err := s.find(ctx, tenant, h.ID); errors.Is(err, errdefs.ErrNotFound) {
		return errStopped
	}
	body, _ := json.Marshal(events.ToAPI(ev))
	id := h.ID + "-" + strconv.FormatInt(ev.Seq, 10)
	for attempt := 1; ; attempt++ {
		if s.opt.Leader != nil && !s.opt.Leader() {
			return errStopped
		}
		d := s.attempt(ctx, h, ev, id, body)
		if ctx.Err() != nil {
			return ctx.Err() // cut short by a stop: not an attempt that counts
		}
		d.Attempt = attempt
		d.Final = d.OK || attempt >= s.opt.Retry.Attempts
		if d.Final {
			st.After = ev.Seq
		}
		st.Deliveries = append(st.Deliveries, d)
		if n := len(st.Deliveries) - s.opt.KeepDeliveries; n > 0 {
			st.Deliveries = slices.Delete(st.Deliveries, 0, n)
		}
		// The outcome of an attempt made is recorded even when a stop
		// comes meanwhile: the next deliverer would send it again.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err := s.saveState(sctx, tenant, h, st, rev)
		cancel()
		if err != nil {
			return err
		}
		if d.Final {
			if !d.OK {
				s.log.Warn("webhooks: an event was given up after its last attempt", "tenant", tenant, "webhook", h.ID,
					"event", ev.Seq, "type", ev.Type, "attempts", attempt, "err", d.Error, "status", d.StatusCode)
			}
			return nil
		}
		t := time.NewTimer(jitter(s.opt.Retry.Delay(attempt)))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// maxErrorText bounds what the delivery log keeps of an error.
const maxErrorText = 300

// attempt makes one request.
func (s *Service) attempt(ctx context.Context, h *stored, ev *store.Event, id string, body []byte) api.WebhookDelivery {
	start := time.Now()
	d := api.WebhookDelivery{DeliveryID: id, EventID: ev.Seq, EventType: ev.Type, At: start.UTC()}
	fail := func(err error) api.WebhookDelivery {
		msg := err.Error()
		if len(msg) > maxErrorText {
			msg = msg[:maxErrorText] + "..."
		}
		d.Error, d.DurationMs = msg, time.Since(start).Milliseconds()
		return d
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(body))
	if err != nil {
		return fail(err)
	}
	ts := time.Now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sbx-webhook/1")
	req.Header.Set(api.HeaderWebhookEvent, ev.Type)
	req.Header.Set(api.HeaderWebhookDelivery, id)
	req.Header.Set(api.HeaderWebhookTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(api.HeaderWebhookSignature, Sign(h.Secret, ts, body))
	resp, err := s.client.Do(req)
	if err != nil {
		return fail(err)
	}
	// The answer's body says nothing the log keeps; a little is read so
	// that the connection can be used again.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	d.StatusCode, d.DurationMs = resp.StatusCode, time.Since(start).Milliseconds()
	d.OK = resp.StatusCode >= 200 && resp.StatusCode < 300
	if !d.OK {
		d.Error = fmt.Sprintf("answered %d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
	}
	return d
}

// saveState writes the webhook's state if no one wrote it since this
// process last did: another that did delivers now (errStopped), as does
// nobody once the webhook is deleted. A store that fails is tried again
// at the next write.
func (s *Service) saveState(ctx context.Context, tenant string, h *stored, st *state, rev *int64) error {
	v, _ := json.Marshal(st)
	d := &store.Document{Kind: kindState, Tenant: tenant, Key: h.ID, Value: v, Revision: *rev}
	err := s.opt.Store.PutDocument(ctx, d)
	switch {
	case err == nil:
		*rev = d.Revision
		return nil
	case errors.Is(err, errdefs.ErrConflict), errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrNotFound):
		return errStopped
	case ctx.Err() != nil:
		return ctx.Err()
	}
	s.log.Warn("webhooks: recording a webhook's progress; tried again at the next", "tenant", tenant, "webhook", h.ID, "err", err)
	return nil
}
