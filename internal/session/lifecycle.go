package session

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Pause freezes the session's sandbox. A session without a sandbox
// has nothing to freeze and is simply marked paused; the next call makes
// it running again either way.
func (m *Manager) Pause(ctx context.Context, tenant, id string) (*Session, error) {
	return m.withRecord(ctx, key{tenant, id}, m.pauses.pause)
}

// withRecord runs op on the session's record under the session's lock and
// returns the session as op leaves it.
func (m *Manager) withRecord(ctx context.Context, k key, op func(context.Context, *store.Session) (*store.Session, error)) (*Session, error) {
	unlock, err := m.locks.lock(ctx, k)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := m.record(ctx, k)
	if err != nil {
		return nil, err
	}
	if err := m.replicas.sync(ctx, rec); err != nil {
		return nil, err
	}
	if rec, err = op(ctx, rec); err != nil {
		return nil, err
	}
	return m.decode(rec)
}

// pauses freezes and thaws sessions' sandboxes, and fences the
// record before a pause or a hibernation touches a sandbox.
type pauses struct{ m *Manager }

// pause freezes the sandbox and marks the session paused. A start or an
// execution in flight refuses it (the reaper then tries again later). The
// caller holds the session's lock.
func (pz *pauses) pause(ctx context.Context, rec *store.Session) (*store.Session, error) {
	m := pz.m
	return m.pauses.freeze(ctx, rec, false)
}

// freeze is pause; idle says the reaper asks, for an idle session, and
// then activity written since rec was read (by an execution that did not
// need the lock, here or in another replica) refuses it.
//
// The record says paused before the sandbox is frozen: an execution that
// checks the record after this write goes for the lock and waits; one
// whose activity was written before it makes an idle pause fail. A crash
// between the two leaves a running sandbox marked paused, which the next
// call thaws as if it were frozen.
func (pz *pauses) freeze(ctx context.Context, rec *store.Session, idle bool) (*store.Session, error) {
	m := pz.m
	if rec.Status == api.StatusPaused {
		return rec, nil
	}
	rec, err := m.pauses.freezeEntry(ctx, rec, idle)
	if err == nil {
		m.emit(ctx, api.EventSessionPaused, rec, api.EventData{Reason: reasonOf(idle)})
	}
	return rec, err
}

// freezeEntry does freeze's work, under the entry's lock.
func (pz *pauses) freezeEntry(ctx context.Context, rec *store.Session, idle bool) (*store.Session, error) {
	m := pz.m
	if !canMove(rec.Status, api.StatusPaused) {
		return nil, &TransitionError{Session: rec.ID, From: rec.Status, To: api.StatusPaused}
	}
	e := m.entry(key{rec.Tenant, rec.ID})
	e.mu.Lock()
	defer e.unlock()
	if err := e.busy(rec, api.StatusPaused); err != nil {
		return nil, err
	}
	was := rec.Status
	if err := m.pauses.fence(ctx, rec, api.StatusPaused, api.StatusPaused, idle); err != nil {
		return nil, err
	}
	if e.slot.State() == sandbox.SlotRunning {
		err := freezeSandbox(ctx, e.slot.Held())
		if err == nil {
			err = e.slot.Move(sandbox.SlotPaused, nil, nil)
		}
		if err != nil {
			if _, merr := m.move(context.WithoutCancel(ctx), rec, was, ""); merr != nil {
				m.log.Error("recording a pause that failed", "session", rec.ID, "err", merr)
			}
			return nil, err
		}
	}
	m.opt.Events("pause")
	return rec, nil
}

