package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// The file policy. Every front door that changes a session's files (the
// main API's upload and delete, the upload_file tool and so MCP, E2B's
// file calls) goes through Files, and Files is the one place that applies
// the session's file_upload_config (size, allowed types, count) and keeps
// the upload records the count is taken from. Where a change may land is
// the workspace package's decision, on the real file (resolve.go). Errors
// carry errdefs categories; each edge maps them to its own statuses once.

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
func (f *Files) Write(ctx context.Context, w FileWrite) (workspace.SavedFile, error) {
	rel, err := workspace.CleanPath(w.Path)
	if err != nil {
		return workspace.SavedFile{}, err
	}
	if rel == "." {
		return workspace.SavedFile{}, fmt.Errorf("path %q names no file: %w", w.Path, errdefs.ErrInvalidArgument)
	}
	up := f.sess.Config.Upload
	name := path.Base(rel)
	if !f.sess.Config.AllowsFile(name, w.MediaType) {
		return workspace.SavedFile{}, fmt.Errorf("%q (%s) is not an allowed file type; the session allows %s: %w",
			name, orUnknown(w.MediaType), strings.Join(up.AllowedFileTypes, ", "), errdefs.ErrUnsupportedType)
	}
	dest := rel
	if w.ConversationID != "" {
		if !ValidID(w.ConversationID) {
			return workspace.SavedFile{}, fmt.Errorf("conversation_id %q is not a valid id: %w", w.ConversationID, errdefs.ErrInvalidArgument)
		}
		dest = path.Join(workspace.ConversationDir(w.ConversationID), rel)
	}
	undo, err := f.holdSlot(ctx, dest, w.ConversationID)
	if err != nil {
		return workspace.SavedFile{}, err
	}
	var saved workspace.SavedFile
	if w.ConversationID != "" {
		saved, err = f.ws.SaveUpload(ctx, w.ConversationID, rel, w.Body, f.sess.Config.MaxUploadBytes())
	} else {
		saved, err = f.ws.Save(ctx, rel, w.Body, f.sess.Config.MaxUploadBytes())
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
	if err := f.m.opt.Store.PutUpload(ctx, &store.Upload{
		Tenant: f.sess.Tenant, SessionID: f.sess.ID, Path: saved.Path, ConversationID: w.ConversationID,
		Size: saved.Size, SHA256: saved.SHA256, CreatedAt: time.Now().UTC(),
	}); err != nil {
		f.remove(context.WithoutCancel(ctx), saved.Path, false)
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
func (f *Files) holdSlot(ctx context.Context, dest, cid string) (undo func(), err error) {
	noop := func() {}
	limit := f.sess.Config.Upload.MaxFileCount
	if limit <= 0 {
		return noop, nil
	}
	st, tenant, id := f.m.opt.Store, f.sess.Tenant, f.sess.ID
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
			f.m.log.Warn("giving back an upload slot", "session", id, "path", dest, "err", err)
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
func (f *Files) MakeDir(ctx context.Context, rel string) error {
	return f.ws.MakeDir(ctx, rel)
}

// Move moves what is at from to to (see workspace.Rename); the upload
// records of what moved move with it, so a move does not free a slot of
// max_file_count.
func (f *Files) Move(ctx context.Context, from, to string) error {
	if err := f.ws.Rename(ctx, from, to); err != nil {
		return err
	}
	from, _ = workspace.CleanPath(from)
	to, _ = workspace.CleanPath(to)
	st := f.m.opt.Store
	// What was at to is gone.
	if err := st.DeleteUploads(ctx, f.sess.Tenant, f.sess.ID, to); err != nil {
		return err
	}
	ups, err := st.ListUploads(ctx, f.sess.Tenant, f.sess.ID, "")
	if err != nil {
		return err
	}
	for _, u := range ups {
		if u.Path != from && !strings.HasPrefix(u.Path, from+"/") {
			continue
		}
		if err := st.DeleteUploads(ctx, f.sess.Tenant, f.sess.ID, u.Path); err != nil {
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
func (f *Files) Remove(ctx context.Context, rel string, recursive bool) error {
	clean, err := workspace.CleanPath(rel)
	if err != nil {
		return err
	}
	err = f.remove(ctx, clean, recursive)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	// Sandboxed code may have removed the file itself: its record goes
	// all the same, or the slot it holds would never come back.
	if derr := f.m.opt.Store.DeleteUploads(ctx, f.sess.Tenant, f.sess.ID, clean); derr != nil {
		return derr
	}
	return err
}

func (f *Files) remove(ctx context.Context, rel string, recursive bool) error {
	if workspace.InUploads(rel) {
		return f.ws.RemoveUpload(ctx, rel, recursive)
	}
	return f.ws.Remove(ctx, rel, recursive)
}

// RemoveConversation removes conversation cid's uploads and their
// records. It is not an error if there are none.
func (f *Files) RemoveConversation(ctx context.Context, cid string) error {
	if err := f.ws.RemoveConversation(ctx, cid); err != nil {
		return err
	}
	return f.m.opt.Store.DeleteConversationUploads(ctx, f.sess.Tenant, f.sess.ID, cid)
}

// The reads need no policy beyond the workspace's path safety.

// Open opens the regular file at rel for reading (workspace.Open).
func (f *Files) Open(ctx context.Context, rel string) (workspace.File, error) {
	return f.ws.Open(ctx, rel)
}

// Stat describes what is at rel without following a link there.
func (f *Files) Stat(ctx context.Context, rel string) (workspace.Entry, error) {
	return f.ws.Stat(ctx, rel)
}

// List lists rel (workspace.List).
func (f *Files) List(ctx context.Context, rel string, recursive bool, maxEntries int) ([]workspace.Entry, bool, error) {
	return f.ws.List(ctx, rel, recursive, maxEntries)
}

// Resources returns the resources in place (workspace.Resources).
func (f *Files) Resources(ctx context.Context) ([]workspace.Resource, error) {
	return f.ws.Resources(ctx)
}

// SyncResources brings .resources/ in line with want: sbx's own change to
// what it manages, through the resource endpoints only.
func (f *Files) SyncResources(ctx context.Context, want []workspace.Resource, content workspace.ResourceContent) (workspace.ResourceSync, error) {
	return f.ws.SyncResources(ctx, want, content)
}

// Files is a session's workspace open for a file call (files.go). Close
// it: while it is open the workspace is not hibernated or replaced under
// the call.
type Files struct {
	ws     workspace.Workspace
	sess   *Session
	m      *Manager
	e      *entry
	leased bool // holds the session's file lease (holdFiles)
	once   sync.Once
}

// Close closes the workspace and ends the file call.
func (f *Files) Close() error {
	f.release()
	return f.ws.Close()
}

// Workspace opens the session's workspace for a file call. A file call is
// activity: it thaws a paused session and restores a hibernated one
//
func (m *Manager) Workspace(ctx context.Context, tenant, id string) (*Session, *Files, error) {
	s, err := m.Get(ctx, tenant, id)
	if err != nil {
		return nil, nil, err
	}
	k := key{tenant, id}
	for {
		switch s.Status {
		case api.StatusTerminated:
			return nil, nil, fmt.Errorf("session %q is terminated: %w", id, errdefs.ErrNotFound)
		case api.StatusPaused, api.StatusHibernated:
			if _, err = m.wakeUp(ctx, k, false); err != nil {
				return nil, nil, err
			}
		}
		// Count the call before opening, then make sure no hibernation
		// slipped in between the status read and the count.
		e := m.entry(k)
		e.mu.Lock()
		for e.claiming { // a warm-pool claim is moving the workspace: a few ms
			e.unlock()
			time.Sleep(time.Millisecond)
			e.mu.Lock()
		}
		if e.saving {
			// A write now would be lost with the hibernated directory:
			// wait for the hibernation, then look again.
			e.unlock()
			if unlock, err := m.locks.lock(ctx, k); err != nil {
				return nil, nil, err
			} else {
				unlock()
			}
			if s, err = m.Get(ctx, tenant, id); err != nil {
				return nil, nil, err
			}
			continue
		}
		e.files++
		e.unlock()
		f := &Files{e: e, m: m}
		if m.shared() {
			// Another replica may be hibernating the session: it marks
			// the record paused first, and an idle hibernation gives way
			// to activity written before that. The file lease, taken
			// before the record is looked at, makes one that comes later
			// give way (busyElsewhere).
			if err := m.holdFiles(ctx, e); err != nil {
				f.release()
				return nil, nil, err
			}
			f.leased = true
			err := m.replicas.touchIf(ctx, k, func(rec *store.Session) bool {
				return rec.Status != api.StatusPaused && rec.Status != api.StatusHibernated
			})
			if err != nil {
				f.release()
				if !errors.Is(err, errStale) {
					return nil, nil, err
				}
				if s, err = m.Get(ctx, tenant, id); err != nil {
					return nil, nil, err
				}
				continue
			}
		}
		if s, err = m.Get(ctx, tenant, id); err != nil || s.Status == api.StatusHibernated || s.Status == api.StatusTerminated {
			f.release()
			if err != nil {
				return nil, nil, err
			}
			continue
		}
		ws, err := m.ws.Open(ctx, volume(k))
		if err != nil {
			f.release()
			return nil, nil, err
		}
		f.ws, f.sess = ws, s
		m.touch(ctx, k)
		return s, f, nil
	}
}

func (f *Files) release() {
	f.once.Do(func() {
		f.e.mu.Lock()
		f.e.files--
		f.e.unlock()
		if f.leased {
			f.m.releaseFiles(f.e)
		}
	})
}

// Between replicas, a process with file calls open on a session holds
// the session's file lease of its own (files/LEN/TENANT/ID/REPLICA in the
// store) from before the first call looks at the record until the last
// one ends; keepActive renews it. A hibernation or a snapshot restore
// through another replica refuses while one is live (busyElsewhere), as
// the count on the entry refuses it here (entry.busy): what the call
// writes would be lost with the workspace that goes.
const fileLeaseTTL = 10 * time.Second

// filesLeasePrefix is the prefix of a session's file leases; the
// tenant's length keeps any tenant name from reaching another's.
func filesLeasePrefix(k key) string {
	return fmt.Sprintf("files/%d/%s/%s/", len(k.tenant), k.tenant, k.id)
}

// fileLease is this process's file lease on the session.
func (m *Manager) fileLease(k key) string { return filesLeasePrefix(k) + m.opt.Replica }

// holdFiles counts a file call on the entry's session; the first takes
// this process's file lease (keepActive renews it while calls are open).
func (m *Manager) holdFiles(ctx context.Context, e *entry) error {
	e.fileMu.Lock()
	defer e.fileMu.Unlock()
	if e.fileCalls == 0 {
		if _, _, err := m.opt.Store.TryLease(ctx, m.fileLease(e.key), m.opt.Replica, fileLeaseTTL); err != nil {
			return fmt.Errorf("session %q: a file call: %w", e.id, err)
		}
	}
	e.fileCalls++
	return nil
}

// releaseFiles ends a file call counted by holdFiles, and gives the file
// lease up with the last one.
func (m *Manager) releaseFiles(e *entry) {
	e.fileMu.Lock()
	defer e.fileMu.Unlock()
	if e.fileCalls--; e.fileCalls > 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.opt.Store.ReleaseLease(ctx, m.fileLease(e.key), m.opt.Replica); err != nil {
		m.log.Warn("releasing a session's file lease; others wait until it runs out", "session", e.id, "err", err)
	}
}

// renewFiles renews the file lease while file calls are open.
func (m *Manager) renewFiles(ctx context.Context, e *entry) {
	e.fileMu.Lock()
	defer e.fileMu.Unlock()
	if e.fileCalls == 0 {
		return
	}
	if _, _, err := m.opt.Store.TryLease(ctx, m.fileLease(e.key), m.opt.Replica, fileLeaseTTL); err != nil {
		m.log.Warn("renewing a session's file lease", "session", e.id, "err", err)
	}
}
