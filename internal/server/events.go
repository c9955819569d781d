package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// DefaultEventPoll is how often an event stream looks in the store for
// events other replicas recorded; this process's own wake it at once.
const DefaultEventPoll = 500 * time.Millisecond

// eventQuery is what a request asks of the tenant's events.
type eventQuery struct {
	tenant, session string
	types           []string // nil: all
	after           int64
	limit           int
}

// listEvents: GET /events. A page of the tenant's events as JSON,
// or, with Accept: text/event-stream, a stream of them that goes on as
// they happen, resumed after Last-Event-ID.
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) {
	q, err := parseEventQuery(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if sid := r.URL.Query().Get("session_id"); sid != "" {
		if !session.ValidID(sid) {
			s.writeError(w, r, fmt.Errorf("session_id %q: not a session id: %w", sid, errdefs.ErrInvalidArgument))
			return
		}
		q.session = sid
	}
	s.serveEvents(w, r, q)
}

// sessionEvents: GET /sessions/{id}/events: listEvents for one of
// the tenant's sessions (404 for any other).
func (s *Server) sessionEvents(w http.ResponseWriter, r *http.Request) {
	q, err := parseEventQuery(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	q.session = r.PathValue("session_id")
	if _, err := s.opt.Sessions.Get(r.Context(), q.tenant, q.session); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.serveEvents(w, r, q)
}

func parseEventQuery(r *http.Request) (eventQuery, error) {
	v := r.URL.Query()
	q := eventQuery{tenant: tenant(r)}
	var err error
	if q.limit, err = queryInt(v.Get("limit"), 100, 1, 1000, "limit"); err != nil {
		return q, err
	}
	if t := v.Get("types"); t != "" {
		if q.types, err = events.ParseTypes(strings.Split(t, ",")); err != nil {
			return q, err
		}
	}
	// A reconnecting EventSource says where it was in Last-Event-ID;
	// it wins over the ?after= of the URL it reconnects to.
	after, name := v.Get("after"), "after"
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		after, name = id, "Last-Event-ID"
	}
	if after != "" {
		if q.after, err = strconv.ParseInt(after, 10, 64); err != nil || q.after < 0 {
			return q, fmt.Errorf("%s %q: want an event id, 0 or more: %w", name, after, errdefs.ErrInvalidArgument)
		}
	}
	return q, nil
}

func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request, q eventQuery) {
	if s.opt.Events != nil {
		// What this process did before the request is in what it reads.
		s.opt.Events.Flush(r.Context())
	}
	if wantsEventStream(r) {
		release, err := s.openStream(q.tenant, eventStreams)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		defer release()
		s.followEvents(w, r, q)
		return
	}
	page, err := s.eventPage(r.Context(), q)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// maxScan bounds the events a filtered page looks at (ten store reads):
// a page of a rare type among many others comes back short, and its
// next_after goes on from where it stopped.
const maxScan = 10 * 1000

// eventPage reads up to q.limit events of q's types after q.after.
func (s *Server) eventPage(ctx context.Context, q eventQuery) (*api.EventList, error) {
	page := &api.EventList{Events: []api.Event{}, NextAfter: q.after}
	for scanned := 0; scanned < maxScan; {
		n := q.limit
		if q.types != nil {
			n = 1000
		}
		evs, err := s.opt.Store.ListEvents(ctx, store.EventFilter{Tenant: q.tenant, SessionID: q.session, After: page.NextAfter, Limit: n})
		if err != nil {
			return nil, err
		}
		for _, e := range evs {
			page.NextAfter = e.Seq
			if events.Matches(q.types, e.Type) {
				page.Events = append(page.Events, events.ToAPI(e))
				if len(page.Events) == q.limit {
					return page, nil
				}
			}
		}
		scanned += len(evs)
		if len(evs) < n {
			break
		}
	}
	return page, nil
}

// followEvents streams the events after q.after as server-sent events,
// "id: N", "event: TYPE", "data: Event", and goes on with new ones: those
// this process records wake it at once, other replicas' it finds by
// looking in the store every EventPoll. Events a filter skips still
// move the stream's id on (an "id:" line alone), so that a reconnection
// does not read them again. A comment every 15 s keeps proxies from
// closing a quiet stream.
func (s *Server) followEvents(w http.ResponseWriter, r *http.Request, q eventQuery) {
	rc := beginStream(w, "text/event-stream")
	ctx := r.Context()
	beat := time.NewTicker(sseHeartbeat)
	defer beat.Stop()
	poll := time.NewTimer(0)
	defer poll.Stop()
	sent, after := q.after, q.after
	for {
		var changed <-chan struct{}
		if s.opt.Events != nil {
			changed = s.opt.Events.Changed()
		}
		evs, err := s.opt.Store.ListEvents(ctx, store.EventFilter{Tenant: q.tenant, SessionID: q.session, After: after, Limit: 1000})
		if err != nil && ctx.Err() == nil {
			s.log.Warn("event stream: reading events", "tenant", q.tenant, "err", err)
		}
		var buf []byte
		for _, e := range evs {
			after = e.Seq
			if !events.Matches(q.types, e.Type) {
				continue
			}
			data, _ := json.Marshal(events.ToAPI(e))
			buf = fmt.Appendf(buf, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Type, data)
			sent = e.Seq
		}
		if after > sent && len(evs) > 0 {
			buf = fmt.Appendf(buf, "id: %d\n\n", after)
			sent = after
		}
		if len(buf) > 0 {
			if _, err := w.Write(buf); err != nil {
				return
			}
			rc.Flush()
		}
		if len(evs) == 1000 {
			continue
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(s.opt.EventPoll)
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.shutdown:
				return
			case <-poll.C:
				break wait
			case <-changed:
				changed = s.opt.Events.Changed()
				if s.opt.Events.Last(q.tenant) > after {
					break wait
				}
			case <-beat.C:
				if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
					return
				}
				rc.Flush()
			}
		}
	}
}
