package session

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
)

// Snapshots are a session's saved workspaces that it can go back to
// create, list, describe, delete and restore them. The
// hibernated workspace is the lifecycle's (lifecycle.go); these are the
// user's.
type Snapshots struct{ m *Manager }

// Snapshots is the sessions' snapshots.
func (m *Manager) Snapshots() *Snapshots { return &Snapshots{m} }

// Create saves the session's workspace as a snapshot: files
// unchanged since the last snapshot are not read again, and content the
// blob store has already is not stored twice. A running sandbox is frozen
// for the copy, so the snapshot is of one moment.
func (sn *Snapshots) Create(ctx context.Context, tenant, id string) (*SnapshotInfo, error) {
	m := sn.m
	if m.opt.Snapshots == nil {
		return nil, fmt.Errorf("snapshots need a blob store, and this server has none: %w", errdefs.ErrUnavailable)
	}
	k := key{tenant, id}
	unlock, err := m.locks.lock(ctx, k)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := m.live(ctx, k)
	if err != nil {
		return nil, err
	}
	if err := m.replicas.sync(ctx, rec); err != nil {
		return nil, err
	}
	if max := m.Limits(tenant).Snapshots; max > 0 {
		have := 0
		if err := m.opt.Snapshots.List(ctx, snapshotPrefix(k), func(blob.Info) error { have++; return nil }); err != nil {
			return nil, err
		}
		if have >= max {
			return nil, quotaError(tenant, "snapshots of session "+strconv.Quote(id), have, 1, max, "delete one of its snapshots first")
		}
	}
	if err := m.Stored().Admit(ctx, tenant); err != nil {
		return nil, err
	}
	if rec.Status == api.StatusHibernated {
		if _, err = m.hibernation.restoreHibernated(ctx, rec); err != nil {
			return nil, err
		}
	}
	// The sandbox is frozen for the copy and marked paused, and e.mu is
	// let go: the copy can take minutes, and e.mu is the session's
	// everyday lock. An execution that comes meanwhile finds the sandbox
	// paused and waits for the session's lock in wakeUp.
	e := m.entry(k)
	e.mu.Lock()
	sb, prev := e.slot.Held(), e.snap
	if e.slot.State() == sandbox.SlotRunning {
		if err := freezeSandbox(ctx, sb); err == nil && e.slot.Move(sandbox.SlotPaused, nil, nil) == nil {
			defer m.pauses.thaw(context.WithoutCancel(ctx), e, sb)
		}
	}
	e.unlock()
	sid := newSnapshotID()
	mf, st, err := m.saveWorkspace(ctx, k, sb, snapshotKey(k, sid), prev)
	m.Stored().Add(tenant, st.NewBytes+st.Manifest)
	if err != nil {
		return nil, fmt.Errorf("session %q: snapshot: %w", id, err)
	}
	e.mu.Lock()
	e.snap = mf
	e.unlock()
	m.emit(ctx, api.EventSessionSnapshot, rec, api.EventData{SnapshotID: sid})
	out := snapshotInfo(k, sid, mf)
	out.NewBytes = st.NewBytes
	return &out, nil
}

