package execution

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbx-sandbox/sbx/api"
)

// tracerName is the instrumentation scope of executions' spans.
const tracerName = "github.com/sbx-sandbox/sbx/internal/execution"

// startSpan starts an execution's span, from submit to its recorded end,
// as a child of the span in ctx (the request's), if that one records
// (internal/telemetry); otherwise the span is that one, which does nothing. The run that goes on after a 202 carries
// it, so its sandbox acquire and executor call stay in the request's
// trace. Never the code, the event or the environment's values.
func startSpan(ctx context.Context, tenant, sessionID string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(tracerName).Start(ctx, "execution",
		trace.WithAttributes(attribute.String("sbx.session.id", sessionID), attribute.String("sbx.tenant", tenant)))
}

// endSpan ends an execution's span with its outcome. Code that failed,
// timed out or was cancelled is the execution's outcome, not the control
// plane's error; an execution that never ran (no sandbox, a lost one)
// is.
func endSpan(span trace.Span, x *api.Execution) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String("sbx.execution.status", x.Status))
	if x.ExitCode != nil {
		span.SetAttributes(attribute.Int("sbx.execution.exit_code", *x.ExitCode))
	}
	if x.Error != nil {
		span.SetAttributes(attribute.String("sbx.execution.error_type", x.Error.Type))
		switch x.Error.Type {
		case ErrTypeUnavailable, ErrTypeSandboxLost, ErrTypeServerRestart:
			// The control plane's own words, never the code's output.
			span.SetStatus(codes.Error, x.Error.Message)
		}
	}
	span.End()
}
