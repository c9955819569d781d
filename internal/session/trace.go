package session

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// tracerName is the instrumentation scope of the sessions' spans.
const tracerName = "github.com/sbx-sandbox/sbx/internal/session"

// How an Acquire got its sandbox: its span's sbx.sandbox.acquire.
const (
	acquireReuse     = "reuse"      // running already: leased at once
	acquireResume    = "resume"     // paused: thawed
	acquireWarmPool  = "warm_pool"  // none: one claimed from the template's warm pool
	acquireColdStart = "cold_start" // none: started, or a start in flight waited for
)

// acquireNote is where the steps of a traced Acquire write how it got its
// sandbox. Only Acquire's own goroutine writes it.
type acquireNote struct{ how string }

type acquireNoteKey struct{}

// startSpan starts a span under the one in ctx, if that one records (the
// execution's, the request's): a session's background work (the reaper,
// starts, recovery) makes none of its own.
func startSpan(ctx context.Context, name, id string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(tracerName).Start(ctx, name, trace.WithAttributes(attribute.String("sbx.session.id", id)))
}

// traceAcquire starts Acquire's span, sandbox.acquire; the function it
// returns ends it with the lease's sandbox and how it was had.
func traceAcquire(ctx context.Context, id string) (context.Context, func(*Lease, error)) {
	ctx, span := startSpan(ctx, "sandbox.acquire", id)
	if !span.IsRecording() {
		return ctx, func(*Lease, error) {}
	}
	note := &acquireNote{}
	ctx = context.WithValue(ctx, acquireNoteKey{}, note)
	return ctx, func(l *Lease, err error) {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		} else {
			if note.how == "" {
				note.how = acquireReuse
			}
			span.SetAttributes(attribute.String("sbx.sandbox.acquire", note.how), attribute.String("sbx.sandbox.id", l.SandboxID))
		}
		span.End()
	}
}

// noteAcquire tells the traced Acquire in ctx, if any, how it is getting
// its sandbox. The first word stands: a lease of what it then started or
// thawed is not a reuse.
func noteAcquire(ctx context.Context, how string) {
	if n, ok := ctx.Value(acquireNoteKey{}).(*acquireNote); ok && n.how == "" {
		n.how = how
	}
}

// noteStarted tells a traced Acquire what kick did for it: a sandbox from
// the warm pool is running at once, a cold start is in flight. (The start
// waits for the session's lock, which kick's caller holds: it cannot have
// ended yet.)
func noteStarted(ctx context.Context, e *entry, started bool) {
	if _, ok := ctx.Value(acquireNoteKey{}).(*acquireNote); !ok || !started {
		return
	}
	if sandbox.SlotState(e.pub.Load()) == sandbox.SlotRunning {
		noteAcquire(ctx, acquireWarmPool)
	} else {
		noteAcquire(ctx, acquireColdStart)
	}
}

// restore is restoreHibernated in a span of its own, session.restore: the
// workspace comes back from the blob store, the slowest way to a sandbox.
func (hb *hibernation) restore(ctx context.Context, rec *store.Session) (*store.Session, error) {
	m := hb.m
	ctx, span := startSpan(ctx, "session.restore", rec.ID)
	out, err := m.hibernation.restoreHibernated(ctx, rec)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return out, err
}
