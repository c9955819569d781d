// Package store defines the control plane's metadata store: the records of
// sessions, executions, uploads, documents and events that must outlive a
// server process, and
// the leases by which servers sharing a store divide work between them.
// Backends: sqlite (one server, the default) and postgres (servers that
// share one database: scale-out). Every backend passes storetest.Run.
//
// The conventions every backend keeps:
//   - Errors wrap the errdefs categories: ErrNotFound, ErrAlreadyExists,
//     ErrInvalidArgument (a missing key field, a zero CreatedAt, a limit out
//     of range, a malformed page token, a lease's ttl <= 0), ErrConflict
//     (a session written since it was read).
//   - A session's write is a compare-and-swap on its Revision, so that
//     servers sharing the store cannot lose each other's writes: a caller
//     reads, changes and writes back, and on ErrConflict reads again.
//   - Times are kept to the microsecond and come back in UTC; a zero time
//     comes back as the zero time.Time.
//   - Session.Metadata comes back as a non-nil map, empty when the session
//     has none (nil and empty are the same thing to the store).
//   - The JSON fields (Session.Config, Execution.Request and Result) are
//     opaque and must hold valid JSON; a backend may reformat it (a jsonb
//     column does), so compare them as JSON, not as bytes. Empty comes back
//     nil.
//   - Records are scoped to a tenant: a call made for one tenant never reads,
//     changes or deletes another tenant's records, and says ErrNotFound
//     where the other tenant's record exists.
//   - The store does not check that a session exists before recording its
//     executions and uploads: the layer above does that under its own
//     locks.
//   - Documents (the layer above's small JSON records: templates,
//     webhooks, conversations) and events are a tenant's like sessions
//     are; a document's write compares its Revision as a session's does.
//     A tenant's events are numbered 1, 2, 3... in commit order.
//   - Leases are the servers', not a tenant's: their names are global.
//     Their times are the database server's clock where there is one
//     (postgres), so that servers whose clocks disagree agree on when a
//     lease ends; sqlite, one server's, uses that server's clock.
package store

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Store keeps the control plane's records. It is safe for concurrent use.
type Store interface {
	// CreateSession records a new session at revision 1, whatever
	// s.Revision says, and sets s.Revision to 1; errdefs.ErrAlreadyExists
	// if the tenant has a session with that id.
	CreateSession(ctx context.Context, s *Session) error
	// GetSession returns the tenant's session; errdefs.ErrNotFound if absent.
	GetSession(ctx context.Context, tenant, id string) (*Session, error)
	// UpdateSession replaces every field of the session (s.Tenant, s.ID)
	// if its revision is still s.Revision, and sets s.Revision to the new
	// one (one more). errdefs.ErrConflict if it has been written since
	// (nothing is changed: read it again and retry), errdefs.ErrNotFound if
	// absent.
	UpdateSession(ctx context.Context, s *Session) error
	// DeleteSession removes the session with its executions and uploads.
	// Deleting an absent session is not an error.
	DeleteSession(ctx context.Context, tenant, id string) error
	// ListSessions returns a page of the tenant's sessions that match f,
	// newest first (CreatedAt, then ID, descending), and the token of the
	// next page, "" after the last one.
	ListSessions(ctx context.Context, f SessionFilter) (sessions []*Session, nextPageToken string, err error)
	// CountSessions counts the sessions of every tenant by status, for
	// metrics.
	CountSessions(ctx context.Context) (map[string]int, error)
	// TenantUsage counts the tenant's sessions that are not terminated
	// and sums their DiskMB: what its quotas are held against.
	TenantUsage(ctx context.Context, tenant string) (TenantUsage, error)
	// TotalUsage is TenantUsage over every tenant: what the workspace
	// file system, which they share, is held against.
	TotalUsage(ctx context.Context) (TenantUsage, error)
	// ListDueSessions returns up to limit sessions of every tenant whose
	// DueAt is set and not after before, earliest first: the reaper's
	// work. limit is 1..1000.
	ListDueSessions(ctx context.Context, before time.Time, limit int) ([]*Session, error)
	// ListSandboxSessions returns the sessions of every tenant that name a
	// sandbox and are not terminated: what a starting server reconciles
	// with the sandboxes that exist.
	ListSandboxSessions(ctx context.Context) ([]*Session, error)

	// CreateExecution records a new execution; errdefs.ErrAlreadyExists if
	// an execution has that id, in any tenant (execution ids are global).
	CreateExecution(ctx context.Context, x *Execution) error
	// UpdateExecution replaces every field of the execution (x.Tenant,
	// x.ID); errdefs.ErrNotFound if the tenant has no execution with that
	// id. A finished execution (any status but pending and running) is
	// final: updating it is errdefs.ErrConflict, so that the outcome one
	// process wrote (a run that ended, the failure of a dead replica's run)
	// is never replaced by another's.
	UpdateExecution(ctx context.Context, x *Execution) error
	// GetExecution returns the tenant's execution; errdefs.ErrNotFound if
	// absent, and also when the execution belongs to another tenant.
	GetExecution(ctx context.Context, tenant, id string) (*Execution, error)
	// ListExecutions returns a page of a session's executions, newest first
	// (CreatedAt, then ID, descending), and the token of the next page, ""
	// after the last one. limit is 1..1000; 0 means 100. It returns
	// summaries: a backend must not read the requests and results, which
	// can be tens of MiB each.
	ListExecutions(ctx context.Context, tenant, sessionID string, limit int, pageToken string) ([]*ExecutionSummary, string, error)
	// ListUnfinishedExecutions returns the executions of every tenant that
	// are pending or running. At start a server fails them: their outcome
	// was lost with the process that ran them.
	ListUnfinishedExecutions(ctx context.Context) ([]*Execution, error)
	// CountExecutions counts the executions of every tenant by status.
	CountExecutions(ctx context.Context) (map[string]int, error)
	// DeleteExecutions removes every execution of the session.
	DeleteExecutions(ctx context.Context, tenant, sessionID string) error
	// TrimExecutions removes the session's finished executions beyond the
	// newest keep (by CreatedAt, then ID), leaving pending and running ones
	// alone, and returns how many it removed. keep is at least 1.
	TrimExecutions(ctx context.Context, tenant, sessionID string, keep int) (int, error)
	// TrimTenantExecutions removes the tenant's oldest finished
	// executions, of any session, until its executions' records (the
	// bytes of Request and Result as written) add up to at most keepBytes,
	// leaving pending and running ones alone (their bytes count); it
	// returns how many it removed and the bytes the tenant's records hold
	// after. keepBytes 0 removes every finished one; negative is
	// errdefs.ErrInvalidArgument. It reads every record's size: call it
	// when an estimate says the tenant is past its bound, not on every
	// write.
	TrimTenantExecutions(ctx context.Context, tenant string, keepBytes int64) (removed int, kept int64, err error)

	// PutUpload records an upload, replacing the one at its path.
	PutUpload(ctx context.Context, u *Upload) error
	// DeleteUploads removes the session's upload at path and every upload
	// under path + "/", as deleting a directory does; path "" removes all
	// the session's uploads. Removing nothing is not an error.
	DeleteUploads(ctx context.Context, tenant, sessionID, path string) error
	// CountUploads counts the session's uploads, of every conversation.
	CountUploads(ctx context.Context, tenant, sessionID string) (int, error)
	// ListUploads returns the session's uploads of one conversation, by
	// path; conversationID "" lists the session-level uploads (those of no
	// conversation).
	ListUploads(ctx context.Context, tenant, sessionID, conversationID string) ([]*Upload, error)
	// DeleteConversationUploads removes the uploads of one conversation;
	// conversationID "" is errdefs.ErrInvalidArgument (use DeleteUploads
	// for the session's own).
	DeleteConversationUploads(ctx context.Context, tenant, sessionID, conversationID string) error

	// TryLease takes the named lease for holder until now+ttl when it is
	// free, expired, or already holder's (then it is renewed). held says
	// whether holder has it now; token is the lease's fencing token, which
	// grows every time the lease passes to another holder (not on
	// renewal), so that work done under an old holding can be refused.
	// token is 0 when held is false. ttl is kept to the microsecond,
	// rounded up. An empty name or holder, or a ttl <= 0, is
	// errdefs.ErrInvalidArgument.
	TryLease(ctx context.Context, name, holder string, ttl time.Duration) (token int64, held bool, err error)
	// LeaseHolder says who holds the named lease and whether it is live
	// (not expired, not released): "" and false for a lease never taken.
	LeaseHolder(ctx context.Context, name string) (holder string, live bool, err error)
	// ReleaseLease gives the lease up if holder has it (otherwise
	// nothing), so that another can take it at once. The lease keeps its
	// token: another holder that takes it next gets a larger one.
	ReleaseLease(ctx context.Context, name, holder string) error
	// LiveLeases returns the names of the live leases (not expired, not
	// released) whose names begin with prefix, sorted. An empty prefix
	// is errdefs.ErrInvalidArgument: there is no listing every lease.
	LiveLeases(ctx context.Context, prefix string) ([]string, error)

	// PutDocument writes a document. At d.Revision 0 it creates it, and
	// says errdefs.ErrAlreadyExists if the key is taken; otherwise it is a
	// compare-and-swap on the revision the caller read: errdefs.ErrConflict
	// if the document was written since, errdefs.ErrNotFound if it is
	// gone. It sets d.Revision (1 when created, one more at each write),
	// d.CreatedAt and d.UpdatedAt.
	PutDocument(ctx context.Context, d *Document) error
	// GetDocument returns one document; errdefs.ErrNotFound if there is
	// none.
	GetDocument(ctx context.Context, kind, tenant, key string) (*Document, error)
	// ListDocuments returns a tenant's documents of a kind whose keys
	// begin with prefix ("" for all), sorted by key, at most limit
	// (1..1000) of them after the key after ("" from the start).
	ListDocuments(ctx context.Context, kind, tenant, prefix, after string, limit int) ([]*Document, error)
	// DeleteDocument deletes a document; errdefs.ErrNotFound if there is
	// none. A revision other than 0 must be the document's, or it is
	// errdefs.ErrConflict and the document stays.
	DeleteDocument(ctx context.Context, kind, tenant, key string, revision int64) error

	// AppendEvent records an event and sets e.Seq: one more than the
	// tenant's last event's, so that a tenant's events are numbered 1, 2,
	// 3... in the order they were committed, across servers, and a reader
	// that saw event n has seen every event before it. e.CreatedAt is
	// required.
	AppendEvent(ctx context.Context, e *Event) error
	// AppendEvents records events in one transaction, in order, as
	// AppendEvent would one by one: all of them or, on an error, none.
	AppendEvents(ctx context.Context, events []*Event) error
	// ListEvents returns a tenant's events after Seq f.After, oldest first.
	ListEvents(ctx context.Context, f EventFilter) ([]*Event, error)
	// TrimEvents deletes the events created before before, and returns
	// how many it deleted. A tenant's numbering goes on from where it was.
	TrimEvents(ctx context.Context, before time.Time) (int, error)

	// Ping reports whether the store can serve requests.
	Ping(ctx context.Context) error
	// Close releases the store. Calls after Close fail.
	Close() error
}