// fence moves the record to status before a pause or hibernation (to,
// for the messages) touches the sandbox, in a write that fails if
// anything was written since rec was read: an execution that did not
// need the lock (confirm), here or in another replica. For the reaper
// (idle) that means the session is not idle any more (TransitionError,
// "look later"). For a request, the record is read again and the
// executions in the store looked at once more: one that came in between
// refuses the change, as one running before did.
func (pz *pauses) fence(ctx context.Context, rec *store.Session, status, to string, idle bool) error {
	m := pz.m
	for {
		if !idle {
			if err := m.replicas.busyElsewhere(ctx, rec, to); err != nil {
				return err
			}
		}
		prev := rec.Status
		rec.Status, rec.Error = status, ""
		err := m.write(ctx, rec)
		if err == nil {
			return nil
		}
		rec.Status = prev
		if !errors.Is(err, errdefs.ErrConflict) {
			return err
		}
		if idle {
			return &TransitionError{Session: rec.ID, From: prev, To: to, Why: "it was used meanwhile"}
		}
		cur, err := m.opt.Store.GetSession(ctx, rec.Tenant, rec.ID)
		if err != nil {
			return err
		}
		if cur.Status != prev || cur.SandboxID != rec.SandboxID {
			// Only activity is written without the lock this process
			// holds; anything else means the lock was lost.
			return fmt.Errorf("session %q changed under its lock: %w", rec.ID, errdefs.ErrConflict)
		}
		*rec = *cur
	}
}

// isState says err is a runtime's refusal because the sandbox is in
// state already.
func isState(err error, state runtime.State) bool {
	var se *runtime.StateError
	return errors.As(err, &se) && se.State == state
}

// freezeSandbox freezes sb's processes if its runtime can pause
// (runtime.Pauser); one frozen already is fine. A sandbox whose runtime
// cannot (a Pod) is held back by its state in the session alone
// (sandbox.SlotPaused): nothing runs in it, since no execution starts in a
// paused sandbox and none outlives its execution, so a pause keeps what a
// freeze keeps (the session's processes and memory), a hibernation's copy
// is as consistent, and only the idle executor goes on using its memory.
// The reaper hibernates such a session when it idles rather than pausing
// it (reapOne).
func freezeSandbox(ctx context.Context, sb *sandbox.Sandbox) error {
	p, ok := runtime.PauserOf(sb.Runtime)
	if !ok {
		return nil
	}
	if err := p.Pause(ctx, sb.ID); err != nil && !isState(err, runtime.StatePaused) {
		return err
	}
	return nil
}

// resume thaws sb; one that is running already is fine (a crash between
// a pause's record and its freeze, or another replica thawed it), and so
// is one whose runtime cannot pause (freezeSandbox).
func resume(ctx context.Context, sb *sandbox.Sandbox) error {
	p, ok := runtime.PauserOf(sb.Runtime)
	if !ok {
		return nil
	}
	if err := p.Resume(ctx, sb.ID); err != nil && !isState(err, runtime.StateRunning) {
		return err
	}
	return nil
}

// canPause says whether the runtime of rec's sandbox can freeze it: the
// runtime of the sandbox this process holds, else its template's.
func (pz *pauses) canPause(ctx context.Context, rec *store.Session) bool {
	m := pz.m
	if e := m.peek(key{rec.Tenant, rec.ID}); e != nil {
		if sb := e.pubSB.Load(); sb != nil {
			return runtime.CapabilitiesOf(sb.Runtime).Pause
		}
	}
	spec, err := m.sbx.Spec(ctx, rec.Tenant, rec.TemplateID)
	if err != nil {
		return true // freeze copes either way
	}
	rt, err := m.sbx.Runtime(spec.Runtime)
	if err != nil {
		return true
	}
	return runtime.CapabilitiesOf(rt).Pause
}

// busy refuses a change that would pull the sandbox from under a start or
// an execution. The caller holds e.mu.
func (e *entry) busy(rec *store.Session, to string) error {
	switch {
	case e.slot.State() == sandbox.SlotStarting:
		return &TransitionError{Session: rec.ID, From: rec.Status, To: to, Why: "its sandbox is starting; try again in a moment"}
	case e.active == 1:
		return &TransitionError{Session: rec.ID, From: rec.Status, To: to, Why: "an execution is running; wait for it or cancel it"}
	case e.active > 1:
		return &TransitionError{Session: rec.ID, From: rec.Status, To: to, Why: fmt.Sprintf("%d executions are running; wait for them or cancel them", e.active)}
	case e.files > 0 && to != api.StatusPaused:
		return &TransitionError{Session: rec.ID, From: rec.Status, To: to, Why: "a file call is using its workspace; try again in a moment"}
	}
	return nil
}

