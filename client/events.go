package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
)

// EventsOptions select lifecycle events.
type EventsOptions struct {
	// After is the id of the last event already seen (0: from the oldest
	// kept).
	After int64
	// Types are the event types wanted (api.Event* constants, groups such
	// as "session.*"); none for all.
	Types []string
	// SessionID, if set, is the one session whose events are wanted
	// (?session_id=: a session not there yet, or gone, simply has none;
	// SessionEvents is the session's own page, 404 without it).
	SessionID string
	// Limit bounds a page (ListEvents; default 100).
	Limit int
}

func (o EventsOptions) query() url.Values {
	q := url.Values{}
	if o.After > 0 {
		q.Set("after", strconv.FormatInt(o.After, 10))
	}
	if len(o.Types) > 0 {
		q.Set("types", strings.Join(o.Types, ","))
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.SessionID != "" {
		q.Set("session_id", o.SessionID)
	}
	return q
}

// ListEvents returns a page of the tenant's events (or one session's)
// after opts.After, oldest first; its NextAfter is the next page's After.
func (c *Client) ListEvents(ctx context.Context, opts EventsOptions) (*api.EventList, error) {
	var out api.EventList
	if _, err := c.call(ctx, http.MethodGet, api.Prefix+"/events", opts.query(), nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// SessionEvents returns a page of one of the tenant's sessions' events
// after after (limit 0: 100); ErrNotFound if it has no such session.
func (c *Client) SessionEvents(ctx context.Context, sessionID string, after int64, limit int) (*api.EventList, error) {
	p, err := sessionPath(sessionID, "/events")
	if err != nil {
		return nil, err
	}
	var out api.EventList
	q := EventsOptions{After: after, Limit: limit}.query()
	if _, err := c.call(ctx, http.MethodGet, p, q, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// Events follows the tenant's events (or one session's) after opts.After
// as they happen. The stream reconnects on its own, from the last event
// it read, when its connection breaks, and ends when ctx does:
//
//	s, err := c.Events(ctx, client.EventsOptions{Types: []string{"session.*"}})
//	for {
//		ev, err := s.Next()
//		if err != nil {
//			break // ctx ended, or the server refused to go on
//		}
//		fmt.Println(ev.ID, ev.Type, ev.SessionID)
//	}
//
// It connects before it returns, so that a refusal (a wrong key, an
// unknown session) is its error.
func (c *Client) Events(ctx context.Context, opts EventsOptions) (*EventStream, error) {
	s := &EventStream{c: c, ctx: ctx, opts: opts, after: opts.After, wait: minReconnect}
	if err := s.connect(); err != nil {
		return nil, err
	}
	return s, nil
}

// EventStream is a stream of events that Events opened. Its methods are
// for one goroutine.
type EventStream struct {
	c     *Client
	ctx   context.Context
	opts  EventsOptions
	after int64
	body  io.ReadCloser
	r     *sseReader
	wait  time.Duration // before the next reconnection
}

// A broken stream is connected again after minReconnect, doubling up to
// maxReconnect while connections keep failing or breaking before an
// event comes.
const (
	minReconnect = 250 * time.Millisecond
	maxReconnect = 5 * time.Second
)

// connect opens the stream after s.after.
func (s *EventStream) connect() error {
	q := s.opts.query()
	q.Del("limit")
	q.Del("after")
	req, err := s.c.request(s.ctx, http.MethodGet, api.Prefix+"/events", q, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", strconv.FormatInt(s.after, 10))
	resp, err := s.c.do(req, http.StatusOK)
	if err != nil {
		return err
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		resp.Body.Close()
		return fmt.Errorf("events: the server answered with %q, not an event stream", mt)
	}
	s.body, s.r = resp.Body, newSSEReader(resp.Body)
	return nil
}

// Next returns the next event. When the connection breaks it connects
// again (with backoff, up to 5 s apart) and goes on after the last event
// read; it returns ctx's error once ctx ends, or the error a server
// answers a reconnection with (but 503 and 429, which it waits out).
func (s *EventStream) Next() (*api.Event, error) {
	for {
		if s.r == nil {
			if err := sleep(s.ctx, s.wait); err != nil {
				return nil, err
			}
			s.wait = min(2*s.wait, maxReconnect)
			if err := s.connect(); err != nil {
				var ae *APIError
				if s.ctx.Err() != nil {
					return nil, s.ctx.Err()
				}
				if errors.As(err, &ae) && ae.StatusCode != http.StatusServiceUnavailable && ae.StatusCode != http.StatusTooManyRequests {
					return nil, err
				}
				continue
			}
		}
		ev, err := s.r.next()
		if id, perr := strconv.ParseInt(s.r.lastID, 10, 64); perr == nil && id > s.after {
			s.after = id // an "id:" line alone moves it on too
		}
		if err != nil {
			s.body.Close()
			s.body, s.r = nil, nil
			if s.ctx.Err() != nil {
				return nil, s.ctx.Err()
			}
			continue
		}
		s.wait = minReconnect
		var out api.Event
		if err := json.Unmarshal([]byte(ev.data), &out); err != nil {
			return nil, fmt.Errorf("events: event %s (id %s): %w", ev.name, ev.id, err)
		}
		return &out, nil
	}
}

// After is the id of the last event the stream read (or its filter
// skipped): where another stream would go on from.
func (s *EventStream) After() int64 { return s.after }

// Close ends the stream.
func (s *EventStream) Close() error {
	if s.body == nil {
		return nil
	}
	err := s.body.Close()
	s.body, s.r = nil, nil
	return err
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
