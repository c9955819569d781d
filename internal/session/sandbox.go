package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/snapshot"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Lease is a ready sandbox's executor, handed to one execution. While a
// lease is out the sandbox is neither paused nor hibernated by the reaper.
// The execution calls Release when it is over.
type Lease struct {
	Client *execclient.Client
	// SandboxID names the sandbox (for logs).
	SandboxID string

	m    *Manager
	e    *entry
	sb   *sandbox.Sandbox
	once sync.Once
}

// Release gives the lease back; the session's idle time counts from now.
// Where workspaces live with their sandboxes (workspace.Checkpointer: a
// Pod's), it first saves the workspace as its checkpoint, so that what
// the execution wrote outlives the sandbox before the execution is
// reported done. The error is the checkpoint's: ErrUnavailable if the
// sandbox no longer holds the workspace (its Pod deleted while its
// container still ran the execution, say), and then what the execution
// wrote is lost with it.
func (l *Lease) Release() error {
	var err error
	l.once.Do(func() {
		err = l.m.checkpoint(l.e.key, l.sb.ID)
		l.release()
	})
	return err
}

// ReleaseUnchanged gives the lease back after an execution whose
// executor said it changed nothing in the workspace
// (wire.Result.WorkspaceUnchanged): the checkpoint it would take is the
// last one.
func (l *Lease) ReleaseUnchanged() { l.once.Do(l.release) }

// release gives the lease back without a checkpoint.
func (l *Lease) release() {
	l.e.mu.Lock()
	l.e.active--
	l.e.unlock()
	l.m.touch(context.Background(), l.e.key)
}

// checkpointTimeout bounds one checkpoint: it is on the way of the
// execution or file write that made it.
const checkpointTimeout = 2 * time.Minute

// checkpoint saves the session's workspace, as its sandbox holds it, as
// its checkpoint, where the workspace store keeps them
// (workspace.Checkpointer); a failure is
// logged and told as an event: the files written since the last
// checkpoint are then only in the sandbox.
func (m *Manager) checkpoint(k key, sandbox string) error {
	cp, ok := m.ws.(workspace.Checkpointer)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkpointTimeout)
	defer cancel()
	err := m.checkpointed(ctx, k, func() error { return cp.Checkpoint(ctx, volume(k), sandbox) })
	if err != nil {
		m.log.Error("checkpointing a workspace; what was written since the last checkpoint is only in its sandbox", "session", k.id, "err", err)
		m.opt.Events("checkpoint_failed")
	}
	return err
}

// Lost reports whether the lease's sandbox has died (killed from outside,
// its executor gone), after an execution failed to reach it. A dead
// sandbox is let go: the session's next call starts a new one over the
// same workspace.
func (l *Lease) Lost(ctx context.Context) bool {
	info, err := l.sb.Runtime.Inspect(ctx, l.sb.ID)
	if err == nil && info.State == runtime.StatePaused {
		return false // frozen (a snapshot, another replica's pause): alive
	}
	if err == nil && info.State == runtime.StateRunning {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, herr := l.sb.Client.Health(hctx)
		cancel()
		if herr == nil {
			return false
		}
	} else if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return false // cannot tell
	}
	l.m.log.Warn("sandbox lost; the next call starts a new one", "session", l.e.id, "sandbox", l.sb.ID)
	l.m.opt.Events("lost")
	l.e.mu.Lock()
	mine := l.e.slot.Held() == l.sb
	if mine {
		l.e.slot.Drop()
	}
	l.e.unlock()
	if mine {
		l.m.sbx.Destroy(context.WithoutCancel(ctx), l.sb)
		l.m.forget(l.e.key, l.sb.ID)
	}
	return true
}

// forget clears the record's sandbox if it still names id.
func (m *Manager) forget(k key, id string) {
	ctx := context.Background()
	unlock, err := m.locks.lock(ctx, k)
	if err != nil {
		m.log.Error("recording a lost sandbox", "session", k.id, "err", err)
		return
	}
	defer unlock()
	rec, err := m.opt.Store.GetSession(ctx, k.tenant, k.id)
	if err != nil || rec.SandboxID != id {
		return
	}
	rec.SandboxID = ""
	if rec.Status == api.StatusPaused {
		rec.Status = api.StatusRunning
	}
	if err := m.save(ctx, rec); err != nil {
		m.log.Error("recording a lost sandbox", "session", k.id, "err", err)
		return
	}
	m.emit(ctx, api.EventSessionSandboxLost, rec, api.EventData{SandboxID: id})
}