// Session is one session's record. Config and Metadata are owned by the
// layer above; the store keeps Config as opaque JSON.
type Session struct {
	// Tenant and ID are the key: session ids are per tenant.
	Tenant, ID string
	// Status is pending, running, paused, hibernated, error or terminated;
	// the store does not check it.
	Status     string
	TemplateID string
	// SandboxID is "" when the session has no sandbox.
	SandboxID string
	// Error says why the status is error.
	Error string
	// Metadata (user_id, agent_id, ...) can be filtered on in ListSessions.
	Metadata map[string]string
	Config   json.RawMessage
	// CreatedAt is required; it orders ListSessions.
	CreatedAt, UpdatedAt, LastActivityAt, ExpiresAt time.Time
	// DueAt is when the session next needs the reaper's attention (an
	// idle timeout, its TTL); zero for never. The layer above computes it.
	DueAt time.Time
	// DiskMB is what the session may store (its disk quota), summed per
	// tenant by TenantUsage.
	DiskMB int64
	// Revision counts the record's writes: 1 when created, one more at
	// each UpdateSession, which takes it as the revision the caller read.
	// The store keeps it; the layer above only carries it from a read to
	// the write that follows.
	Revision int64
}

// TenantUsage is what a tenant holds in the store.
type TenantUsage struct {
	// Sessions counts its sessions that are not terminated.
	Sessions int
	// DiskMB sums their DiskMB.
	DiskMB int64
}

