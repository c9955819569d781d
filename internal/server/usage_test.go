package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
)

// A session's metrics are its tenant's alone; without a sandbox they say
// so, with no readings; a hibernated session says it is; since must be
// a time. (Readings of real sandboxes: TestSessionMetrics.)
func TestSessionMetricsWithoutSandbox(t *testing.T) {
	ts := start(t, "key-alpha:alpha", "key-beta1:beta")
	ctx := context.Background()
	a, b := ts.client("key-alpha"), ts.client("key-beta1")
	if _, _, err := a.CreateSession(ctx, api.CreateSessionRequest{SessionID: "m"}); err != nil {
		t.Fatal(err)
	}
	m, err := a.SessionMetrics(ctx, "m", time.Time{})
	if err != nil || m.SessionID != "m" || m.Sandbox != api.SandboxNone || m.Current != nil || m.Samples == nil || len(m.Samples) != 0 || m.IntervalSeconds != 5 {
		t.Errorf("metrics of a session without a sandbox: %+v, %v", m, err)
	}
	if _, err := b.SessionMetrics(ctx, "m", time.Time{}); !client.IsNotFound(err) {
		t.Errorf("another tenant's session: %v, want not found", err)
	}
	if _, err := a.SessionMetrics(ctx, "nope", time.Time{}); !client.IsNotFound(err) {
		t.Errorf("no such session: %v, want not found", err)
	}
	if m, err = a.SessionMetrics(ctx, "m", time.Now().Add(-time.Minute)); err != nil || len(m.Samples) != 0 {
		t.Errorf("with since: %+v, %v", m, err)
	}
	if resp, body := ts.do(t, "GET", "/api/v1/sessions/m/metrics?since=yesterday", "", nil, "X-API-Key", "key-alpha"); resp.StatusCode != 400 || !strings.Contains(string(body), "since") {
		t.Errorf("since=yesterday: %d %s", resp.StatusCode, body)
	}
	if _, err := a.HibernateSession(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if m, err = a.SessionMetrics(ctx, "m", time.Time{}); err != nil || m.Sandbox != "hibernated" || m.Current != nil {
		t.Errorf("metrics of a hibernated session: %+v, %v", m, err)
	}
	if _, err := a.DeleteSession(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if m, err = a.SessionMetrics(ctx, "m", time.Time{}); err != nil || m.Sandbox != api.SandboxNone {
		t.Errorf("metrics of a terminated session: %+v, %v", m, err)
	}
}
