package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/template"
)

// traced installs a tracer provider that keeps every span in memory, and
// the W3C propagator, as internal/telemetry does with an endpoint; the
// test's end puts back what was there.
func traced(t *testing.T) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		tp.Shutdown(context.Background())
	})
	return exp
}

// spansOf waits until the trace has a span of each name (a server span
// ends after its response is sent), and returns the trace's spans by name.
func spansOf(t *testing.T, exp *tracetest.InMemoryExporter, traceID trace.TraceID, names ...string) map[string][]tracetest.SpanStub {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		byName := map[string][]tracetest.SpanStub{}
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID() == traceID {
				byName[s.Name] = append(byName[s.Name], s)
			}
		}
		missing := ""
		for _, n := range names {
			if len(byName[n]) == 0 {
				missing = n
			}
		}
		if missing == "" {
			return byName
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s has no span %q; it has %v", traceID, missing, keys(byName))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// one returns the only span of a name.
func one(t *testing.T, spans map[string][]tracetest.SpanStub, name string) tracetest.SpanStub {
	t.Helper()
	if len(spans[name]) != 1 {
		t.Fatalf("%d spans %q, want 1", len(spans[name]), name)
	}
	return spans[name][0]
}

// attr is a span's attribute, as text ("" if it has none).
func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// childOf checks that child's parent is parent.
func childOf(t *testing.T, child, parent tracetest.SpanStub) {
	t.Helper()
	if child.Parent.SpanID() != parent.SpanContext.SpanID() || child.SpanContext.TraceID() != parent.SpanContext.TraceID() {
		t.Errorf("span %q: parent %s, want %q (%s)", child.Name, child.Parent.SpanID(), parent.Name, parent.SpanContext.SpanID())
	}
}

// execRuntime is the fake runtime whose sandboxes start (Create adds a
// running one) and answer through one fake executor: sessions get real
// leases, cold starts and executor calls without root or runc.
type execRuntime struct {
	*runtimetest.Fake
	sock string
}

func (r *execRuntime) Create(ctx context.Context, spec runtime.Spec) (*runtime.Info, error) {
	r.Add(spec.ID)
	return &runtime.Info{ID: spec.ID, State: runtime.StateRunning}, nil
}

func (r *execRuntime) Dial(ctx context.Context, id string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", r.sock)
}

// fakeExecutor serves enough of the executor's protocol
// (internal/executor/PROTOCOL.md) on a unix socket for runs to complete:
// each prints "hi" and ends.
func fakeExecutor(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "executor.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(wire.Health{OK: true, Ready: true})
	})
	mux.HandleFunc("POST /run", func(w http.ResponseWriter, r *http.Request) {
		var req wire.RunRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, `{"error":{"code":"invalid_argument","message":"bad request"}}`, 400)
			return
		}
		enc := json.NewEncoder(w)
		enc.Encode(wire.Event{Type: "stdout", Data: "hi\n"})
		now := time.Now().UTC()
		enc.Encode(wire.Event{Type: "result", Result: &wire.Result{
			ID: req.ID, Status: wire.StatusCompleted, Stdout: "hi\n", Artifacts: []string{}, StartedAt: now, FinishedAt: now,
		}})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// syncBuffer is a log destination the server's goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

const executeSpan = "POST /api/v1/sessions/{session_id}/execute"

