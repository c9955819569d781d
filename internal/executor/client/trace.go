package client

import (
	"context"
	"errors"
	"strings"

	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the client's spans.
const tracerName = "github.com/sbx-sandbox/sbx/internal/executor/client"

// startSpan starts the client span of a call to the executor, named
// after its method and path without ids ("executor POST /run",
// "executor DELETE /contexts"), under the span in ctx if that one records:
// calls made outside a traced request (a start's readiness polls, the
// usage sampler's) make none. Only this process traces: nothing goes to
// the executor, which has no tracer.
func startSpan(ctx context.Context, method, path string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	op, _, _ := strings.Cut(path, "?")
	if i := strings.IndexByte(op[1:], '/'); i >= 0 {
		op = op[:i+1]
	}
	return parent.TracerProvider().Tracer(tracerName).Start(ctx, "executor "+method+" "+op,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("rpc.system", "sbx-executor"), attribute.String("rpc.method", method+" "+op)))
}

// endSpan ends a call's span with its outcome: the error's kind (no
// answer, the executor's error code) and, for a run, the result's status
// and error type. A run whose code failed is a call that went well.
func endSpan(span trace.Span, res *wire.Result, err error) {
	if !span.IsRecording() {
		return
	}
	var ae *APIError
	switch {
	case err == nil:
	case errors.As(err, &ae):
		span.SetAttributes(attribute.String("error.type", ae.Code), attribute.Int("http.response.status_code", ae.Status))
	case errors.Is(err, ErrNoAnswer):
		span.SetAttributes(attribute.String("error.type", "no_answer"))
	default:
		span.SetAttributes(attribute.String("error.type", "broken_response"))
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	if res != nil {
		span.SetAttributes(attribute.String("sbx.execution.status", string(res.Status)), attribute.Int("sbx.execution.exit_code", res.ExitCode))
		if res.Error != nil {
			span.SetAttributes(attribute.String("sbx.execution.error_type", res.Error.Type))
		}
	}
	span.End()
}
