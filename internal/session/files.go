package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// A file call's place in the session's lifecycle. What a call may do to
// the files is the file policy's (internal/files); here is only what
// opening the workspace means to the session: a file call is activity,
// it wakes a paused or hibernated session, and while it is open no
// hibernation, warm-pool claim or snapshot restore (in this process or,
// through the file lease, in another) takes the workspace from under it.

// FileCall is a session's workspace open for a file call. Close it: while
// it is open the workspace is not hibernated or replaced under the call.
type FileCall struct {
	// Session is the session as the call found it: its config holds the
	// file limits the policy applies.
	Session *Session
	// Workspace is the session's files.
	Workspace workspace.Workspace
	// end ends the call on the session's entry; nil for a FileCall made
	// outside a Manager (a test's), which has no lifecycle to end.
	end func()
}

// Close ends the file call and closes the workspace.
func (c *FileCall) Close() error {
	if c.end != nil {
		c.end()
	}
	return c.Workspace.Close()
}

// OpenFiles opens the session's workspace for a file call. A file call is
// activity: it thaws a paused session and restores a hibernated one
//
func (m *Manager) OpenFiles(ctx context.Context, tenant, id string) (*FileCall, error) {
	s, err := m.Get(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	k := key{tenant, id}
	// Where a workspace lives with its sandbox (a Pod's), a file call
	// needs the sandbox running, and holds it as an execution does; every
	// write is checkpointed before it is answered.
	cp, withSandbox := m.ws.(workspace.Checkpointer)
	for attempt := 0; withSandbox; attempt++ {
		lease, err := m.Acquire(ctx, tenant, id)
		if err != nil {
			return nil, err
		}
		sandbox := lease.SandboxID
		fc, err := m.openFiles(ctx, k, s, func(ctx context.Context) (workspace.Workspace, error) {
			return cp.OpenIn(ctx, volume(k), sandbox)
		})
		if err != nil {
			// A sandbox gone from under the session (a Pod deleted) is
			// let go, as an execution that finds it dead lets it go, and
			// the call starts a new one with the workspace as it was.
			if attempt == 0 && errors.Is(err, errdefs.ErrUnavailable) && lease.Lost(ctx) {
				lease.release()
				continue
			}
			lease.release()
			return nil, err
		}
		end := fc.end
		fc.end = func() { end(); lease.release() }
		fc.Workspace = checkpointing{Workspace: fc.Workspace, save: func(ctx context.Context) error {
			return m.checkpointed(ctx, k, func() error { return cp.Checkpoint(ctx, volume(k), sandbox) })
		}}
		return fc, nil
	}
	return m.openFiles(ctx, k, s, func(ctx context.Context) (workspace.Workspace, error) {
		return m.ws.Open(ctx, volume(k))
	})
}

// openFiles opens the session's workspace with open, once no
// hibernation, claim or restore is taking it.
func (m *Manager) openFiles(ctx context.Context, k key, s *Session, open func(context.Context) (workspace.Workspace, error)) (*FileCall, error) {
	tenant, id := k.tenant, k.id
	var err error
	for {
		switch s.Status {
		case api.StatusTerminated:
			return nil, fmt.Errorf("session %q is terminated: %w", id, errdefs.ErrNotFound)
		case api.StatusPaused, api.StatusHibernated:
			if _, err = m.wakeUp(ctx, k, false); err != nil {
				return nil, err
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
				return nil, err
			} else {
				unlock()
			}
			if s, err = m.Get(ctx, tenant, id); err != nil {
				return nil, err
			}
			continue
		}
		e.files++
		e.unlock()
		h := &fileHold{e: e, m: m}
		if m.shared() {
			// Another replica may be hibernating the session: it marks
			// the record paused first, and an idle hibernation gives way
			// to activity written before that. The file lease, taken
			// before the record is looked at, makes one that comes later
			// give way (busyElsewhere).
			if err := h.lease(ctx); err != nil {
				h.release()
				return nil, err
			}
			err := m.replicas.touchIf(ctx, k, func(rec *store.Session) bool {
				return rec.Status != api.StatusPaused && rec.Status != api.StatusHibernated
			})
			if err != nil {
				h.release()
				if !errors.Is(err, errStale) {
					return nil, err
				}
				if s, err = m.Get(ctx, tenant, id); err != nil {
					return nil, err
				}
				continue
			}
		}
		if s, err = m.Get(ctx, tenant, id); err != nil || s.Status == api.StatusHibernated || s.Status == api.StatusTerminated {
			h.release()
			if err != nil {
				return nil, err
			}
			continue
		}
		ws, err := open(ctx)
		if err != nil {
			h.release()
			return nil, err
		}
		m.touch(ctx, k)
		return &FileCall{Session: s, Workspace: ws, end: h.release}, nil
	}
}

// fileHold is a file call's count on the session's entry and, between
// replicas, its part in the file lease.
type fileHold struct {
	m      *Manager
	e      *entry
	leased bool // counted in e.fileCalls, under the file lease (lease)
	once   sync.Once
}

// lease counts the call among the entry's leased file calls; the first
// takes this process's file lease (keepActive renews it while calls are
// open, renewFiles).
func (h *fileHold) lease(ctx context.Context) error {
	m, e := h.m, h.e
	e.fileMu.Lock()
	defer e.fileMu.Unlock()
	if e.fileCalls == 0 {
		if _, _, err := m.opt.Store.TryLease(ctx, m.fileLease(e.key), m.opt.Replica, fileLeaseTTL); err != nil {
			return fmt.Errorf("session %q: a file call: %w", e.id, err)
		}
	}
	e.fileCalls++
	h.leased = true
	return nil
}

// release ends the call: it uncounts it on the entry and, with the last
// leased call, gives the file lease up.
func (h *fileHold) release() {
	h.once.Do(func() {
		h.e.mu.Lock()
		h.e.files--
		h.e.unlock()
		if h.leased {
			h.unlease()
		}
	})
}

func (h *fileHold) unlease() {
	m, e := h.m, h.e
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

// checkpointing is a workspace whose every write is followed by a
// checkpoint (workspace.Checkpointer) before it returns: a write answered
// is a write that outlives the sandbox.
type checkpointing struct {
	workspace.Workspace
	save func(ctx context.Context) error
}

func (w checkpointing) after(ctx context.Context, err error) error {
	if err != nil {
		return err
	}
	if err := w.save(ctx); err != nil {
		return fmt.Errorf("the write is done but could not be saved beyond the sandbox: %w", err)
	}
	return nil
}

func (w checkpointing) Save(ctx context.Context, rel string, r io.Reader, maxBytes int64) (workspace.SavedFile, error) {
	f, err := w.Workspace.Save(ctx, rel, r, maxBytes)
	return f, w.after(ctx, err)
}

func (w checkpointing) SaveUpload(ctx context.Context, cid, rel string, r io.Reader, maxBytes int64) (workspace.SavedFile, error) {
	f, err := w.Workspace.SaveUpload(ctx, cid, rel, r, maxBytes)
	return f, w.after(ctx, err)
}

func (w checkpointing) MakeDir(ctx context.Context, rel string) error {
	return w.after(ctx, w.Workspace.MakeDir(ctx, rel))
}

func (w checkpointing) Rename(ctx context.Context, from, to string) error {
	return w.after(ctx, w.Workspace.Rename(ctx, from, to))
}

func (w checkpointing) Remove(ctx context.Context, rel string, recursive bool) error {
	return w.after(ctx, w.Workspace.Remove(ctx, rel, recursive))
}

func (w checkpointing) RemoveUpload(ctx context.Context, rel string, recursive bool) error {
	return w.after(ctx, w.Workspace.RemoveUpload(ctx, rel, recursive))
}

func (w checkpointing) RemoveConversation(ctx context.Context, cid string) error {
	return w.after(ctx, w.Workspace.RemoveConversation(ctx, cid))
}

func (w checkpointing) SyncResources(ctx context.Context, want []workspace.Resource, content workspace.ResourceContent) (workspace.ResourceSync, error) {
	rs, err := w.Workspace.SyncResources(ctx, want, content)
	return rs, w.after(ctx, err)
}

func (w checkpointing) Import(ctx context.Context, r io.Reader) error {
	return w.after(ctx, w.Workspace.Import(ctx, r))
}
