// Package telemetry sets up the process's OpenTelemetry traces (issue 15,
// when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, spans go in batches to that
// OTLP endpoint (HTTP, or gRPC with OTEL_EXPORTER_OTLP_PROTOCOL=grpc);
// otherwise nothing is installed and every span the code starts is
// OpenTelemetry's no-op.
//
// The spans are made where the work is done: the HTTP edge
// (internal/server), executions (internal/execution), sandbox acquires
// (internal/session) and calls of the executor (internal/executor). Only
// the edge asks the global provider for a tracer; the others start their
// spans from the span in their context (trace.SpanFromContext), so they
// record only under a request that is traced, and no background loop (a
// start's readiness polls, the usage sampler) makes traces of its own.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Setup installs the tracer provider and the W3C tracecontext propagator
// when the environment names an OTLP endpoint, and returns what flushes
// and stops it (call it once the server has stopped, so that the last
// spans go out). Without an endpoint, or with OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none, it installs nothing: an incoming traceparent
// is then ignored too.
//
// The exporter, the batcher, the sampler and the resource follow the
// standard variables: OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, _TIMEOUT,
// _COMPRESSION, _CERTIFICATE, _INSECURE (gRPC); OTEL_BSP_*;
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default
// parentbased_always_on); OTEL_SERVICE_NAME (default service) and
// OTEL_RESOURCE_ATTRIBUTES. OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL is
// http/protobuf (the default), http/json or grpc. (The HTTP exporter links
// gRPC anyway, through the OTLP protobuf package's service stubs: its gRPC
// twin costs the binary a few hundred KB more.)
func Setup(ctx context.Context, service, version string, log *slog.Logger) (shutdown func(context.Context) error, err error) {
	none := func(context.Context) error { return nil }
	endpoint, protocol, err := configured()
	if err != nil || endpoint == "" {
		return none, err
	}
	var exp sdktrace.SpanExporter
	if protocol == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return none, fmt.Errorf("traces: OTLP exporter: %w", err)
	}
	// Later detectors win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// over the built-in name.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service), attribute.String("service.version", version)),
		resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv())
	if err != nil {
		if res == nil {
			exp.Shutdown(ctx)
			return none, fmt.Errorf("traces: resource: %w", err)
		}
		log.Warn("traces: some resource attributes were left out", "err", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	// Export failures (a collector that is down) are the SDK's to retry;
	// they go to the server's log rather than the standard logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("traces", "err", err) }))
	log.Info("traces: exporting spans over OTLP", "endpoint", endpoint, "protocol", protocol)
	return tp.Shutdown, nil
}

// configured returns the traces endpoint the environment names, fit for a
// log (no password), and the protocol; "" when traces are off.
func configured() (endpoint, protocol string, err error) {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return "", "", nil
	}
	switch exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exp {
	case "", "otlp":
	case "none":
		return "", "", nil
	default:
		return "", "", fmt.Errorf("OTEL_TRACES_EXPORTER=%q: sbx exports traces with otlp only (or none)", exp)
	}
	endpoint = firstSet("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	if endpoint == "" {
		return "", "", nil
	}
	switch protocol = firstSet("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); protocol {
	case "":
		protocol = "http/protobuf"
	case "http/protobuf", "http/json", "grpc":
	default:
		return "", "", fmt.Errorf("OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL=%q: want http/protobuf, http/json or grpc", protocol)
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", "", errors.New("OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT: want an http:// or https:// URL, such as http://127.0.0.1:4318 (4317 for grpc)")
	}
	return u.Redacted(), protocol, nil
}

// firstSet is the value of the first of vars that is set.
func firstSet(vars ...string) string {
	for _, v := range vars {
		if s := strings.TrimSpace(os.Getenv(v)); s != "" {
			return s
		}
	}
	return ""
}
