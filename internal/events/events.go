// Package events records lifecycle events: what the session and
// execution layers tell of each change, numbered per tenant in the store
// (store.AppendEvent), where the event streams and the webhooks read
// them.
//
// A Log is one process's way into the store: Emit queues an event and
// returns at once, and one goroutine appends the queue in order, so that
// what one process emits is numbered in the order it was emitted and an
// execution never waits for the store on its account. Record does the
// same and, when other processes append to the store too (replicas),
// waits until its event is in: a change made under a session's lock is
// then numbered before whatever the lock's next holder, in any replica,
// emits. An append that fails is logged and dropped; it never fails the
// change it tells of.
package events

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// Event is a change as its emitter tells it.
type Event struct {
	Tenant, SessionID string
	// Type is one of api.EventTypes.
	Type string
	Data api.EventData
	// Time is when it happened; zero is when it is emitted.
	Time time.Time
}

// ToAPI is a recorded event as the API shows it. Data that does not
// decode (written by a newer server, say) is left empty.
func ToAPI(e *store.Event) api.Event {
	out := api.Event{ID: e.Seq, Type: e.Type, SessionID: e.SessionID, CreatedAt: e.CreatedAt.UTC()}
	if len(e.Data) > 0 {
		json.Unmarshal(e.Data, &out.Data)
	}
	return out
}

// ParseTypes reads a list of event types (a query's comma-separated
// types=, a webhook's events): each one of api.EventTypes, "*", or a
// group ("session.*", "execution.*", "webhook.*"). Empty is every type
// (nil).
func ParseTypes(list []string) ([]string, error) {
	var out []string
	for _, t := range list {
		t = strings.TrimSpace(t)
		switch {
		case t == "":
			continue
		case t == "*" || slices.Contains(api.EventTypes, t):
		case strings.HasSuffix(t, ".*") && slices.ContainsFunc(api.EventTypes, func(known string) bool {
			return strings.HasPrefix(known, t[:len(t)-1])
		}):
		default:
			return nil, fmt.Errorf("event type %q: want one of %s, a group such as session.*, or *: %w",
				t, strings.Join(api.EventTypes, ", "), errdefs.ErrInvalidArgument)
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	if slices.Contains(out, "*") {
		return nil, nil
	}
	return out, nil
}

// Matches says whether an event of type typ passes a filter ParseTypes
// made (nil passes all).
func Matches(filter []string, typ string) bool {
	return filter == nil || api.EventTypeMatches(filter, typ)
}