// Execution is one execution's record.
type Execution struct {
	// ID is unique across tenants; Tenant and SessionID say whose it is.
	Tenant, ID, SessionID string
	// Status is pending, running, completed, failed, timeout or cancelled;
	// the store does not check it.
	Status                              string
	Language, ConversationID, ContextID string
	Request                             json.RawMessage
	// Result is nil until the execution finishes.
	Result json.RawMessage
	// CreatedAt is required; it orders ListExecutions.
	CreatedAt time.Time
	// StartedAt and FinishedAt are zero until then.
	StartedAt, FinishedAt time.Time
	// Owner is the server (replica) that runs the execution: only it, or
	// a server that finds it gone, may fail it when it is left unfinished.
	Owner string
}

// ExecutionSummary is an execution's record without its request and
// result: what a listing shows.
type ExecutionSummary struct {
	Tenant, ID, SessionID               string
	Status                              string
	Language, ConversationID, ContextID string
	CreatedAt, StartedAt, FinishedAt    time.Time
}

// Summary returns the record's summary.
func (x *Execution) Summary() *ExecutionSummary {
	return &ExecutionSummary{
		Tenant: x.Tenant, ID: x.ID, SessionID: x.SessionID, Status: x.Status,
		Language: x.Language, ConversationID: x.ConversationID, ContextID: x.ContextID,
		CreatedAt: x.CreatedAt, StartedAt: x.StartedAt, FinishedAt: x.FinishedAt,
	}
}

