package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// Replicas (Options.Replica) are processes that serve the same sessions
// over one store and one data directory. What keeps them from stepping on
// each other:
//
//   - A session's lock is also a lease in the store (lease), so that one
//     replica at a time changes a session: starts, pauses, hibernates,
//     restores or deletes it.
//   - The record is the truth about a session's sandbox. What a replica
//     remembers of it (its entry) is made to agree with the record under
//     the lock (sync): a sandbox the record no longer names is let go,
//     one it names that this replica does not hold is adopted.
//   - An execution does not take the lock: it checks the record still
//     names its sandbox, running, in the same compare-and-swap write that
//     records its activity (confirm). Whoever pauses or hibernates a
//     session writes its record first and freezes after, and the reaper
//     does so only if no activity was written since it read the record;
//     so of an execution and a pause that meet, one sees the other's write
//     and backs off.
//   - Executions and file calls in flight write activity every second
//     (keepActive), which keeps the reaper of another replica away.

// replicas is that coordination: the Manager's side of every other
// replica.
type replicas struct{ m *Manager }

// shared says other replicas may serve this process's sessions.
func (m *Manager) shared() bool { return m.opt.Replica != "" }

// sync makes what this process holds of the session's sandbox agree with
// the record, which another replica may have changed: a sandbox the
// record no longer names is let go (whoever replaced it destroyed it),
// and one it names that this process does not hold is adopted if the
// runtime has it, or cleared from the record if not. A process alone
// with its store has nothing to sync. The caller holds the session's
// lock; rec is brought up to date in place.
func (r *replicas) sync(ctx context.Context, rec *store.Session) error {
	m := r.m
	if !m.shared() {
		return nil
	}
	e := m.entry(key{rec.Tenant, rec.ID})
	e.mu.Lock()
	if e.slot.State() == sandbox.SlotStarting {
		e.unlock() // this process's start, waiting for the lock: it adopts
		return nil
	}
	if sb := e.slot.Held(); sb != nil {
		if sb.ID == rec.SandboxID && rec.Status != api.StatusTerminated {
			// Another replica may have frozen or thawed it: the record
			// says which (a frozen one marked running is thawed by the
			// next wake-up, which resumes it whatever it is).
			want := sandbox.SlotRunning
			if rec.Status == api.StatusPaused {
				want = sandbox.SlotPaused
			}
			err := e.slot.Move(want, nil, nil)
			e.unlock()
			return err
		}
		sb.Client.Close()
		e.slot.Drop()
	}
	e.unlock()
	if rec.SandboxID == "" || rec.Status == api.StatusTerminated {
		return nil
	}
	sb, frozen, err := m.replicas.adopt(ctx, rec)
	if sb == nil || err != nil {
		return err
	}
	e.mu.Lock()
	defer e.unlock()
	if frozen {
		return e.slot.Move(sandbox.SlotPaused, sb, nil)
	}
	return e.slot.Move(sandbox.SlotRunning, sb, nil)
}

// adopt returns the sandbox the record names, and whether it is frozen,
// if the runtime has it running or frozen (another replica started it,
// or a previous process). One that is gone, or stopped, is destroyed and
// cleared from the record (nil), so that the next start makes a new one
// over the same workspace. The caller holds the session's lock.
func (r *replicas) adopt(ctx context.Context, rec *store.Session) (sb *sandbox.Sandbox, frozen bool, err error) {
	m := r.m
	sb, frozen, res, err := m.sbx.Reattach(ctx, rec.Tenant, rec.TemplateID, pinnedBuild(rec), rec.SandboxID)
	if err != nil {
		return nil, false, err
	}
	if sb != nil {
		m.entry(key{rec.Tenant, rec.ID}).setRes(res.MemoryMB, res.CPU)
		return sb, frozen, nil
	}
	m.log.Warn("a session's sandbox is gone; a new one starts over the same workspace", "tenant", rec.Tenant, "session", rec.ID, "sandbox", rec.SandboxID)
	m.opt.Events("lost")
	return nil, false, m.clearLost(ctx, rec)
}

// errStale says the record no longer names the sandbox this process
// remembers for the session, running: another replica changed it.
var errStale = errors.New("the session's sandbox changed in another replica")