// Resume makes a session running: it thaws a paused sandbox,
// restores a hibernated workspace, and starts a sandbox in the background
// when there is none, so that the next execution finds it warm. A session
// in error goes to pending while its new sandbox starts.
func (m *Manager) Resume(ctx context.Context, tenant, id string) (*Session, error) {
	return m.wakeUp(ctx, key{tenant, id}, true)
}

// wakeUp brings a paused or hibernated session back to running; with
// start, it also starts a sandbox if there is none and none coming.
func (m *Manager) wakeUp(ctx context.Context, k key, start bool) (*Session, error) {
	unlock, err := m.locks.lock(ctx, k)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := m.record(ctx, k)
	if err != nil {
		return nil, err
	}
	if rec.Status == api.StatusTerminated {
		return nil, &TransitionError{Session: k.id, From: rec.Status, To: api.StatusRunning, Why: "create it again"}
	}
	if err := m.replicas.sync(ctx, rec); err != nil {
		return nil, err
	}
	if rec.Status == api.StatusHibernated {
		if rec, err = m.hibernation.restore(ctx, rec); err != nil {
			return nil, err
		}
	}
	// A frozen sandbox is thawed whatever the record says: a crash
	// between the freeze and its record leaves the two apart.
	e := m.entry(k)
	e.mu.Lock()
	if e.slot.State() == sandbox.SlotPaused {
		err := resume(ctx, e.slot.Held())
		if errors.Is(err, errdefs.ErrNotFound) {
			// Gone: a replica that died between destroying it for a
			// hibernation and recording that, or a kill from outside. The
			// session goes on with a new sandbox, as for a lost one.
			m.log.Warn("a paused session's sandbox is gone; a new one starts over the same workspace", "session", k.id, "sandbox", e.slot.Held().ID)
			m.opt.Events("lost")
			e.slot.Drop().Client.Close()
			e.unlock()
			if rec.SandboxID != "" {
				if err := m.clearLost(ctx, rec); err != nil {
					return nil, err
				}
			}
			e.mu.Lock()
		} else {
			if err == nil {
				err = e.slot.Move(sandbox.SlotRunning, nil, nil)
			}
			if err != nil {
				e.unlock()
				return nil, err
			}
			noteAcquire(ctx, acquireResume)
		}
	}
	e.unlock()
	if rec.Status == api.StatusPaused {
		m.opt.Events("resume")
		if rec, err = m.move(ctx, rec, api.StatusRunning, ""); err != nil {
			return nil, err
		}
		m.emit(ctx, api.EventSessionResumed, rec, api.EventData{})
	}
	if start {
		s, err := m.decode(rec)
		if err != nil {
			return nil, err
		}
		started, err := m.starts.kick(e, s)
		if err != nil {
			return nil, err
		}
		noteStarted(ctx, e, started)
		if started {
			// A sandbox from a warm pool is in the record already (kick
			// wrote it): move on from that record, not from rec, which
			// the store would refuse as stale.
			if rec, err = m.record(ctx, k); err != nil {
				return nil, err
			}
		}
		if started && rec.Status == api.StatusError {
			if rec, err = m.move(ctx, rec, api.StatusPending, ""); err != nil {
				return nil, err
			}
		}
	}
	return m.decode(rec)
}

// record reads the session's record; ErrNotFound for an invalid id.
func (m *Manager) record(ctx context.Context, k key) (*store.Session, error) {
	if !ValidID(k.id) {
		return nil, fmt.Errorf("session %q: %w", k.id, errdefs.ErrNotFound)
	}
	return m.opt.Store.GetSession(ctx, k.tenant, k.id)
}

// Hibernate saves the session's workspace to the blob store and destroys
// its sandbox; the next call restores it.
func (m *Manager) Hibernate(ctx context.Context, tenant, id string) (*Session, error) {
	return m.withRecord(ctx, key{tenant, id}, m.hibernation.hibernate)
}

// hibernation moves an idle session's workspace to the blob store and
// its sandbox away, and brings it back on the next call.
type hibernation struct{ m *Manager }

