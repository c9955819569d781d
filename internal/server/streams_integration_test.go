//go:build integration

package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/session"
)

// TestExecStreamCapIntegration: with streams=2, two executions in a real
// sandbox streamed as server-sent events and still running hold the
// tenant's slots: a third stream, and a long poll of a result, are 429
// naming the limit and run nothing; another tenant is not counted; a
// stream whose client leaves frees its slot and the next runs.
func TestExecStreamCapIntegration(t *testing.T) {
	const limit = 2
	keys, err := server.ParseKeys([]string{"alpha-key-123:alpha", "beta-key-4567:beta"})
	if err != nil {
		t.Fatal(err)
	}
	rs := startReal(t, t.TempDir(), func(c *app.Config) {
		c.Keys = keys
		c.Limits = session.Limits{Streams: limit}
	})
	alpha := client.New(rs.URL, client.WithAPIKey("alpha-key-123"))
	beta := client.New(rs.URL, client.WithAPIKey("beta-key-4567"))
	newSession(t, alpha, api.CreateSessionRequest{SessionID: "cap", TemplateID: "python"})
	newSession(t, beta, api.CreateSessionRequest{SessionID: "cap", TemplateID: "python"})
	ak, bk := []string{"X-API-Key", "alpha-key-123", "Accept", "text/event-stream"}, []string{"X-API-Key", "beta-key-4567", "Accept", "text/event-stream"}
	sleep := []byte(`{"code":"import time\ntime.sleep(600)","timeout":600}`)
	quick := []byte(`{"code":"print('ran')"}`)
	execute := func(hdr []string, body []byte, hold bool) (int, string, func()) {
		return openAt(t, rs.URL, hold, "POST", "/api/v1/sessions/cap/execute", "application/json", body, hdr...)
	}

	var releases []func()
	for range limit {
		code, body, release := execute(ak, sleep, true)
		if code != http.StatusOK {
			t.Fatalf("a stream within the cap: %d %s", code, body)
		}
		releases = append(releases, release)
	}
	defer func() {
		for _, r := range releases {
			r()
		}
	}()
	running := func(c *client.Client) int {
		list, err := c.ListExecutions(context.Background(), "cap", 100, "")
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Executions)
	}
	before := running(alpha)
	code, body, _ := execute(ak, quick, false)
	if code != http.StatusTooManyRequests || !strings.Contains(body, "limit streams") {
		t.Errorf("a third stream: %d %s, want 429 naming streams", code, body)
	}
	code, body, _ = openAt(t, rs.URL, false, "GET", "/api/v1/executions/exec-none/result?wait=true", "", nil, ak[:2]...)
	if code != http.StatusTooManyRequests {
		t.Errorf("a long poll past the cap: %d %s", code, body)
	}
	if n := running(alpha); n != before {
		t.Errorf("a refused stream ran something: %d executions, were %d", n, before)
	}
	if code, body, _ := execute(bk, quick, false); code != http.StatusOK || !strings.Contains(body, "ran") {
		t.Errorf("another tenant's stream: %d %s", code, body)
	}

	// The client of one stream leaves: its slot is free once the server
	// sees it go (the execution itself goes on).
	releases[0]()
	waitStreams(t, rs.app.Server, limit-1)
	if code, body, _ := execute(ak, quick, false); code != http.StatusOK || !strings.Contains(body, "ran") {
		t.Errorf("a stream after one left: %d %s", code, body)
	}
	list, err := alpha.ListExecutions(context.Background(), "cap", 100, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range list.Executions {
		if x.Status == api.ExecRunning || x.Status == api.ExecSubmitted {
			alpha.CancelExecution(context.Background(), x.ExecutionID)
		}
	}
}