// touchIf records activity on the session, now, if ok says the record
// allows it, in one compare-and-swap write (read again and retried when
// another write came first). It does not take the session's lock: a
// locked change that meets it carries the activity over (save). It
// returns errStale if ok refused, ErrNotFound for a terminated session.
func (r *replicas) touchIf(ctx context.Context, k key, ok func(*store.Session) bool) error {
	m := r.m
	for try := 0; ; try++ {
		rec, err := m.opt.Store.GetSession(ctx, k.tenant, k.id)
		if err != nil {
			return err
		}
		if rec.Status == api.StatusTerminated {
			return fmt.Errorf("session %q is terminated: %w", k.id, errdefs.ErrNotFound)
		}
		if !ok(rec) {
			return errStale
		}
		rec.LastActivityAt = time.Now().UTC()
		err = m.write(ctx, rec)
		if !errors.Is(err, errdefs.ErrConflict) || try == 100 {
			return err
		}
	}
}

// confirm checks, for an execution about to use sb, that the record still
// names it running, and records the activity in the same write.
func (r *replicas) confirm(ctx context.Context, e *entry, sb *sandbox.Sandbox) error {
	m := r.m
	err := m.replicas.touchIf(ctx, e.key, func(rec *store.Session) bool {
		return rec.SandboxID == sb.ID && rec.Status == api.StatusRunning
	})
	if err == nil {
		e.mu.Lock()
		e.touched = time.Now()
		e.unlock()
	}
	return err
}

// keepActive writes activity, every second, for the sessions this
// process runs executions or file calls on, so that the reaper of
// another replica, which knows nothing of them, finds them busy.
func (r *replicas) keepActive() {
	m := r.m
	defer m.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		// Not e.mu under m.mu: a lifecycle call holds e.mu across runtime
		// calls, and m.mu is every call's.
		m.mu.Lock()
		entries := make([]*entry, 0, len(m.entries))
		for _, e := range m.entries {
			entries = append(entries, e)
		}
		m.mu.Unlock()
		for _, e := range entries {
			e.mu.Lock()
			busy, files := e.active > 0 || e.files > 0, e.files > 0
			e.unlock()
			if busy {
				m.touch(m.ctx, e.key)
			}
			if files {
				m.renewFiles(m.ctx, e)
			}
		}
	}
}

// busyElsewhere refuses a change that would pull the sandbox from under
// an execution another replica runs (its record in the store says so),
// or, but for a pause, the workspace from under another replica's file
// call (its file lease, files.go).
func (r *replicas) busyElsewhere(ctx context.Context, rec *store.Session, to string) error {
	m := r.m
	if !m.shared() {
		return nil
	}
	list, _, err := m.opt.Store.ListExecutions(ctx, rec.Tenant, rec.ID, 100, "")
	if err != nil {
		return err
	}
	n := 0
	for _, x := range list {
		if x.Status == api.ExecRunning || x.Status == api.ExecPending {
			n++
		}
	}
	if n > 0 {
		return &TransitionError{Session: rec.ID, From: rec.Status, To: to, Why: fmt.Sprintf("%d executions are running; wait for them or cancel them", n)}
	}
	if to == api.StatusPaused {
		return nil // a file call goes on over a frozen sandbox's workspace
	}
	k := key{rec.Tenant, rec.ID}
	leases, err := m.opt.Store.LiveLeases(ctx, filesLeasePrefix(k))
	if err != nil {
		return err
	}
	for _, name := range leases {
		if name != m.fileLease(k) { // this process's: entry.busy
			return &TransitionError{Session: rec.ID, From: rec.Status, To: to, Why: "a file call is using its workspace; try again in a moment"}
		}
	}
	return nil
}

// sweepEvery is how often the replica that runs the reaper looks for the
// sandboxes of dead replicas that no record names (sandboxes.sweep).
const sweepEvery = time.Minute

// sweep destroys the sandboxes of dead replicas that no record names.
func (r *replicas) sweep(ctx context.Context) {
	m := r.m
	m.sbx.Sweep(ctx, func(ctx context.Context) (map[string]bool, error) {
		recs, err := m.opt.Store.ListSandboxSessions(ctx)
		if err != nil {
			return nil, err
		}
		named := map[string]bool{}
		for _, rec := range recs {
			named[rec.SandboxID] = true
		}
		return named, nil
	})
}