// Upload records a file a user uploaded into a session's workspace, so the
// server can enforce the session's file count limit and purge a
// conversation's files.
type Upload struct {
	// Tenant, SessionID and Path are the key; Path is workspace-relative.
	Tenant, SessionID, Path string
	// ConversationID is "" for a session-level upload.
	ConversationID string
	Size           int64
	SHA256         string
	CreatedAt      time.Time
}

// SessionFilter selects the sessions ListSessions returns.
type SessionFilter struct {
	// Tenant is required.
	Tenant string
	// Status "" matches any.
	Status string
	// Metadata pairs must all match exactly.
	Metadata map[string]string
	// Limit is the most sessions in a page, 1..1000; 0 means 100.
	Limit int
	// PageToken is "" for the first page, else a previous page's
	// nextPageToken.
	PageToken string
}

// Document is a small JSON record of the layer above, kept per tenant
// under a kind (templates, webhooks, conversations) and a key.
type Document struct {
	// Kind, Tenant and Key are the key. Key is at most 512 bytes.
	Kind, Tenant, Key string
	// Value is the document: valid JSON, at most 1 MiB.
	Value json.RawMessage
	// CreatedAt and UpdatedAt are set by the store.
	CreatedAt, UpdatedAt time.Time
	// Revision counts the document's writes; PutDocument and
	// DeleteDocument compare it, as UpdateSession does a session's.
	Revision int64
}

