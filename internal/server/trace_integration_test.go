//go:build integration

package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// TestTracesWithSandboxes (issue 15) with real runc sandboxes: each way
// an execution gets its sandbox is an acquire span of its kind under the
// execution's span, beside the executor call's (a sandbox from the warm
// pool, the same one again, a thawed one, and a hibernated workspace
// restored, in a span of its own, before a cold start); the real
// executor's answer is on the call's span; and the starts' readiness polls
// of the executor, which no request traces, make no spans.
func TestTracesWithSandboxes(t *testing.T) {
	testenv.New(t).Rootfs(t, "python")
	exp := traced(t)
	rs := startReal(t, t.TempDir(), func(c *app.Config) { c.Pools = map[string]int{"python": 1} })
	c := client.New(rs.URL)
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)
	for rs.app.Sessions.PoolSizes()["python"] < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the pool was not filled")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "tr", TemplateID: "python"}); err != nil {
		t.Fatal(err)
	}
	n := 0
	step := func(wantAcquire string, more ...string) map[string][]tracetest.SpanStub {
		t.Helper()
		n++
		traceHex := strings.Repeat("0", 31) + string(rune('0'+n))
		req, _ := http.NewRequest("POST", rs.URL+"/api/v1/sessions/tr/execute?wait=true", strings.NewReader(`{"code":"print(6*7)"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+traceHex+"-00f067aa0ba902b7-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var x api.Execution
		err = json.NewDecoder(resp.Body).Decode(&x)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil || x.Status != api.ExecCompleted || x.Stdout != "42\n" {
			t.Fatalf("execute: %d %+v %v", resp.StatusCode, x, err)
		}
		tid, _ := trace.TraceIDFromHex(traceHex)
		spans := spansOf(t, exp, tid, append([]string{executeSpan, "execution", "sandbox.acquire", "executor POST /run"}, more...)...)
		ex := one(t, spans, "execution")
		childOf(t, ex, one(t, spans, executeSpan))
		acq, run := one(t, spans, "sandbox.acquire"), one(t, spans, "executor POST /run")
		childOf(t, acq, ex)
		childOf(t, run, ex)
		if got := attr(acq, "sbx.sandbox.acquire"); got != wantAcquire {
			t.Errorf("acquire %d: %q, want %q", n, got, wantAcquire)
		}
		if attr(run, "sbx.execution.status") != "completed" || attr(run, "sbx.execution.id") != x.ExecutionID || attr(run, "sbx.execution.exit_code") != "0" {
			t.Errorf("executor call %d: %v", n, run.Attributes)
		}
		return spans
	}
	step("warm_pool")
	step("reuse")
	if _, err := c.PauseSession(ctx, "tr"); err != nil {
		t.Fatal(err)
	}
	step("resume")
	if _, err := c.HibernateSession(ctx, "tr"); err != nil {
		t.Fatal(err)
	}
	spans := step("cold_start", "session.restore")
	childOf(t, one(t, spans, "session.restore"), one(t, spans, "sandbox.acquire"))
	for _, s := range exp.GetSpans() {
		if strings.HasPrefix(s.Name, "executor GET /health") {
			t.Errorf("a span %q (parent %s): the starts' polls should make none", s.Name, s.Parent.SpanID())
		}
	}
}
