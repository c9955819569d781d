package api

import (
	"strings"
	"time"
)

// Lifecycle events: every change of a session and every
// execution's start and end is an event, numbered per tenant. They are
// read a page at a time (GET /events, GET /sessions/{id}/events), followed
// as server-sent events (the same with Accept: text/event-stream, each
// event named by its type and carrying its number as its id), and sent to
// webhooks.
const (
	// EventSessionCreated: a session was created (data: status, template,
	// metadata).
	EventSessionCreated = "session.created"
	// EventSessionStarting: a sandbox start began (a first execution,
	// warm_up, a resume).
	EventSessionStarting = "session.starting"
	// EventSessionRunning: the session has a sandbox up: one started for
	// it, or one from a warm pool (data.pool).
	EventSessionRunning = "session.running"
	// EventSessionPaused: the sandbox was frozen (data.reason idle or
	// request), or a session without one marked paused.
	EventSessionPaused = "session.paused"
	// EventSessionResumed: a paused session is running again.
	EventSessionResumed = "session.resumed"
	// EventSessionHibernated: the workspace went to the blob store and the
	// sandbox was destroyed (data.reason idle or request).
	EventSessionHibernated = "session.hibernated"
	// EventSessionRestored: a hibernated session's workspace is back.
	EventSessionRestored = "session.restored"
	// EventSessionSnapshot: a snapshot was taken (data.snapshot_id).
	EventSessionSnapshot = "session.snapshot"
	// EventSessionSnapshotRestored: the workspace was replaced by a
	// snapshot's (data.snapshot_id).
	EventSessionSnapshotRestored = "session.snapshot_restored"
	// EventSessionSandboxLost: the session's sandbox was found gone
	// (killed from outside, lost in a crash); the next call starts one.
	EventSessionSandboxLost = "session.sandbox_lost"
	// EventSessionError: a sandbox start failed (data.error).
	EventSessionError = "session.error"
	// EventSessionExpired: the session's TTL ran out and the reaper ended
	// it. A session ends with this or with session.terminated.
	EventSessionExpired = "session.expired"
	// EventSessionTerminated: the session was deleted.
	EventSessionTerminated = "session.terminated"
	// EventExecutionStarted: an execution has its sandbox and runs.
	EventExecutionStarted = "execution.started"
	// EventExecutionFinished: an execution ended (data.status completed,
	// failed, timeout or cancelled); one that never ran ends with this
	// alone.
	EventExecutionFinished = "execution.finished"
	// EventWebhookCreated and EventWebhookDeleted: the tenant's webhooks
	// changed (data.webhook_id); a new webhook is sent the events after
	// its webhook.created.
	EventWebhookCreated = "webhook.created"
	EventWebhookDeleted = "webhook.deleted"
)

// EventTypes are every event type, in the order of a session's life.
var EventTypes = []string{
	EventSessionCreated, EventSessionStarting, EventSessionRunning, EventSessionPaused,
	EventSessionResumed, EventSessionHibernated, EventSessionRestored, EventSessionSnapshot,
	EventSessionSnapshotRestored, EventSessionSandboxLost, EventSessionError, EventSessionExpired,
	EventSessionTerminated, EventExecutionStarted, EventExecutionFinished,
	EventWebhookCreated, EventWebhookDeleted,
}