// hibernate does Hibernate's work. The caller holds the session's lock.
//
// The order makes a crash at any point harmless: the workspace is saved
// before the record says hibernated, and removed (moved to the trash in one
// rename) only after; a restore that finds the directory still there uses
// it, since nothing could change it once the sandbox was gone.
func (hb *hibernation) hibernate(ctx context.Context, rec *store.Session) (*store.Session, error) {
	m := hb.m
	return m.hibernation.hibernateAs(ctx, rec, false)
}

// hibernateAs is hibernate; idle says the reaper asks, as for freeze.
func (hb *hibernation) hibernateAs(ctx context.Context, rec *store.Session, idle bool) (*store.Session, error) {
	m := hb.m
	if rec.Status == api.StatusHibernated {
		return rec, nil
	}
	if !canMove(rec.Status, api.StatusHibernated) {
		return nil, &TransitionError{Session: rec.ID, From: rec.Status, To: api.StatusHibernated}
	}
	if m.opt.Snapshots == nil {
		return nil, fmt.Errorf("session %q: hibernation needs a blob store, and this server has none: %w", rec.ID, errdefs.ErrUnavailable)
	}
	k := key{rec.Tenant, rec.ID}
	e := m.entry(k)
	e.mu.Lock()
	if err := e.busy(rec, api.StatusHibernated); err != nil {
		e.unlock()
		return nil, err
	}
	// The record changes first, as for freeze: a running session is
	// marked paused, and one used meanwhile is left alone.
	was, to := rec.Status, rec.Status
	if was == api.StatusRunning {
		to = api.StatusPaused
	}
	if err := m.pauses.fence(ctx, rec, to, api.StatusHibernated, idle); err != nil {
		e.unlock()
		return nil, err
	}
	undo := func() {
		if was == to {
			return
		}
		if _, err := m.move(context.WithoutCancel(ctx), rec, was, ""); err != nil {
			m.log.Error("recording a hibernation that failed", "session", rec.ID, "err", err)
		}
	}
	// The sandbox is frozen, not destroyed, for the copy: a workspace
	// that cannot be saved (past the snapshot limits, say) leaves the
	// session as it was, processes and all. File calls wait (saving).
	sb, prev := e.slot.Held(), e.snap
	frozen := false
	if e.slot.State() == sandbox.SlotRunning {
		err := freezeSandbox(ctx, sb)
		if err == nil {
			err = e.slot.Move(sandbox.SlotPaused, nil, nil)
		}
		if err != nil {
			e.unlock()
			undo()
			return nil, err
		}
		frozen = true
	}
	e.saving = true
	e.unlock()
	if sb == nil && rec.SandboxID != "" {
		m.sbx.DestroyRecorded(ctx, rec.Tenant, rec.TemplateID, pinnedBuild(rec), rec.SandboxID)
		rec.SandboxID = ""
		if err := m.save(ctx, rec); err != nil {
			m.log.Error("recording a destroyed sandbox", "session", rec.ID, "err", err)
		}
	}
	_, st, err := m.saveWorkspace(ctx, k, sb, hibernatedKey(k), prev)
	m.Stored().Add(k.tenant, st.NewBytes+st.Manifest) // failed saves leave chunks too
	e.mu.Lock()
	e.saving = false
	mine := e.slot.Held() == sb
	if err != nil {
		e.unlock()
		if frozen && mine {
			m.pauses.thaw(context.WithoutCancel(ctx), e, sb)
		}
		undo()
		return nil, fmt.Errorf("session %q: saving its workspace: %w", rec.ID, err)
	}
	if mine {
		e.slot.Drop()
	}
	e.unlock()
	if sb != nil && mine {
		m.sbx.Destroy(ctx, sb)
	}
	rec.SandboxID = ""
	rec, err = m.move(ctx, rec, api.StatusHibernated, "")
	if err != nil {
		return nil, err
	}
	if err := m.ws.Discard(ctx, volume(k)); err != nil {
		m.log.Error("removing a hibernated workspace", "session", rec.ID, "err", err)
	}
	// Told once the workspace is off the host, not before.
	m.emit(ctx, api.EventSessionHibernated, rec, api.EventData{Reason: reasonOf(idle)})
	m.opt.Events("hibernate")
	return rec, nil
}

