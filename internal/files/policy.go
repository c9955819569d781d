package files

import (
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"path"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// FileWrite is one file a client writes.
type FileWrite struct {
	// Path is the file's workspace path; with ConversationID, its path
	// inside that conversation's temp area.
	Path string
	// ConversationID, if set, puts the file in the conversation's temp
	// area (uploads/CID/temparea), read-only to sandboxed code.
	ConversationID string
	// MediaType is the type the client declared, "" if none. With the
	// file name's extension it is checked against allowed_file_types.
	MediaType string
	Body      io.Reader
}

// Write stores one file within the session's limits and records it as an
// upload. A file over max_file_size is errdefs.ErrTooLarge, one of a type
// the session does not allow errdefs.ErrUnsupportedType, and one more
// file than max_file_count errdefs.ErrFailedPrecondition (replacing a
// recorded file is not one more).
func (c *Call) Write(ctx context.Context, w FileWrite) (workspace.SavedFile, error) {
	rel, err := workspace.CleanPath(w.Path)
	if err != nil {
		return workspace.SavedFile{}, err
	}
	if rel == "." {
		return workspace.SavedFile{}, fmt.Errorf("path %q names no file: %w", w.Path, errdefs.ErrInvalidArgument)
	}
	up := c.sess.Config.Upload
	name := path.Base(rel)
	if !c.sess.Config.AllowsFile(name, w.MediaType) {
		return workspace.SavedFile{}, fmt.Errorf("%q (%s) is not an allowed file type; the session allows %s: %w",
			name, orUnknown(w.MediaType), strings.Join(up.AllowedFileTypes, ", "), errdefs.ErrUnsupportedType)
	}
	dest := rel
	if w.ConversationID != "" {
		if !session.ValidID(w.ConversationID) {
			return workspace.SavedFile{}, fmt.Errorf("conversation_id %q is not a valid id: %w", w.ConversationID, errdefs.ErrInvalidArgument)
		}
		dest = path.Join(workspace.ConversationDir(w.ConversationID), rel)
	}
	undo, err := c.holdSlot(ctx, dest, w.ConversationID)
	if err != nil {
		return workspace.SavedFile{}, err
	}
	var saved workspace.SavedFile
	if w.ConversationID != "" {
		saved, err = c.ws.SaveUpload(ctx, w.ConversationID, rel, w.Body, c.sess.Config.MaxUploadBytes())
	} else {
		saved, err = c.ws.Save(ctx, rel, w.Body, c.sess.Config.MaxUploadBytes())
	}
	if err != nil {
		undo()
	}
	if errors.Is(err, errdefs.ErrTooLarge) {
		return workspace.SavedFile{}, fmt.Errorf("%q is larger than the session's max_file_size of %d %s: %w", name, up.MaxFileSize, up.MaxFileSizeUnit, errdefs.ErrTooLarge)
	}
	if err != nil {
		return workspace.SavedFile{}, err
	}
	if err := c.s.opt.Uploads.PutUpload(ctx, &store.Upload{
		Tenant: c.sess.Tenant, SessionID: c.sess.ID, Path: saved.Path, ConversationID: w.ConversationID,
		Size: saved.Size, SHA256: saved.SHA256, CreatedAt: time.Now().UTC(),
	}); err != nil {
		c.remove(context.WithoutCancel(ctx), saved.Path, false)
		undo()
		return workspace.SavedFile{}, err
	}
	return saved, nil
}

func orUnknown(mt string) string {
	if mt == "" {
		return "no media type"
	}
	return mt
}

// holdSlot takes one of max_file_count's slots for a write to dest: it
// records the upload before it counts them, so that of writes racing for
// the last slot (in this process or in other replicas) each counts the
// others' records, and the one that finds too many gives its slot back
// and is refused; none gets past the limit. A write that replaces a
// recorded file takes no new slot. Writes that all give their slots back
// while there was room try again after a random while, a few times. undo
// gives the slot back if the write then fails; the record the write makes
// replaces the held one.
func (c *Call) holdSlot(ctx context.Context, dest, cid string) (undo func(), err error) {
	noop := func() {}
	limit := c.sess.Config.Upload.MaxFileCount
	if limit <= 0 {
		return noop, nil
	}
	st, tenant, id := c.s.opt.Uploads, c.sess.Tenant, c.sess.ID
	ups, err := st.ListUploads(ctx, tenant, id, cid)
	if err != nil {
		return nil, err
	}
	for _, u := range ups {
		if u.Path == dest {
			return noop, nil
		}
		if strings.HasPrefix(u.Path, dest+"/") {
			// A directory with uploads under it: the write fails, and
			// giving back a slot held at its path would drop theirs.
			return noop, nil
		}
	}
	undo = func() {
		if err := st.DeleteUploads(context.WithoutCancel(ctx), tenant, id, dest); err != nil {
			c.s.log.Warn("giving back an upload slot", "session", id, "path", dest, "err", err)
		}
	}
	for try := 1; ; try++ {
		if err := st.PutUpload(ctx, &store.Upload{
			Tenant: tenant, SessionID: id, Path: dest, ConversationID: cid, CreatedAt: time.Now().UTC(),
		}); err != nil {
			return nil, err
		}
		held, err := st.CountUploads(ctx, tenant, id)
		if err != nil {
			undo()
			return nil, err
		}
		if held <= limit {
			return undo, nil
		}
		undo()
		if held-1 >= limit || try == holdTries {
			return nil, fmt.Errorf("the session already holds %d uploaded files and max_file_count is %d: delete some first: %w", held-1, limit, errdefs.ErrFailedPrecondition)
		}
		// There was room, but other writes took slots at the same
		// moment, and each gave its own back: try again after a random
		// while, so that one of them gets it next time.
		t := time.NewTimer(time.Duration(1+mrand.IntN(10*try)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		case <-t.C:
		}
	}
}

// holdTries bounds holdSlot's tries when writes race for the last slots.
const holdTries = 5

// MakeDir makes the directory rel and any missing parents, the sandbox
// user's.
func (c *Call) MakeDir(ctx context.Context, rel string) error {
	return c.ws.MakeDir(ctx, rel)
}

// Move moves what is at from to to (see workspace.Rename); the upload
// records of what moved move with it, so a move does not free a slot of
// max_file_count.
func (c *Call) Move(ctx context.Context, from, to string) error {
	if err := c.ws.Rename(ctx, from, to); err != nil {
		return err
	}
	from, _ = workspace.CleanPath(from)
	to, _ = workspace.CleanPath(to)
	st := c.s.opt.Uploads
	// What was at to is gone.
	if err := st.DeleteUploads(ctx, c.sess.Tenant, c.sess.ID, to); err != nil {
		return err
	}
	ups, err := st.ListUploads(ctx, c.sess.Tenant, c.sess.ID, "")
	if err != nil {
		return err
	}
	for _, u := range ups {
		if u.Path != from && !strings.HasPrefix(u.Path, from+"/") {
			continue
		}
		if err := st.DeleteUploads(ctx, c.sess.Tenant, c.sess.ID, u.Path); err != nil {
			return err
		}
		u.Path = to + strings.TrimPrefix(u.Path, from)
		if err := st.PutUpload(ctx, u); err != nil {
			return err
		}
	}
	return nil
}

// Remove removes what is at rel (a directory only if recursive) and the
// upload records at and below it. Below uploads/ it removes a
// conversation's uploads; the rest of what sbx manages is refused.
func (c *Call) Remove(ctx context.Context, rel string, recursive bool) error {
	clean, err := workspace.CleanPath(rel)
	if err != nil {
		return err
	}
	err = c.remove(ctx, clean, recursive)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	// Sandboxed code may have removed the file itself: its record goes
	// all the same, or the slot it holds would never come back.
	if derr := c.s.opt.Uploads.DeleteUploads(ctx, c.sess.Tenant, c.sess.ID, clean); derr != nil {
		return derr
	}
	return err
}

func (c *Call) remove(ctx context.Context, rel string, recursive bool) error {
	if workspace.InUploads(rel) {
		return c.ws.RemoveUpload(ctx, rel, recursive)
	}
	return c.ws.Remove(ctx, rel, recursive)
}

// RemoveConversation removes conversation cid's uploads and their
// records. It is not an error if there are none.
func (c *Call) RemoveConversation(ctx context.Context, cid string) error {
	if err := c.ws.RemoveConversation(ctx, cid); err != nil {
		return err
	}
	return c.s.opt.Uploads.DeleteConversationUploads(ctx, c.sess.Tenant, c.sess.ID, cid)
}

// The reads need no policy beyond the workspace's path safety.

// Open opens the regular file at rel for reading (workspace.Open).
func (c *Call) Open(ctx context.Context, rel string) (workspace.File, error) {
	return c.ws.Open(ctx, rel)
}

// Stat describes what is at rel without following a link there.
func (c *Call) Stat(ctx context.Context, rel string) (workspace.Entry, error) {
	return c.ws.Stat(ctx, rel)
}

// List lists rel (workspace.List).
func (c *Call) List(ctx context.Context, rel string, recursive bool, maxEntries int) ([]workspace.Entry, bool, error) {
	return c.ws.List(ctx, rel, recursive, maxEntries)
}

// Resources returns the resources in place (workspace.Resources).
func (c *Call) Resources(ctx context.Context) ([]workspace.Resource, error) {
	return c.ws.Resources(ctx)
}

// SyncResources brings .resources/ in line with want: sbx's own change to
// what it manages, through the resource endpoints only.
func (c *Call) SyncResources(ctx context.Context, want []workspace.Resource, content workspace.ResourceContent) (workspace.ResourceSync, error) {
	return c.ws.SyncResources(ctx, want, content)
}