// Event is one lifecycle event: the data of a server-sent event of the
// event streams, an entry of an EventList, and the body a webhook is sent.
type Event struct {
	// ID numbers the tenant's events 1, 2, 3... in the order they were
	// recorded: a reader that has seen n has seen every event before n.
	ID   int64  `json:"id"`
	Type string `json:"type"`
	// SessionID is the session it happened to ("" for a tenant's own
	// events: webhooks).
	SessionID string    `json:"session_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Data      EventData `json:"data"`
}

// EventData is what an event says besides its type; each type fills in
// what concerns it. It never holds code, file contents, outputs or the
// values of environment variables.
type EventData struct {
	// Status is the session's status after the change (session.*), or the
	// execution's (execution.*).
	Status     string `json:"status,omitempty"`
	TemplateID string `json:"template_id,omitempty"`
	// SandboxID is the sandbox the session (or execution) has, if any.
	SandboxID string `json:"sandbox_id,omitempty"`
	// Reason says who asked: "request" or "idle" (the reaper) for a pause
	// or hibernation, "ttl" for an expiry.
	Reason string `json:"reason,omitempty"`
	// Error says why a sandbox start failed (session.error).
	Error string `json:"error,omitempty"`
	// Pool is true when the sandbox came from a warm pool.
	Pool       bool              `json:"pool,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	SnapshotID string            `json:"snapshot_id,omitempty"`
	// ExecutionID, Language and ConversationID name an execution; an
	// ended one has its DurationMs, ExitCode (when it ran to an exit) and
	// ErrorType (ExecError.type, when it failed).
	ExecutionID    string `json:"execution_id,omitempty"`
	Language       string `json:"language,omitempty"`
	ConversationID string `json:"conversation_id,omitempty"`
	DurationMs     *int64 `json:"duration_ms,omitempty"`
	ExitCode       *int   `json:"exit_code,omitempty"`
	ErrorType      string `json:"error_type,omitempty"`
	WebhookID      string `json:"webhook_id,omitempty"`
}

// EventList is a page of events, oldest first. NextAfter is the id to ask
// for the next page after (?after=): the last event's, or, when a filter
// skipped events, the last one looked at.
type EventList struct {
	Events    []Event `json:"events"`
	NextAfter int64   `json:"next_after"`
}

// EventTypeMatches says whether an event type is one a filter names: the
// type itself, "*" for all, or "session.*", "execution.*", "webhook.*".
func EventTypeMatches(filter []string, typ string) bool {
	for _, f := range filter {
		if f == "*" || f == typ || strings.HasSuffix(f, ".*") && strings.HasPrefix(typ, f[:len(f)-1]) {
			return true
		}
	}
	return false
}

// WebhookRequest is the body of POST /webhooks.
type WebhookRequest struct {
	// URL is where events are POSTed: http or https, no user info.
	URL string `json:"url"`
	// Events are the types to send (see EventTypeMatches); empty or "*"
	// for all.
	Events []string `json:"events,omitempty"`
	// Secret signs the deliveries (16-256 characters); the server makes
	// one when it is left out. Either way it is shown once, in the answer
	// to this request.
	Secret string `json:"secret,omitempty"`
}

// Webhook is a registered webhook. Secret is only in the answer to its
// creation.
type Webhook struct {
	WebhookID string    `json:"webhook_id"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	CreatedAt time.Time `json:"created_at"`
	Secret    string    `json:"secret,omitempty"`
}

// WebhookList is the answer to GET /webhooks.
type WebhookList struct {
	Webhooks []Webhook `json:"webhooks"`
}

// WebhookDelivery is one attempt to deliver an event to a webhook.
// Attempts of one event share DeliveryID (the X-Sbx-Delivery header).
type WebhookDelivery struct {
	DeliveryID string    `json:"delivery_id"`
	EventID    int64     `json:"event_id"`
	EventType  string    `json:"event_type"`
	Attempt    int       `json:"attempt"`
	At         time.Time `json:"at"`
	// OK is true for a 2xx answer. StatusCode is the answer's status
	// (absent when none came), Error what went wrong.
	OK         bool   `json:"ok"`
	StatusCode int    `json:"status_code,omitempty"`
	Error      string `json:"error,omitempty"`
	DurationMs int64  `json:"duration_ms"`
	// Final is true on the last attempt of an event: delivered, or given
	// up after the last retry.
	Final bool `json:"final"`
}

// WebhookDeliveryList is the answer to GET /webhooks/{id}/deliveries:
// the latest attempts, newest first. After is the id of the last event
// the webhook is done with (delivered, given up or not of its types).
type WebhookDeliveryList struct {
	Deliveries []WebhookDelivery `json:"deliveries"`
	After      int64             `json:"after"`
}

// Webhook request headers. Signature is "sha256=" and the lower-case hex
// HMAC-SHA256, under the webhook's secret, of Timestamp (unix seconds),
// ".", and the body.
const (
	HeaderWebhookEvent     = "X-Sbx-Event"
	HeaderWebhookDelivery  = "X-Sbx-Delivery"
	HeaderWebhookTimestamp = "X-Sbx-Timestamp"
	HeaderWebhookSignature = "X-Sbx-Signature"
)
