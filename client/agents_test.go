package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/apitest"
)

// ensureServer is a fake server whose session goes through the statuses
// given, one per GET, and whose creates answer createStatus.
func ensureServer(t *testing.T, initial int, statuses []string, createStatus int) (*Client, *[]string) {
	t.Helper()
	var mu sync.Mutex
	var calls []string
	exists := initial == 200
	mux := http.NewServeMux()
	p := api.Prefix
	mux.HandleFunc("GET "+p+"/sessions/{session_id}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, "GET "+r.PathValue("session_id"))
		if !exists {
			writeError(w, 404, "not_found", "no such session")
			return
		}
		s := testSession(r.PathValue("session_id"))
		s.Status = statuses[0]
		if len(statuses) > 1 {
			statuses = statuses[1:]
		}
		writeJSON(w, 200, s)
	})
	mux.HandleFunc("POST "+p+"/sessions", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, "POST")
		if createStatus != 201 {
			writeError(w, createStatus, "invalid_argument", "bad template")
			return
		}
		exists = true
		s := testSession("sb-session-u1-a1")
		s.Status = statuses[0]
		writeJSON(w, 201, s)
	})
	srv := httptest.NewServer(apitest.Handler(t, mux))
	t.Cleanup(srv.Close)
	return New(srv.URL), &calls
}

func TestEnsureSession(t *testing.T) {
	ctx := context.Background()
	fast := &EnsureOptions{Tries: 3, Interval: time.Millisecond}
	for _, tc := range []struct {
		name     string
		initial  int
		statuses []string
		create   int
		want     error
		calls    int
	}{
		{"running", 200, []string{api.StatusRunning}, 201, nil, 1},
		{"paused is usable", 200, []string{api.StatusPaused}, 201, nil, 1},
		{"created", 404, []string{api.StatusRunning}, 201, nil, 2},
		{"created, then polled", 404, []string{api.StatusPending, api.StatusRunning}, 201, nil, 4},
		{"error is recreated", 200, []string{api.StatusError, api.StatusRunning}, 201, nil, 2},
		{"create fails", 404, []string{api.StatusRunning}, 400, ErrCreateFailed, 2},
		{"never ready", 200, []string{api.StatusPending}, 201, ErrNotReady, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, calls := ensureServer(t, tc.initial, tc.statuses, tc.create)
			id, err := c.EnsureSession(ctx, "u1", "a1", fast)
			if !errors.Is(err, tc.want) || (err == nil && id != "sb-session-u1-a1") {
				t.Errorf("EnsureSession = %q, %v; want %v", id, err, tc.want)
			}
			if len(*calls) != tc.calls {
				t.Errorf("calls %v, want %d", *calls, tc.calls)
			}
		})
	}
}