// Event is something that happened to a tenant's session or execution.
type Event struct {
	// Tenant is required; Seq numbers the tenant's events (AppendEvent
	// sets it).
	Tenant string
	Seq    int64
	// SessionID is the session it happened to ("" for none).
	SessionID string
	// Type says what happened (session.created, execution.finished...).
	Type string
	// Data is its details: JSON, or nil.
	Data      json.RawMessage
	CreatedAt time.Time
}

// EventFilter selects the events ListEvents returns.
type EventFilter struct {
	// Tenant is required.
	Tenant string
	// SessionID "" matches any.
	SessionID string
	// After is the Seq of the last event already seen (0 for none).
	After int64
	// Limit is the most events returned, 1..1000; 0 means 100.
	Limit int
}

// Limits on documents that every backend enforces, as
// errdefs.ErrInvalidArgument.
const (
	MaxDocumentKey   = 512
	MaxDocumentValue = 1 << 20
)

// CheckDocument reports a document a backend must refuse.
func CheckDocument(d *Document) error {
	switch {
	case d.Kind == "" || d.Tenant == "" || d.Key == "":
		return fmt.Errorf("document: kind, tenant and key are required: %w", errdefs.ErrInvalidArgument)
	case len(d.Key) > MaxDocumentKey:
		return fmt.Errorf("document %s/%s: key is over %d bytes: %w", d.Kind, d.Key[:32], MaxDocumentKey, errdefs.ErrInvalidArgument)
	case len(d.Value) > MaxDocumentValue:
		return fmt.Errorf("document %s/%s: value is over %d bytes: %w", d.Kind, d.Key, MaxDocumentValue, errdefs.ErrInvalidArgument)
	case !json.Valid(d.Value):
		return fmt.Errorf("document %s/%s: value is not JSON: %w", d.Kind, d.Key, errdefs.ErrInvalidArgument)
	}
	return nil
}

// CheckEventFilter reports a filter a backend must refuse, and returns its
// limit with the default filled in.
func CheckEventFilter(f EventFilter) (int, error) {
	switch {
	case f.Tenant == "":
		return 0, fmt.Errorf("events: tenant is required: %w", errdefs.ErrInvalidArgument)
	case f.Limit < 0 || f.Limit > 1000:
		return 0, fmt.Errorf("events: limit %d is not in 1..1000: %w", f.Limit, errdefs.ErrInvalidArgument)
	case f.After < 0:
		return 0, fmt.Errorf("events: after %d is negative: %w", f.After, errdefs.ErrInvalidArgument)
	case f.Limit == 0:
		return 100, nil
	}
	return f.Limit, nil
}

// CheckListDocuments reports a listing a backend must refuse.
func CheckListDocuments(kind, tenant string, limit int) error {
	if kind == "" || tenant == "" {
		return fmt.Errorf("documents: kind and tenant are required: %w", errdefs.ErrInvalidArgument)
	}
	if limit < 1 || limit > 1000 {
		return fmt.Errorf("documents: limit %d is not in 1..1000: %w", limit, errdefs.ErrInvalidArgument)
	}
	return nil
}

// CheckEvent reports an event a backend must refuse.
func CheckEvent(e *Event) error {
	switch {
	case e.Tenant == "" || e.Type == "":
		return fmt.Errorf("event: tenant and type are required: %w", errdefs.ErrInvalidArgument)
	case e.CreatedAt.IsZero():
		return fmt.Errorf("event: created_at is required: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// ByTenant returns the indexes of events in the order a backend appends
// them: by tenant, and in their order within a tenant, so that
// transactions take tenants' counters in one order and none waits for
// another that waits for it.
func ByTenant(events []*Event) []int {
	idx := make([]int, len(events))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return events[idx[a]].Tenant < events[idx[b]].Tenant })
	return idx
}
