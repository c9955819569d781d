package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
)

// A request its client gave up on is not an internal error: nothing is
// logged at ERROR for it, but a request still waited for is.
func TestCancelledRequestNotAnError(t *testing.T) {
	var logs bytes.Buffer
	s := &Server{log: slog.New(slog.NewTextHandler(&logs, nil)), opt: Options{Metrics: NewMetrics(nil, nil)}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	s.writeError(rec, httptest.NewRequest("GET", "/api/v1/sessions/s/metrics", nil).WithContext(ctx), fmt.Errorf("reading: %w", context.Canceled))
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a cancelled request: log %q, answer %d %q", logs.String(), rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	s.writeError(rec, httptest.NewRequest("GET", "/api/v1/sessions/s/metrics", nil), fmt.Errorf("reading: %w", context.Canceled))
	if rec.Code != 500 || !strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a live request's cancelled read: %d, log %q", rec.Code, logs.String())
	}
}
