package workspace

import (
	"context"
	"io"
)

// Workspace is one session's files, wherever they are: a directory on
// this host (Local), or a volume behind a sandbox's executor
// (internal/executor/client), on this node or another. The control plane
// reaches a session's files only through it, so nothing above this
// package needs the workspace to be on its host.
//
// Paths are workspace paths ("dir/file.txt", the sandbox sees them under
// /workspace), cleaned by CleanPath. Every implementation gives the same
// guarantees against the sandbox, which may change the tree at any moment
// (see the package comment): no link is followed out of the workspace,
// what sbx manages (uploads/, .resources/) is changed only through the
// calls made for it, and errors carry errdefs categories
// (ErrInvalidArgument for a bad path or a link out, ErrNotFound, ...).
// workspacetest.Run checks an implementation against all of it. Methods
// are safe for concurrent use.
type Workspace interface {
	// Stat describes what is at rel without following a link there; a
	// link comes with its target.
	Stat(ctx context.Context, rel string) (Entry, error)
	// List lists the directory at rel, or describes the single file
	// there: see Local.List.
	List(ctx context.Context, rel string, recursive bool, maxEntries int) (entries []Entry, truncated bool, err error)
	// Open opens the regular file at rel for reading; a directory, FIFO,
	// socket or device is ErrInvalidArgument.
	Open(ctx context.Context, rel string) (File, error)
	// Save streams r into the file at rel, the sandbox user's with mode
	// 0644, replacing what is there at once (never a part); more than
	// maxBytes (if > 0) is ErrTooLarge and leaves nothing behind.
	Save(ctx context.Context, rel string, r io.Reader, maxBytes int64) (SavedFile, error)
	// SaveUpload saves a conversation's upload at rel in its temp area
	// (ConversationDir), read-only to the sandbox. The path returned is
	// the workspace path.
	SaveUpload(ctx context.Context, cid, rel string, r io.Reader, maxBytes int64) (SavedFile, error)
	// MakeDir makes the directory rel and any missing parents.
	MakeDir(ctx context.Context, rel string) error
	// Rename moves what is at from to to.
	Rename(ctx context.Context, from, to string) error
	// Remove removes what is at rel; a directory only if recursive.
	Remove(ctx context.Context, rel string, recursive bool) error
	// RemoveUpload removes an upload, or a directory of them, below
	// uploads/.
	RemoveUpload(ctx context.Context, rel string, recursive bool) error
	// RemoveConversation removes everything kept for conversation cid.
	RemoveConversation(ctx context.Context, cid string) error
	// Resources lists the resources in place.
	Resources(ctx context.Context) ([]Resource, error)
	// SyncResources brings the resources in step with want; callers
	// serialize it per workspace.
	SyncResources(ctx context.Context, want []Resource, content ResourceContent) (ResourceSync, error)
	// Usage counts the workspace's bytes and files.
	Usage(ctx context.Context) (bytes int64, files int, err error)
	// Export writes the whole workspace to w as an archive (see
	// archive.go), for a snapshot, a hibernation or a move to another
	// node.
	Export(ctx context.Context, w io.Writer) error
	// Import replaces the workspace's content with an archive Export
	// wrote. The archive is input: every entry is checked, and nothing in
	// it can reach outside the workspace.
	Import(ctx context.Context, r io.Reader) error
	// Close releases what the handle holds. The files stay.
	Close() error
}

// File is a regular file of a workspace open for reading: a download,
// which may be served by ranges (http.ServeContent seeks).
type File interface {
	io.ReadSeekCloser
	// Info describes the file as it was when opened.
	Info() Entry
}

var _ Workspace = (*Local)(nil)