// List lists the session's snapshots, oldest first.
func (sn *Snapshots) List(ctx context.Context, tenant, id string) ([]SnapshotInfo, error) {
	m := sn.m
	k := key{tenant, id}
	if _, err := m.live(ctx, k); err != nil {
		return nil, err
	}
	out := []SnapshotInfo{}
	if m.opt.Snapshots == nil {
		return out, nil
	}
	// In order of keys, which is of ids, which is of time.
	err := m.opt.Snapshots.List(ctx, snapshotPrefix(k), func(info blob.Info) error {
		sid := strings.TrimPrefix(info.Key, snapshotPrefix(k))
		mf, err := m.opt.Snapshots.Load(ctx, info.Key)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil // deleted meanwhile
		}
		if err != nil {
			return err
		}
		out = append(out, snapshotInfo(k, sid, mf))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Get describes one snapshot; ErrNotFound if the session has none of
// that id.
func (sn *Snapshots) Get(ctx context.Context, tenant, id, sid string) (*SnapshotInfo, error) {
	m := sn.m
	k := key{tenant, id}
	if _, err := m.live(ctx, k); err != nil {
		return nil, err
	}
	mf, err := sn.load(ctx, k, sid)
	if err != nil {
		return nil, err
	}
	out := snapshotInfo(k, sid, mf)
	return &out, nil
}

func (sn *Snapshots) load(ctx context.Context, k key, sid string) (*snapshot.Manifest, error) {
	m := sn.m
	if m.opt.Snapshots == nil || !snapshotIDPattern.MatchString(sid) {
		return nil, fmt.Errorf("snapshot %q: %w", sid, errdefs.ErrNotFound)
	}
	mf, err := m.opt.Snapshots.Load(ctx, snapshotKey(k, sid))
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, fmt.Errorf("snapshot %q: %w", sid, errdefs.ErrNotFound)
	}
	return mf, err
}

// Delete removes a snapshot; its content goes with the next
// collection of what no snapshot references.
func (sn *Snapshots) Delete(ctx context.Context, tenant, id, sid string) error {
	m := sn.m
	k := key{tenant, id}
	unlock, err := m.locks.lock(ctx, k)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := m.live(ctx, k); err != nil {
		return err
	}
	if _, err := sn.load(ctx, k, sid); err != nil {
		return err
	}
	return m.opt.Snapshots.Delete(ctx, snapshotKey(k, sid))
}

// Restore replaces the session's workspace with a snapshot's
// . The sandbox is destroyed first: its processes and contexts
// belonged to the workspace that goes; the next execution gets a new one.
// The new workspace takes the old one's place in one atomic exchange.
func (sn *Snapshots) Restore(ctx context.Context, tenant, id, sid string) (*Session, error) {
	m := sn.m
	k := key{tenant, id}
	unlock, err := m.locks.lock(ctx, k)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := m.live(ctx, k)
	if err != nil {
		return nil, err
	}
	if err := m.replicas.sync(ctx, rec); err != nil {
		return nil, err
	}
	if _, err := sn.load(ctx, k, sid); err != nil {
		return nil, err
	}
	// Another replica's executions and file calls hold it off too: the
	// sandbox and the workspace they use go.
	if err := m.replicas.busyElsewhere(ctx, rec, api.StatusRunning); err != nil {
		return nil, err
	}
	e := m.entry(k)
	e.mu.Lock()
	if err := e.busy(rec, api.StatusRunning); err != nil {
		e.unlock()
		return nil, err
	}
	sb := e.slot.Drop()
	e.snap = nil
	e.unlock()
	if sb != nil {
		m.sbx.Destroy(ctx, sb)
	} else if rec.SandboxID != "" {
		m.sbx.DestroyRecorded(ctx, rec.Tenant, rec.TemplateID, pinnedBuild(rec), rec.SandboxID)
	}
	rec.SandboxID = ""
	s, err := m.decode(rec)
	if err != nil {
		return nil, err
	}
	if err := m.ws.Restore(ctx, volume(k), snapshotKey(k, sid), s.Config.Resources.DiskMB); err != nil {
		if serr := m.save(ctx, rec); serr != nil {
			m.log.Error("recording a destroyed sandbox", "session", id, "err", serr)
		}
		return nil, fmt.Errorf("session %q: restoring snapshot %s: %w", id, sid, err)
	}
	if rec.Status == api.StatusHibernated {
		if err := m.opt.Snapshots.Delete(ctx, hibernatedKey(k)); err != nil {
			m.log.Warn("removing a hibernated workspace's manifest", "session", id, "err", err)
		}
	}
	rec.LastActivityAt = time.Now().UTC()
	if rec, err = m.move(ctx, rec, api.StatusRunning, ""); err != nil {
		return nil, err
	}
	m.emit(ctx, api.EventSessionSnapshotRestored, rec, api.EventData{SnapshotID: sid})
	return m.decode(rec)
}

// drop removes the session's snapshots and hibernated workspace.
func (sn *Snapshots) drop(ctx context.Context, k key) {
	m := sn.m
	if m.opt.Snapshots == nil {
		return
	}
	err := m.opt.Snapshots.List(ctx, k.tenant+"/"+k.id+"/", func(info blob.Info) error {
		if err := m.opt.Snapshots.Delete(ctx, info.Key); err != nil {
			m.log.Warn("removing a deleted session's snapshot", "session", k.id, "err", err)
		}
		return nil
	})
	if err != nil {
		m.log.Warn("listing a deleted session's snapshots", "session", k.id, "err", err)
	}
}