// TestTraces (issue 15): executions through the real server, on sandboxes
// a fake runtime starts and a fake executor answers. The request's server
// span continues the caller's trace (traceparent) and is named after its
// route; the execution's span is its child, and the sandbox acquire (a
// cold start, then a reuse) and the executor call are the execution's
// children, with their attributes. A 202 execution, which runs after its
// request has been answered, is still in that request's trace. A request
// without a traceparent starts a trace of its own; probes have none. No
// span holds the API key, the code or an environment value, and the
// request's log line carries its trace id.
func TestTraces(t *testing.T) {
	exp := traced(t)
	rt := &execRuntime{Fake: runtimetest.NewFake(), sock: fakeExecutor(t)}
	var logs syncBuffer
	const key = "key-secret-0123456789"
	ts := startConfigured(t, func(c *app.Config) {
		c.Runtime = func(string) (runtime.Runtime, error) { return rt, nil }
		c.Log = slog.New(slog.NewJSONHandler(&logs, nil))
	}, key+":alpha")
	spec, _ := template.Builtin("python")
	fakeTemplateBuild(t, ts, "", spec)
	ctx := context.Background()
	if _, _, err := ts.client(key).CreateSession(ctx, api.CreateSessionRequest{SessionID: "s", TemplateID: "python"}); err != nil {
		t.Fatal(err)
	}
	const body = `{"code":"print('code-secret')","env_vars":{"TOKEN":"env-secret-value"}}`
	execute := func(query, traceID string) (*http.Response, []byte) {
		return ts.do(t, "POST", "/api/v1/sessions/s/execute"+query, "application/json", strings.NewReader(body),
			"Authorization", "Bearer "+key, "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	}

	// Waited for: the whole tree in the caller's trace.
	resp, b := execute("?wait=true", "4bf92f3577b34da6a3ce929d0e0e4736")
	var x api.Execution
	if resp.StatusCode != 200 || json.Unmarshal(b, &x) != nil || x.Status != api.ExecCompleted {
		t.Fatalf("execute: %d %s", resp.StatusCode, b)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spans := spansOf(t, exp, tid, executeSpan, "execution", "sandbox.acquire", "executor POST /run")
	srv := one(t, spans, executeSpan)
	if srv.SpanKind != trace.SpanKindServer || !srv.Parent.IsRemote() || srv.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("server span: kind %v, parent %v: want the caller's span", srv.SpanKind, srv.Parent)
	}
	for k, want := range map[string]string{
		"http.request.method": "POST", "http.route": "/api/v1/sessions/{session_id}/execute",
		"http.response.status_code": "200", "sbx.tenant": "alpha",
	} {
		if got := attr(srv, k); got != want {
			t.Errorf("server span: %s = %q, want %q", k, got, want)
		}
	}
	ex := one(t, spans, "execution")
	childOf(t, ex, srv)
	for k, want := range map[string]string{
		"sbx.execution.id": x.ExecutionID, "sbx.session.id": "s", "sbx.execution.language": "python",
		"sbx.execution.status": "completed", "sbx.execution.exit_code": "0",
	} {
		if got := attr(ex, k); got != want {
			t.Errorf("execution span: %s = %q, want %q", k, got, want)
		}
	}
	acq := one(t, spans, "sandbox.acquire")
	childOf(t, acq, ex)
	if attr(acq, "sbx.sandbox.acquire") != "cold_start" || attr(acq, "sbx.sandbox.id") == "" {
		t.Errorf("first acquire: %v, want a cold start and the sandbox", acq.Attributes)
	}
	run := one(t, spans, "executor POST /run")
	childOf(t, run, ex)
	if run.SpanKind != trace.SpanKindClient || attr(run, "sbx.execution.status") != "completed" || attr(run, "sbx.execution.id") != x.ExecutionID {
		t.Errorf("executor span: kind %v, %v", run.SpanKind, run.Attributes)
	}
	if !strings.Contains(logs.String(), `"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"`) {
		t.Errorf("no request log line with the trace id:\n%s", logs.String())
	}

	// Answered 202 at once: the run goes on in the request's trace.
	resp, b = execute("", "5bf92f3577b34da6a3ce929d0e0e4736")
	var sub api.SubmitResponse
	if resp.StatusCode != 202 || json.Unmarshal(b, &sub) != nil {
		t.Fatalf("submit: %d %s", resp.StatusCode, b)
	}
	res, err := ts.client(key).GetResult(ctx, sub.ExecutionID, true, 10*time.Second)
	if err != nil || res.Status != api.ExecCompleted {
		t.Fatalf("result: %+v %v", res, err)
	}
	tid2, _ := trace.TraceIDFromHex("5bf92f3577b34da6a3ce929d0e0e4736")
	spans = spansOf(t, exp, tid2, executeSpan, "execution", "sandbox.acquire", "executor POST /run")
	srv, ex = one(t, spans, executeSpan), one(t, spans, "execution")
	childOf(t, ex, srv)
	childOf(t, one(t, spans, "sandbox.acquire"), ex)
	childOf(t, one(t, spans, "executor POST /run"), ex)
	if attr(srv, "http.response.status_code") != "202" || attr(ex, "sbx.execution.id") != sub.ExecutionID || attr(ex, "sbx.execution.status") != "completed" {
		t.Errorf("202: server %v, execution %v", srv.Attributes, ex.Attributes)
	}
	if got := attr(one(t, spans, "sandbox.acquire"), "sbx.sandbox.acquire"); got != "reuse" {
		t.Errorf("second acquire: %q, want reuse", got)
	}

	// The result's GET had no traceparent: a root span of its own.
	ts.do(t, "GET", "/healthz", "", nil)
	var result, probe int
	for _, s := range exp.GetSpans() {
		switch {
		case s.Name == "GET /api/v1/executions/{execution_id}/result":
			result++
			if s.Parent.IsValid() || s.SpanContext.TraceID() == tid2 {
				t.Errorf("result span: parent %v, trace %s: want a root", s.Parent, s.SpanContext.TraceID())
			}
		case strings.Contains(s.Name, "healthz"):
			probe++
		}
		// Nothing secret in names, attributes, statuses or events.
		text := s.Name + " " + s.Status.Description
		for _, kv := range s.Attributes {
			text += " " + kv.Value.String()
		}
		for _, ev := range s.Events {
			text += " " + ev.Name
			for _, kv := range ev.Attributes {
				text += " " + kv.Value.String()
			}
		}
		for _, secret := range []string{key, "code-secret", "env-secret-value"} {
			if strings.Contains(text, secret) {
				t.Errorf("span %q holds %q: %s", s.Name, secret, text)
			}
		}
	}
	if result == 0 || probe != 0 {
		t.Errorf("%d result spans (want some), %d probe spans (want none)", result, probe)
	}
}