// restoreHibernated puts a hibernated session's workspace back on the
// host and makes it running. The caller holds the session's lock.
func (hb *hibernation) restoreHibernated(ctx context.Context, rec *store.Session) (*store.Session, error) {
	m := hb.m
	k := key{rec.Tenant, rec.ID}
	there, err := m.ws.Exists(ctx, volume(k))
	if err != nil {
		return nil, err
	}
	if !there {
		if m.opt.Snapshots == nil {
			return nil, fmt.Errorf("session %q is hibernated and this server has no blob store: %w", rec.ID, errdefs.ErrUnavailable)
		}
		s, err := m.decode(rec)
		if err != nil {
			return nil, err
		}
		if err := m.ws.Restore(ctx, volume(k), hibernatedKey(k), s.Config.Resources.DiskMB); err != nil {
			return nil, fmt.Errorf("session %q: restoring its hibernated workspace: %w", rec.ID, err)
		}
	}
	rec.LastActivityAt = time.Now().UTC()
	rec, err = m.move(ctx, rec, api.StatusRunning, "")
	if err != nil {
		return nil, err
	}
	m.emit(ctx, api.EventSessionRestored, rec, api.EventData{})
	if m.opt.Snapshots != nil {
		if err := m.opt.Snapshots.Delete(ctx, hibernatedKey(k)); err != nil {
			m.log.Warn("removing a hibernated workspace's manifest", "session", rec.ID, "err", err)
		}
	}
	m.opt.Events("restore")
	return rec, nil
}

// volume is the name of the session's workspace in the workspace store.
func volume(k key) string { return workspace.SessionVolume(k.tenant, k.id) }

// Blob keys of a session's saved workspaces: TENANT/SESSION/hibernated
// and TENANT/SESSION/snapshots/ID.
func hibernatedKey(k key) string          { return k.tenant + "/" + k.id + "/hibernated" }
func snapshotPrefix(k key) string         { return k.tenant + "/" + k.id + "/snapshots/" }
func snapshotKey(k key, id string) string { return snapshotPrefix(k) + id }

var snapshotIDPattern = regexp.MustCompile(`^snap-[0-9]{8}T[0-9]{9}Z-[0-9a-f]{8}$`)

func newSnapshotID() string {
	b := newID("x")[2:10]
	return "snap-" + strings.Replace(time.Now().UTC().Format("20060102T150405.000Z"), ".", "", 1) + "-" + b
}

// SnapshotInfo describes a snapshot of a session's workspace.
type SnapshotInfo struct {
	ID, SessionID string
	CreatedAt     time.Time
	// Files, Dirs and Symlinks count the workspace's entries; Bytes is the
	// size of its files.
	Files, Dirs, Symlinks int
	Bytes                 int64
	// NewBytes, only in what Snapshots.Create returns, is what the
	// snapshot added to the blob store (content it had already is not
	// stored twice).
	NewBytes int64
}

func snapshotInfo(k key, id string, mf *snapshot.Manifest) SnapshotInfo {
	return SnapshotInfo{
		ID: id, SessionID: k.id, CreatedAt: mf.CreatedAt.UTC(),
		Files: mf.Files, Dirs: mf.Dirs, Symlinks: mf.Symlinks, Bytes: mf.Size,
	}
}

// thaw resumes sb, frozen for a snapshot, unless it is no longer the
// session's sandbox.
func (pz *pauses) thaw(ctx context.Context, e *entry, sb *sandbox.Sandbox) {
	m := pz.m
	e.mu.Lock()
	defer e.unlock()
	if e.slot.Held() != sb || e.slot.State() != sandbox.SlotPaused {
		return
	}
	err := resume(ctx, sb)
	if err == nil {
		err = e.slot.Move(sandbox.SlotRunning, nil, nil)
	}
	if err != nil {
		m.log.Error("thawing a sandbox after a snapshot", "session", e.id, "err", err)
	}
}

// live reads a session's record; a terminated session is ErrNotFound.
func (m *Manager) live(ctx context.Context, k key) (*store.Session, error) {
	rec, err := m.record(ctx, k)
	if err != nil {
		return nil, err
	}
	if rec.Status == api.StatusTerminated {
		return nil, fmt.Errorf("session %q is terminated: %w", k.id, errdefs.ErrNotFound)
	}
	return rec, nil
}
