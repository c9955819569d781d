package session

import (
	"fmt"
	"slices"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// A session's status is a state machine, kept in the store:
//
//	pending     a sandbox is starting because the client asked for one
//	            (warm_up, resume of a session in error); then running or error
//	running     the session takes calls. Its sandbox is up, starting for a
//	            first execution, or not there at all (lazy, R-60): sandbox_state
//	            tells which
//	paused      the sandbox is frozen (idle_timeout, or POST /pause); any call
//	            thaws it
//	hibernated  the workspace is in the blob store and nothing is on the host
//	            (hibernate_timeout, or POST /hibernate); any call restores it
//	error       the last sandbox start failed; the next execution tries again
//	terminated  deleted or past its TTL; creating the id again starts afresh
//
// Every other move is a TransitionError.
var transitions = map[string][]string{
	api.StatusPending:    {api.StatusRunning, api.StatusError, api.StatusTerminated},
	api.StatusRunning:    {api.StatusPaused, api.StatusHibernated, api.StatusError, api.StatusTerminated},
	api.StatusPaused:     {api.StatusRunning, api.StatusHibernated, api.StatusTerminated},
	api.StatusHibernated: {api.StatusRunning, api.StatusTerminated},
	api.StatusError:      {api.StatusPending, api.StatusRunning, api.StatusHibernated, api.StatusTerminated},
	api.StatusTerminated: nil,
}

// TransitionError is a lifecycle call that the session's status does not
// allow: pausing a hibernated session, say. It is ErrFailedPrecondition.
type TransitionError struct {
	Session  string
	From, To string
	// Why, if set, says more than the two statuses do.
	Why string
}

func (e *TransitionError) Error() string {
	msg := fmt.Sprintf("session %q is %s and cannot become %s", e.Session, e.From, e.To)
	if e.Why != "" {
		msg += ": " + e.Why
	}
	return msg
}

// Unwrap makes a TransitionError an errdefs.ErrFailedPrecondition.
func (e *TransitionError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// canMove reports whether a session may go from one status to another;
// staying is always allowed.
func canMove(from, to string) bool {
	return from == to || slices.Contains(transitions[from], to)
}

// dueAt is when the reaper must next look at a session in this state: its
// idle timeout (pause, or hibernation for a session with nothing to
// freeze), its TTL, whichever comes first. Terminated sessions are never
// due.
func dueAt(rec *store.Session, cfg *Config, d Defaults) time.Time {
	if rec.Status == api.StatusTerminated {
		return time.Time{}
	}
	due := rec.ExpiresAt
	idle := func(seconds int64, def time.Duration) {
		wait := time.Duration(seconds) * time.Second
		if wait == 0 {
			wait = def
		}
		if t := rec.LastActivityAt.Add(wait); due.IsZero() || t.Before(due) {
			due = t
		}
	}
	switch {
	case rec.Status == api.StatusHibernated:
	case rec.Status == api.StatusPaused || rec.SandboxID == "":
		idle(cfg.HibernateTimeout, d.HibernateTimeout)
	default:
		idle(cfg.IdleTimeout, d.IdleTimeout)
	}
	return due
}
