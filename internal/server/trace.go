package server

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the HTTP edge's spans.
const tracerName = "github.com/sbx-sandbox/sbx/internal/server"

// untraced is the global tracer provider as it is until something
// installs one (internal/telemetry, with an endpoint): while it still is,
// no span can record, and a request skips even the no-op spans'
// allocations.
var untraced = otel.GetTracerProvider()

// startSpan starts the server span of a request, continuing the caller's
// trace when a traceparent header names one (and the process traces at
// all). Probes and metrics scrapes get none. The span's name waits for
// the route (endSpan): the URL's path holds ids, and file paths, which
// are not for span names or attributes.
func startSpan(ctx context.Context, r *http.Request) (context.Context, trace.Span) {
	if otel.GetTracerProvider() == untraced || quiet(r.URL.Path) {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.HeaderCarrier(r.Header))
	return otel.Tracer(tracerName).Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method)))
}

// endSpan names the span after the route the mux matched and ends it
// with the status. 5xx are errors; 4xx are the client's (OpenTelemetry's
// HTTP conventions).
func endSpan(span trace.Span, ri *reqInfo, method string, status int, bytes int64) {
	if !span.IsRecording() {
		return
	}
	route := ri.route
	if m, path, ok := strings.Cut(route, " "); ok && m == method {
		route = path
	}
	if route != "" && route != "/" { // "/" is the catch-all's 404
		span.SetName(method + " " + route)
		span.SetAttributes(attribute.String("http.route", route))
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status), attribute.Int64("http.response.body.size", bytes),
		attribute.String("sbx.request_id", ri.id))
	if ri.tenant != "" {
		span.SetAttributes(attribute.String("sbx.tenant", ri.tenant))
	}
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// quiet says whether a path is a probe or a scrape: logged at debug
// level, never traced.
func quiet(path string) bool {
	return path == "/healthz" || path == "/readyz" || path == "/metrics"
}
