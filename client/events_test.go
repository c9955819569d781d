package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
)

func sseLine(id int64, typ string) string {
	b, _ := json.Marshal(api.Event{ID: id, Type: typ, SessionID: "s1", CreatedAt: time.Now().UTC()})
	return fmt.Sprintf("id: %d\nevent: %s\ndata: %s\n\n", id, typ, b)
}

// A stream whose connection breaks goes on after the last id it read
// (an id line alone too), waits out a 503, and ends with its context.
func TestEventStreamReconnects(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string // each connection's Last-Event-ID and query
	)
	conn := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conn++
		n := conn
		seen = append(seen, r.Header.Get("Last-Event-ID")+" "+r.URL.RawQuery)
		mu.Unlock()
		if r.Header.Get("Accept") != "text/event-stream" || r.URL.Path != "/api/v1/events" {
			http.Error(w, "not a stream request", http.StatusBadRequest)
			return
		}
		switch n {
		case 1:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, sseLine(1, api.EventSessionCreated)+sseLine(2, api.EventSessionPaused)+"id: 5\n\n")
		case 2:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"error":{"code":"unavailable","message":"busy"}}`)
		default:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, sseLine(6, api.EventSessionTerminated))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := New(srv.URL).Events(ctx, EventsOptions{Types: []string{"session.*"}, SessionID: "s1", After: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var ids []int64
	for range 3 {
		ev, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ev.ID)
	}
	if fmt.Sprint(ids) != "[1 2 6]" || s.After() != 6 {
		t.Errorf("ids %v, after %d", ids, s.After())
	}
	mu.Lock()
	got := fmt.Sprint(seen)
	mu.Unlock()
	if want := "[0 session_id=s1&types=session.%2A 5 session_id=s1&types=session.%2A 5 session_id=s1&types=session.%2A]"; got != want {
		t.Errorf("connections %s, want %s", got, want)
	}
	cancel()
	if _, err := s.Next(); err != context.Canceled {
		t.Errorf("after cancel: %v", err)
	}
}

// A refusal is the stream's error at once, not retried.
func TestEventStreamRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":{"code":"unauthenticated","message":"no key"}}`)
	}))
	defer srv.Close()
	_, err := New(srv.URL).Events(context.Background(), EventsOptions{})
	if ae, ok := err.(*APIError); !ok || ae.StatusCode != http.StatusUnauthorized {
		t.Fatalf("err %v", err)
	}
}
