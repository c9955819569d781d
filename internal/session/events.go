package session

import (
	"context"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// Lifecycle events are told to Options.Publish where a change is
// made: after its record is written, by whichever process made it (a
// request's, the reaper's), while it still holds the session's lock, so
// that the lock's next holder tells of its change after this one.

// emit tells of a change of the session rec is the record of, as written.
// The caller holds the session's lock, and not the entry's.
func (m *Manager) emit(ctx context.Context, typ string, rec *store.Session, d api.EventData) {
	if m.opt.Publish == nil {
		return
	}
	d.Status, d.TemplateID = rec.Status, rec.TemplateID
	if d.SandboxID == "" {
		d.SandboxID = rec.SandboxID
	}
	m.opt.Publish(context.WithoutCancel(ctx), events.Event{Tenant: rec.Tenant, SessionID: rec.ID, Type: typ, Data: d})
}

// reasonOf says who asked for a pause or hibernation.
func reasonOf(idle bool) string {
	if idle {
		return "idle"
	}
	return "request"
}