// Acquire returns the executor of the session's sandbox, once it is ready:
// it thaws a paused sandbox, restores a hibernated workspace, starts a
// sandbox when there is none and waits for a start in flight.
// A sandbox that cannot be had is ErrUnavailable. The caller releases the
// lease. A traced caller gets a span of it (trace.go).
func (m *Manager) Acquire(ctx context.Context, tenant, id string) (lease *Lease, err error) {
	ctx, traced := traceAcquire(ctx, id)
	defer func() { traced(lease, err) }()
	k := key{tenant, id}
	for {
		e := m.entry(k)
		e.mu.Lock()
		if e.deleted {
			e.unlock()
			return nil, fmt.Errorf("session %q was deleted: %w", id, errdefs.ErrNotFound)
		}
		if sb := e.slot.Held(); sb != nil && e.slot.State() == sandbox.SlotRunning {
			e.active++
			e.unlock()
			l := &Lease{Client: sb.Client, SandboxID: sb.ID, m: m, e: e, sb: sb}
			if !m.shared() {
				m.touch(ctx, k)
				return l, nil
			}
			err := m.replicas.confirm(ctx, e, sb)
			if err == nil {
				return l, nil
			}
			l.once.Do(func() {
				e.mu.Lock()
				e.active--
				e.unlock()
			})
			if !errors.Is(err, errStale) {
				return nil, err
			}
			// Another replica paused, hibernated or replaced the sandbox:
			// wake the session up under its lock, which syncs.
			if _, err := m.wakeUp(ctx, k, true); err != nil {
				return nil, err
			}
			continue
		}
		st := e.slot.Starting()
		e.unlock()
		if st == nil {
			if _, err := m.wakeUp(ctx, k, true); err != nil {
				if errors.As(err, new(*TransitionError)) {
					// Terminated meanwhile.
					return nil, fmt.Errorf("session %q is terminated: %w", id, errdefs.ErrNotFound)
				}
				return nil, err
			}
			continue
		}
		noteAcquire(ctx, acquireColdStart)
		select {
		case <-st.Done:
			if st.Err != nil {
				return nil, st.Err
			}
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// starts gives sessions their sandboxes: a claim from a warm pool, an
// adoption of a live one the record names, or a new start in the
// background, each admitted and recorded.
type starts struct{ m *Manager }

// kick starts a sandbox for the session in the background, unless one is
// up or on its way; it reports whether it started one. Past MaxSandboxes it
// is ErrUnavailable. The caller holds the session's lock.
func (ss *starts) kick(e *entry, s *Session) (bool, error) {
	m := ss.m
	sb, started, err := m.starts.admitStart(e, s)
	switch {
	case sb != nil:
		rec := s.Session
		rec.Status, rec.SandboxID = api.StatusRunning, sb.ID
		m.emit(m.ctx, api.EventSessionRunning, &rec, api.EventData{Pool: true})
	case started:
		m.emit(m.ctx, api.EventSessionStarting, &s.Session, api.EventData{})
	}
	return started, err
}

// admitStart does kick's work: it returns the sandbox claimed from a warm
// pool (recorded already), or whether it started one in the background.
// The caller holds the session's lock.
func (ss *starts) admitStart(e *entry, s *Session) (*sandbox.Sandbox, bool, error) {
	m := ss.m
	e.mu.Lock()
	busy := e.slot.State() != sandbox.SlotNone
	e.unlock()
	if busy {
		return nil, false, nil
	}
	// The checks hold until the start is on the entry, where the next
	// check counts it.
	m.admission.sandboxes.Lock()
	defer m.admission.sandboxes.Unlock()
	if max := m.opt.MaxSandboxes; max > 0 {
		if n := m.starts.sandboxes(); n >= max {
			return nil, false, fmt.Errorf("session %q: no sandbox: this server is at its limit of %d sandboxes; try again later: %w", s.ID, max, errdefs.ErrUnavailable)
		}
	}
	if err := m.admission.admitSandbox(s); err != nil {
		return nil, false, fmt.Errorf("session %q: no sandbox: %w", s.ID, err)
	}
	e.setRes(s.Config.Resources.MemoryMB, s.Config.Resources.CPU)
	if sb := m.starts.fromPool(e, s); sb != nil {
		return sb, true, nil
	}
	e.mu.Lock()
	defer e.unlock()
	ctx, cancel := context.WithCancel(m.ctx)
	st := sandbox.NewStart(cancel)
	if err := e.slot.Move(sandbox.SlotStarting, nil, st); err != nil {
		cancel()
		return nil, false, err
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		m.starts.start(ctx, e, s, st)
	}()
	return nil, true, nil
}

// start does the start kick asked for, under the session's lock (which
// kick's caller still holds when it begins): it adopts a live sandbox the
// record names, another replica's start, or starts one, and records the
// outcome. Waiters on st learn it. A delete cancels ctx.
func (ss *starts) start(ctx context.Context, e *entry, s *Session, st *sandbox.Start) {
	m := ss.m
	defer close(st.Done)
	var sb *sandbox.Sandbox
	unlock, err := m.locks.lock(ctx, e.key)
	if err == nil {
		defer unlock()
		sb, err = m.starts.startOrAdopt(ctx, e, s)
	}
	e.mu.Lock()
	if e.slot.Starting() == st {
		e.slot.Drop() // a delete may have let it go already
	}
	if err == nil && (e.deleted || ctx.Err() != nil) {
		err = fmt.Errorf("session %q: deleted while its sandbox started: %w", s.ID, errdefs.ErrNotFound)
	} else if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("session %q: deleted while its sandbox started: %v: %w", s.ID, err, errdefs.ErrNotFound)
	}
	if err == nil {
		err = e.slot.Move(sandbox.SlotRunning, sb, nil)
	}
	e.unlock()
	if err != nil {
		if sb != nil {
			m.sbx.Destroy(context.Background(), sb)
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			if errors.Is(err, template.ErrNotBuilt) {
				// Its own answer: 503 while the template builds, 409
				// once its build failed (retrying will not help).
				m.log.Info("no sandbox: the template is not built", "tenant", s.Tenant, "session", s.ID, "err", err)
				err = fmt.Errorf("session %q: no sandbox: %w", s.ID, err)
			} else {
				m.log.Error("sandbox start failed", "tenant", s.Tenant, "session", s.ID, "err", err)
				err = fmt.Errorf("session %q: no sandbox: %v: %w", s.ID, err, errdefs.ErrUnavailable)
			}
			if unlock != nil {
				m.starts.recordStart(e.key, api.StatusError, err.Error(), nil)
			}
		}
		st.Err = err
		return
	}
	m.starts.recordStart(e.key, api.StatusRunning, "", sb)
}

// startOrAdopt gives the session a sandbox: the live one its record
// names (another replica started it meanwhile), or a new one. The caller
// holds the session's lock.
func (ss *starts) startOrAdopt(ctx context.Context, e *entry, s *Session) (*sandbox.Sandbox, error) {
	m := ss.m
	rec, err := m.opt.Store.GetSession(ctx, s.Tenant, s.ID)
	if err != nil {
		return nil, err
	}
	if rec.Status == api.StatusTerminated {
		return nil, fmt.Errorf("session %q: deleted while its sandbox started: %w", s.ID, errdefs.ErrNotFound)
	}
	if rec.SandboxID != "" {
		sb, frozen, err := m.replicas.adopt(ctx, rec)
		if err != nil {
			return nil, err
		}
		if sb != nil {
			if frozen {
				if err := resume(ctx, sb); err != nil {
					return nil, err
				}
			}
			return sb, nil
		}
	}
	return m.starts.startSandbox(ctx, s)
}

// fromPool gives the session a sandbox from its template's warm pool, if
// it can have one, and records it. The caller holds the session's lock.
func (ss *starts) fromPool(e *entry, s *Session) *sandbox.Sandbox {
	m := ss.m
	if !m.sbx.Pooling() {
		return nil
	}
	e.mu.Lock()
	if e.files > 0 || e.deleted {
		e.unlock()
		return nil // a file call has the workspace open: start cold
	}
	e.claiming = true
	e.unlock()
	pd, ok := m.sbx.Claim(request(s))
	e.mu.Lock()
	e.claiming = false
	if ok {
		if err := e.slot.Move(sandbox.SlotRunning, pd.Sandbox, nil); err != nil {
			m.log.Error("warm pool: claiming a sandbox", "session", e.id, "err", err)
			ok = false
			defer m.sbx.DropPooled(pd)
		}
	}
	e.unlock()
	if !ok {
		return nil
	}
	// One write: the sandbox, the status and the template build it runs.
	ctx := context.Background()
	rec, err := m.opt.Store.GetSession(ctx, e.tenant, e.id)
	if err == nil {
		var cur *Session
		if cur, err = m.decode(rec); err == nil {
			cur.Config.TemplateHash = pd.Build
			rec.Config, _ = json.Marshal(cur.Config)
			rec.SandboxID = pd.Sandbox.ID
			_, err = m.move(ctx, rec, api.StatusRunning, "")
		}
	}
	if err != nil {
		m.log.Error("recording a sandbox from the warm pool", "session", e.id, "err", err)
	}
	return pd.Sandbox
}

// sandboxes counts the sandboxes this server has or is starting.
func (ss *starts) sandboxes() int {
	m := ss.m
	c := m.SandboxCounts()
	return c[api.SandboxStarting] + c[api.SandboxRunning] + c[api.SandboxPaused]
}

// recordStart writes the outcome of a sandbox start to the store, unless
// the session was deleted meanwhile. The caller holds the session's lock.
func (ss *starts) recordStart(k key, status, msg string, sb *sandbox.Sandbox) {
	m := ss.m
	ctx := context.Background()
	rec, err := m.opt.Store.GetSession(ctx, k.tenant, k.id)
	if err != nil || rec.Status == api.StatusTerminated {
		return
	}
	was, wasSandbox := rec.Status, rec.SandboxID
	if sb != nil && status == api.StatusRunning {
		rec.SandboxID = sb.ID
	}
	if _, err := m.move(ctx, rec, status, msg); err != nil {
		m.log.Error("recording sandbox start", "session", k.id, "err", err)
		return
	}
	switch {
	case status == api.StatusError:
		m.emit(ctx, api.EventSessionError, rec, api.EventData{Error: msg})
	case was != rec.Status || wasSandbox != rec.SandboxID:
		// Not when it adopted what another replica started and recorded.
		m.emit(ctx, api.EventSessionRunning, rec, api.EventData{})
	}
}

// request is what the session asks of its sandbox.
func request(s *Session) sandbox.Request {
	return sandbox.Request{
		Tenant: s.Tenant, Session: s.ID, Template: s.TemplateID, Build: s.Config.TemplateHash,
		Env: s.Config.Env, Resources: runtime.Resources{
			CPU: s.Config.Resources.CPU, MemoryMB: s.Config.Resources.MemoryMB, DiskMB: s.Config.Resources.DiskMB,
		},
	}
}

// startSandbox creates a sandbox for the session and pins the template
// build it runs in the record. The caller holds the session's lock.
func (ss *starts) startSandbox(ctx context.Context, s *Session) (*sandbox.Sandbox, error) {
	m := ss.m
	sb, hash, err := m.sbx.Create(ctx, request(s))
	if err != nil {
		return nil, err
	}
	if hash != s.Config.TemplateHash {
		m.starts.pinLocked(key{s.Tenant, s.ID}, hash)
	}
	return sb, nil
}

// clearLost clears a record's sandbox, gone from its runtime; a paused
// session becomes running (the next call starts a sandbox). A record
// written since it was read (activity, or a replica that did not hold
// the lock: Start reads a list) is read again and cleared if it still
// names that sandbox.
func (m *Manager) clearLost(ctx context.Context, rec *store.Session) error {
	gone := rec.SandboxID
	for try := 0; ; try++ {
		rec.SandboxID = ""
		if rec.Status == api.StatusPaused {
			rec.Status = api.StatusRunning
		}
		err := m.write(ctx, rec)
		if err == nil {
			m.emit(ctx, api.EventSessionSandboxLost, rec, api.EventData{SandboxID: gone})
		}
		if !errors.Is(err, errdefs.ErrConflict) || try == 100 {
			return err
		}
		rec, err = m.opt.Store.GetSession(ctx, rec.Tenant, rec.ID)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if rec.SandboxID != gone || rec.Status == api.StatusTerminated {
			return nil
		}
	}
}

// Start reconciles the store with the sandboxes that exist, then
// starts the reaper. A session's recorded sandbox that is still there is
// adopted as it is (running or frozen); one that is gone is cleared from
// the record, and the session's next call starts a new sandbox over the
// same workspace; a sandbox no session names is destroyed. The runtimes
// looked at are the default and those of the recorded sessions'
// templates; one that cannot be had is skipped with its sessions.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.sbx.CheckPools(); err != nil {
		return err
	}
	recs, err := m.opt.Store.ListSandboxSessions(ctx)
	if err != nil {
		return err
	}
	runtimeOf := func(rec *store.Session) string {
		if spec, err := m.sbx.Spec(ctx, rec.Tenant, rec.TemplateID); err == nil {
			return spec.Runtime
		}
		if t, err := m.opt.Templates.Get(pinnedBuild(rec)); err == nil {
			return t.Spec.Runtime // its template was deleted while it ran
		}
		return ""
	}
	live, listed := m.sbx.List(ctx, append([]string{""}, mapSlice(recs, runtimeOf)...))
	adopted, lost := 0, 0
	for _, rec := range recs {
		if !listed[runtimeOf(rec)] {
			continue // its runtime cannot say; leave the record as it is
		}
		f, ok := live[rec.SandboxID]
		// A sandbox from a warm pool carries the pool's labels, not the
		// session's: the record naming it is what makes it the session's.
		mine := f.Info.Labels[sandbox.LabelSession] == rec.ID && f.Info.Labels[sandbox.LabelTenant] == rec.Tenant || f.Info.Labels[sandbox.LabelPool] != ""
		usable := ok && mine && (f.Info.State == runtime.StateRunning || f.Info.State == runtime.StatePaused)
		if usable {
			delete(live, rec.SandboxID)
			e := m.entry(key{rec.Tenant, rec.ID})
			state := sandbox.SlotRunning
			if f.Info.State == runtime.StatePaused {
				state = sandbox.SlotPaused
			}
			e.mu.Lock()
			err := e.slot.Move(state, sandbox.Attach(f.Runtime, f.Info.ID), nil)
			e.setRes(f.Info.Resources.MemoryMB, f.Info.Resources.CPU)
			e.unlock()
			if err != nil {
				return err
			}
			adopted++
			continue
		}
		lost++
		m.log.Warn("a session's sandbox is gone; its next call starts a new one", "tenant", rec.Tenant, "session", rec.ID, "sandbox", rec.SandboxID)
		m.opt.Events("lost")
		if err := m.clearLost(ctx, rec); err != nil {
			return err
		}
	}
	// What is left no session took: destroyed, but for live replicas'.
	peers := m.sbx.DestroyOrphans(ctx, live)
	if adopted+lost > 0 {
		m.log.Info("reconciled sessions with their sandboxes", "adopted", adopted, "lost", lost)
	}
	// What a previous server left: workspaces being removed, and those
	// of pooled sandboxes no session took, but for live replicas' pools.
	if err := m.ws.Reset(ctx, peers); err != nil {
		m.log.Warn("emptying the workspace trash and the warm pools' workspaces", "err", err)
	}
	m.wg.Add(1)
	go m.Reaper().run()
	if m.shared() {
		m.wg.Add(1)
		go m.replicas.keepActive()
	}
	m.sbx.StartPools()
	return nil
}

