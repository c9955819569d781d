// Package files is the file policy. Every front door that changes a
// session's files (the main API's upload and delete, the upload_file tool
// and so MCP, E2B's file calls) goes through a Call, and a Call is the one
// place that applies the session's file_upload_config (size, allowed
// types, count) and keeps the upload records the count is taken from.
// Where a change may land is the workspace package's decision, on the
// real file (resolve.go); when the workspace may be opened, and that no
// hibernation takes it meanwhile, is the session's (session.FileCall).
// Errors carry errdefs categories; each edge maps them to its own
// statuses once.
package files

import (
	"context"
	"log/slog"

	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Sessions opens a session's workspace for a file call:
// session.Manager, or a test's fake.
type Sessions interface {
	OpenFiles(ctx context.Context, tenant, id string) (*session.FileCall, error)
}

// Uploads are the upload records max_file_count is counted from: the
// metadata store's (store.Store), so that replicas count the same ones.
type Uploads interface {
	PutUpload(ctx context.Context, u *store.Upload) error
	DeleteUploads(ctx context.Context, tenant, sessionID, path string) error
	CountUploads(ctx context.Context, tenant, sessionID string) (int, error)
	ListUploads(ctx context.Context, tenant, sessionID, conversationID string) ([]*store.Upload, error)
	DeleteConversationUploads(ctx context.Context, tenant, sessionID, conversationID string) error
}

var _ Uploads = store.Store(nil)

// Options configure a Service.
type Options struct {
	Sessions Sessions
	Uploads  Uploads
	Log      *slog.Logger
}

// Service opens file calls under the policy.
type Service struct {
	opt Options
	log *slog.Logger
}

// New returns the service.
func New(opt Options) *Service {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	return &Service{opt: opt, log: opt.Log}
}

// Open opens the session's files for a call; close the Call. Opening is
// activity: it wakes a paused or hibernated session (session.OpenFiles).
func (s *Service) Open(ctx context.Context, tenant, id string) (*Call, error) {
	fc, err := s.opt.Sessions.OpenFiles(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return &Call{s: s, fc: fc, sess: fc.Session, ws: fc.Workspace}, nil
}

// Call is a session's files open under the policy. While it is open the
// workspace is not hibernated or replaced under it.
type Call struct {
	s    *Service
	fc   *session.FileCall
	sess *session.Session // fc's: its config holds the limits
	ws   workspace.Workspace
}

// Session is the session as the call found it.
func (c *Call) Session() *session.Session { return c.sess }

// Close ends the call.
func (c *Call) Close() error { return c.fc.Close() }
