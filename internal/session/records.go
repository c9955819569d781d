package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// A session's record: made, read, listed, kept alive and ended here, and
// written through move, save and write (and touch, for activity).

// Get returns a session; ErrNotFound if the tenant has none of that id.
func (m *Manager) Get(ctx context.Context, tenant, id string) (*Session, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("session %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := m.opt.Store.GetSession(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return m.decode(rec)
}

// List returns a page of the tenant's sessions.
func (m *Manager) List(ctx context.Context, f store.SessionFilter) ([]*Session, string, error) {
	recs, next, err := m.opt.Store.ListSessions(ctx, f)
	if err != nil {
		return nil, "", err
	}
	out := make([]*Session, 0, len(recs))
	for _, r := range recs {
		s, err := m.decode(r)
		if err != nil {
			return nil, "", err
		}
		out = append(out, s)
	}
	return out, next, nil
}

// Create creates a session, or returns the existing one of that id
// (created false). A session in error is recovered: a new sandbox, the same
// workspace. A terminated one is replaced by a fresh session. The sandbox
// comes with the first execution unless the request asks for warm_up.
func (m *Manager) Create(ctx context.Context, tenant string, req CreateRequest) (*Session, bool, error) {
	cfg, err := validate(&req, m.opt.Defaults, m.opt.MaxResources)
	if err != nil {
		return nil, false, err
	}
	if req.Template == "" {
		req.Template = DefaultTemplate
	}
	spec, err := m.Template(ctx, tenant, req.Template)
	if err != nil {
		return nil, false, err
	}
	if req.ID == "" {
		req.ID = newID("ses")
	}
	k := key{tenant, req.ID}
	unlock, err := m.locks.lock(ctx, k)
	if err != nil {
		return nil, false, err
	}
	defer unlock()

	rec, err := m.opt.Store.GetSession(ctx, tenant, req.ID)
	switch {
	case err == nil && rec.Status != api.StatusTerminated:
		if rec.Status == api.StatusError {
			s, err := m.decode(rec)
			if err != nil {
				return nil, false, err
			}
			// No sandbox to be had now leaves the session in error,
			// to be tried again by its next execution.
			if started, _ := m.starts.kick(m.entry(k), s); started {
				// A sandbox from a warm pool is in the record already
				// (kick wrote it, running): read it again.
				if rec, err = m.opt.Store.GetSession(ctx, tenant, req.ID); err != nil {
					return nil, false, err
				}
				if rec.Status == api.StatusError {
					if rec, err = m.move(ctx, rec, api.StatusPending, ""); err != nil {
						return nil, false, err
					}
				}
			}
		}
		s, err := m.decode(rec)
		return s, false, err
	case err == nil:
		// Terminated: its record goes and a new session takes the id.
		if err := m.opt.Store.DeleteSession(ctx, tenant, req.ID); err != nil {
			return nil, false, err
		}
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, false, err
	}

	if t, ok := m.opt.Templates.Lookup(spec); ok {
		cfg.TemplateHash = t.Hash
	}
	if cfg.Resources.MemoryMB == 0 {
		cfg.Resources.MemoryMB = spec.Resources.WithDefaults().MemoryMB
	}
	if cfg.Resources.CPU == 0 {
		cfg.Resources.CPU = spec.Resources.WithDefaults().CPU
	}
	if cfg.Resources.DiskMB == 0 {
		cfg.Resources.DiskMB = spec.Resources.WithDefaults().DiskMB
	}
	// A tenant's own template's defaults are held to the caps of what a
	// session asks for, as they were when it was posted: it must not be a
	// way around them after the caps were lowered either.
	if caps, r := CapResources(m.opt.MaxResources), cfg.Resources; spec.Owner != "" && (r.CPU > caps.CPU || r.MemoryMB > caps.MemoryMB || r.DiskMB > caps.DiskMB) {
		return nil, false, invalid("template %s: its default resources (cpu %v, memory %d MiB, disk %d MiB) are past this server's limits for one session (cpu %v, memory %d MiB, disk %d MiB): ask for less in resources",
			req.Template, r.CPU, r.MemoryMB, r.DiskMB, caps.CPU, caps.MemoryMB, caps.DiskMB)
	}
	raw, _ := json.Marshal(cfg)
	now := time.Now().UTC().Truncate(time.Microsecond) // what the store keeps
	meta := req.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	status := api.StatusRunning
	if cfg.WarmUp {
		status = api.StatusPending
	}
	rec = &store.Session{
		Tenant: tenant, ID: req.ID, Status: status, TemplateID: req.Template,
		Metadata: meta, Config: raw, DiskMB: cfg.Resources.DiskMB,
		CreatedAt: now, UpdatedAt: now, LastActivityAt: now, ExpiresAt: now.Add(time.Duration(cfg.TTL) * time.Second),
	}
	rec.DueAt = dueAt(rec, cfg, m.opt.Defaults)
	// The tenant's quotas hold from this check until the record is in.
	unlockTenant := m.admission.tenants.lock(tenant)
	defer unlockTenant()
	release, err := m.admission.admitSession(ctx, tenant, cfg.Resources.DiskMB)
	if err != nil {
		return nil, false, err
	}
	defer release() // on the way out of a failure; at once after the insert otherwise
	// A workspace left by a session of this id that a crash kept from
	// being removed is not this session's: Create discards it.
	if err := m.ws.Create(ctx, volume(k), cfg.Resources.DiskMB); err != nil {
		return nil, false, fmt.Errorf("session %q: workspace: %w", req.ID, err)
	}
	err = m.opt.Store.CreateSession(ctx, rec)
	release() // the store's sum has it now
	if err != nil {
		return nil, false, err
	}
	m.emit(ctx, api.EventSessionCreated, rec, api.EventData{Metadata: meta})
	s := &Session{Session: *rec, Config: *cfg, SandboxState: api.SandboxNone}
	if cfg.WarmUp {
		started, err := m.starts.kick(m.entry(k), s)
		if !started {
			// No sandbox to be had now: the session is created
			// anyway, lazy, and its first execution says why.
			m.log.Warn("warm-up refused; the session starts lazily", "session", s.ID, "err", err)
			why := "warm-up refused; the session starts lazily"
			if err != nil {
				why += ": " + err.Error()
			}
			if rec, err = m.move(ctx, rec, api.StatusRunning, ""); err != nil {
				return nil, false, err
			}
			m.emit(ctx, api.EventSessionError, rec, api.EventData{Error: why})
			s, err := m.decode(rec)
			return s, true, err
		}
		// From a warm pool it is running already.
		if rec, err = m.opt.Store.GetSession(ctx, tenant, req.ID); err != nil {
			return nil, false, err
		}
		s, err := m.decode(rec)
		return s, true, err
	}
	return s, true, nil
}

// Delete kills the session's sandbox at once, removes its workspace,
// snapshots, executions and uploads, and marks it terminated. Deleting a
// terminated session again is not an error.
func (m *Manager) Delete(ctx context.Context, tenant, id string) (*Session, error) {
	k := key{tenant, id}
	if !ValidID(id) {
		return nil, fmt.Errorf("session %q: %w", id, errdefs.ErrNotFound)
	}
	if e := m.peek(k); e != nil {
		// A start in flight holds the lock until its sandbox is up:
		// this one is not wanted any more.
		e.mu.Lock()
		if e.slot.Starting() != nil {
			e.slot.Starting().Cancel()
		}
		e.unlock()
	}
	unlock, err := m.locks.lock(ctx, k)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := m.opt.Store.GetSession(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if rec.Status == api.StatusTerminated {
		return m.decode(rec)
	}
	if rec, err = m.terminate(ctx, rec, ""); err != nil {
		return nil, err
	}
	m.emit(ctx, api.EventSessionTerminated, rec, api.EventData{Reason: "request"})
	return m.decode(rec)
}

// terminate ends a session: its executions are cancelled, its sandbox
// destroyed, its workspace, snapshots, executions and uploads removed,
// and its record marked terminated (with why, if set). The caller holds
// the session's lock.
func (m *Manager) terminate(ctx context.Context, rec *store.Session, why string) (*store.Session, error) {
	k := key{rec.Tenant, rec.ID}
	for _, f := range m.onDelete {
		f(k.tenant, k.id)
	}
	m.mu.Lock()
	e := m.entries[k]
	delete(m.entries, k)
	m.mu.Unlock()
	ctx = context.WithoutCancel(ctx) // half a delete is worse than a slow one
	held := ""
	if e != nil {
		e.mu.Lock()
		e.deleted = true
		st := e.slot.Starting()
		sb := e.slot.Drop()
		e.unlock()
		if st != nil {
			// The start sees deleted and destroys what it made. Waiting for
			// it here would deadlock: it takes the session's lock to record
			// its outcome.
			st.Cancel()
		}
		if sb != nil {
			held = sb.ID
			m.sbx.Destroy(ctx, sb)
		}
	}
	if rec.SandboxID != "" && rec.SandboxID != held {
		m.sbx.DestroyRecorded(ctx, rec.Tenant, rec.TemplateID, pinnedBuild(rec), rec.SandboxID)
	}
	if err := m.ws.Discard(ctx, volume(k)); err != nil {
		m.log.Error("removing workspace", "session", k.id, "err", err)
	}
	m.Snapshots().drop(ctx, k)
	if err := m.opt.Store.DeleteExecutions(ctx, k.tenant, k.id); err != nil {
		return nil, err
	}
	if err := m.opt.Store.DeleteUploads(ctx, k.tenant, k.id, ""); err != nil {
		return nil, err
	}
	rec.SandboxID = ""
	return m.move(ctx, rec, api.StatusTerminated, why)
}

// Keepalive extends the session's life: it expires timeout from now (its
// TTL when timeout is 0), never more than MaxTTL from now. It is activity.
func (m *Manager) Keepalive(ctx context.Context, tenant, id string, timeout int64) (*Session, error) {
	if timeout < 0 || timeout > int64(MaxTTL/time.Second) {
		return nil, invalid("timeout %d: want 1..%d seconds (0 for the session's TTL)", timeout, int64(MaxTTL/time.Second))
	}
	k := key{tenant, id}
	unlock, err := m.locks.lock(ctx, k)
	if err != nil {
		return nil, err
	}
	defer unlock()
	s, err := m.Get(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if s.Status == api.StatusTerminated {
		return nil, &TransitionError{Session: id, From: s.Status, To: s.Status, Why: "a terminated session cannot be kept alive; create it again"}
	}
	if timeout == 0 {
		timeout = s.Config.TTL
	}
	now := time.Now().UTC()
	s.ExpiresAt = now.Add(time.Duration(timeout) * time.Second)
	s.LastActivityAt = now
	if err := m.save(ctx, &s.Session); err != nil {
		return nil, err
	}
	return m.decode(&s.Session)
}

// move takes the record to a new status (and error message), if the state
// machine allows it, and writes it. The caller holds the session's lock.
func (m *Manager) move(ctx context.Context, rec *store.Session, status, msg string) (*store.Session, error) {
	if !canMove(rec.Status, status) {
		return nil, &TransitionError{Session: rec.ID, From: rec.Status, To: status}
	}
	rec.Status, rec.Error = status, msg
	if err := m.save(ctx, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// save writes the record with its reaper schedule brought up to date.
// The caller holds the session's lock, so the one write that can have
// come between its read and this one is activity (touchIf), which has no
// lock to take: that is carried over and the write tried again.
func (m *Manager) save(ctx context.Context, rec *store.Session) error {
	for try := 0; ; try++ {
		err := m.write(ctx, rec)
		if !errors.Is(err, errdefs.ErrConflict) || try == 100 {
			return err
		}
		cur, rerr := m.opt.Store.GetSession(ctx, rec.Tenant, rec.ID)
		if rerr != nil {
			return err
		}
		if cur.Status == api.StatusTerminated && rec.Status != api.StatusTerminated {
			return err // deleted by a replica whose lock this one outlived
		}
		rec.Revision = cur.Revision
		if cur.LastActivityAt.After(rec.LastActivityAt) {
			rec.LastActivityAt = cur.LastActivityAt
		}
	}
}

// write writes the record, with its reaper schedule brought up to date,
// if no one wrote it since it was read (store.ErrConflict if someone did).
func (m *Manager) write(ctx context.Context, rec *store.Session) error {
	var cfg Config
	if err := json.Unmarshal(rec.Config, &cfg); err != nil {
		return fmt.Errorf("session %q: stored config: %w", rec.ID, err)
	}
	rec.UpdatedAt = time.Now().UTC()
	rec.DueAt = dueAt(rec, &cfg, m.opt.Defaults)
	return m.opt.Store.UpdateSession(ctx, rec)
}

// touch records activity, at most once a second per session in the store.
func (m *Manager) touch(ctx context.Context, k key) {
	e := m.entry(k)
	now := time.Now()
	e.mu.Lock()
	stale := now.Sub(e.touched) > time.Second
	if stale {
		e.touched = now
	}
	e.unlock()
	if !stale {
		return
	}
	err := m.replicas.touchIf(ctx, k, func(*store.Session) bool { return true })
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) && ctx.Err() == nil {
		m.log.Warn("recording activity", "session", k.id, "err", err)
	}
}