func mapSlice[T, U any](in []T, f func(T) U) []U {
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

// pinLocked records the template build a session's sandbox runs. The
// caller holds the session's lock.
func (ss *starts) pinLocked(k key, hash string) {
	m := ss.m
	ctx := context.Background()
	rec, err := m.opt.Store.GetSession(ctx, k.tenant, k.id)
	if err != nil {
		return
	}
	cur, err := m.decode(rec)
	if err != nil {
		return
	}
	cur.Config.TemplateHash = hash
	rec.Config, _ = json.Marshal(cur.Config)
	if err := m.save(ctx, rec); err != nil {
		m.log.Warn("pinning template", "session", k.id, "err", err)
	}
}

// saveWorkspace saves the session's workspace under key: where
// workspaces live with their sandboxes, as sb (the session's sandbox, nil
// if this process holds none) has it, or its checkpoint.
func (m *Manager) saveWorkspace(ctx context.Context, k key, sb *sandbox.Sandbox, key string, prev *snapshot.Manifest) (*snapshot.Manifest, snapshot.Stats, error) {
	cp, ok := m.ws.(workspace.Checkpointer)
	if !ok {
		return m.ws.Save(ctx, volume(k), key, prev)
	}
	if sb == nil {
		return cp.SaveFrom(ctx, volume(k), "", key, prev)
	}
	// A save from the sandbox is the checkpoint too.
	var mf *snapshot.Manifest
	var st snapshot.Stats
	err := m.checkpointed(ctx, k, func() (err error) {
		mf, st, err = cp.SaveFrom(ctx, volume(k), sb.ID, key, prev)
		return err
	})
	return mf, st, err
}

// checkpointed runs save, which writes the session's checkpoint from its
// sandbox, under the session's checkpoint lock: between replicas one at a
// time, so that each export sees every change completed before it began
// and the last checkpoint written is the newest. Without it two replicas
// ending executions at once could write their exports in the other order,
// the older last, and a Pod lost then would come back without the newer
// files. (Within a process the workspace store orders them as well.)
func (m *Manager) checkpointed(ctx context.Context, k key, save func() error) error {
	unlock, err := m.checkpoints.lock(ctx, k)
	if err != nil {
		return err
	}
	defer unlock()
	return save()
}
