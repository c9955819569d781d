package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP traces receiver: what sbx serve sent it.
type collector struct {
	mu       sync.Mutex
	spans    map[string]*tracepb.Span // by name
	resource map[string]string
	auth     []string
}

func newCollector() *collector {
	return &collector{spans: map[string]*tracepb.Span{}, resource: map[string]string{}}
}

func (c *collector) take(req *coltracepb.ExportTraceServiceRequest, auth string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.auth = append(c.auth, auth)
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			c.resource[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans[s.GetName()] = s
			}
		}
	}
}

func (c *collector) span(name string) *tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spans[name]
}

// ServeHTTP is OTLP/HTTP: POST /v1/traces, a protobuf body.
func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != "POST" || r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		body = zr
	}
	b, _ := io.ReadAll(body)
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	c.take(&req, r.Header.Get("Authorization"))
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// grpcCollector is the same receiver over OTLP/gRPC.
type grpcCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	c *collector
}

func (g grpcCollector) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	g.c.take(req, strings.Join(md.Get("authorization"), ","))
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// TestServeExportsTraces (issue 15): sbx serve with
// OTEL_EXPORTER_OTLP_ENDPOINT set sends its spans to that collector, over
// OTLP/HTTP (the default) and OTLP/gRPC: a request's server span, in the
// trace its traceparent named, with the headers and resource the
// standard variables give; and the spans of its last requests on its way
// out (the shutdown flushes them).
func TestServeExportsTraces(t *testing.T) {
	// serve installs its provider for the process: the tests after this
	// one get the one they had.
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
	})
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			col := newCollector()
			var endpoint string
			if protocol == "grpc" {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				gs := grpc.NewServer()
				coltracepb.RegisterTraceServiceServer(gs, grpcCollector{c: col})
				go gs.Serve(ln)
				t.Cleanup(gs.Stop)
				endpoint = "http://" + ln.Addr().String()
				t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
			} else {
				hs := httptest.NewServer(col)
				t.Cleanup(hs.Close)
				endpoint = hs.URL
			}
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
			t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer collector-token")
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")

			url, stop := startServe(t)
			const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
			req, _ := http.NewRequest("GET", url+"/api/v1/sessions", nil)
			req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("list sessions: %v %v", resp, err)
			}
			resp.Body.Close()
			deadline := time.Now().Add(30 * time.Second)
			var s *tracepb.Span
			for s = col.span("GET /api/v1/sessions"); s == nil && time.Now().Before(deadline); s = col.span("GET /api/v1/sessions") {
				time.Sleep(20 * time.Millisecond)
			}
			if s == nil {
				t.Fatal("the collector got no span of the request")
			}
			if got := hexID(s.GetTraceId()); got != traceID || hexID(s.GetParentSpanId()) != "00f067aa0ba902b7" || s.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("span in trace %s, parent %s, kind %v: want the caller's trace and span", got, hexID(s.GetParentSpanId()), s.GetKind())
			}
			col.mu.Lock()
			if col.resource["service.name"] != "sbx" || col.resource["service.version"] != version || col.resource["deployment.environment"] != "test" {
				t.Errorf("resource: %v", col.resource)
			}
			if len(col.auth) == 0 || col.auth[0] != "Bearer collector-token" {
				t.Errorf("collector saw authorization %q", col.auth)
			}
			col.mu.Unlock()

			// The last request's span goes out with the shutdown.
			resp, err = http.Post(url+"/api/v1/sessions", "application/json", strings.NewReader(`{"session_id":"last"}`))
			if err != nil || resp.StatusCode != 201 {
				t.Fatalf("create session: %v %v", resp, err)
			}
			resp.Body.Close()
			stop()
			if col.span("POST /api/v1/sessions") == nil {
				t.Error("the span of the last request was not sent by the time sbx serve returned")
			}
		})
	}
}

func hexID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// startServe runs sbx serve in this process on a free loopback port, with
// no template to prebuild and no workspace quotas; stop makes it return
// (as SIGTERM would) and waits for it.
func startServe(t *testing.T) (url string, stop func()) {
	t.Helper()
	dir := t.TempDir()
	// Not inside the data directory, which is the server's alone: the
	// sandboxes' users must pass through every directory above the state
	// directory (os.TempDir does; the state directory itself is made so).
	state, err := os.MkdirTemp("", "sbx-serve-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	ctx, cancel := context.WithCancel(context.Background())
	var out lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- serve(ctx, []string{"--addr", "127.0.0.1:0", "--data-dir", dir, "--state-dir", state,
			"--workspace-quota", "off", "--prebuild", ""}, &out, &out)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if c := <-code; c != 0 {
				t.Errorf("sbx serve exited %d:\n%s", c, out.String())
			}
		})
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(out.String(), "\n") {
			var l struct{ Msg, URL string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "serving" {
				return l.URL, stop
			}
		}
		select {
		case c := <-code:
			t.Fatalf("sbx serve exited %d:\n%s", c, out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("sbx serve did not start:\n%s", out.String())
	return "", nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
