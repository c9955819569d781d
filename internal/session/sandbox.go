package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/template"
)

// Lease is a ready sandbox's executor, handed to one execution.
type Lease struct {
	Client *executor.Client
	// SandboxID names the sandbox (for logs).
	SandboxID string
}

// Acquire returns the executor of the session's sandbox, once it is ready:
// it waits for a start in flight, resumes a paused sandbox and starts one
// when there is none (R-05: execution on a paused session resumes it). A
// sandbox that cannot be had is ErrUnavailable.
func (m *Manager) Acquire(ctx context.Context, tenant, id string) (*Lease, error) {
	k := key{tenant, id}
	for {
		e := m.entry(k)
		e.mu.Lock()
		if e.deleted {
			e.mu.Unlock()
			return nil, fmt.Errorf("session %q was deleted: %w", id, errdefs.ErrNotFound)
		}
		if sb := e.sb; sb != nil {
			if e.paused {
				e.mu.Unlock()
				if _, err := m.Resume(ctx, tenant, id); err != nil {
					return nil, err
				}
				continue
			}
			e.mu.Unlock()
			m.touch(ctx, k)
			return &Lease{Client: sb.client, SandboxID: sb.id}, nil
		}
		st := e.start
		e.mu.Unlock()
		if st == nil {
			// No sandbox and none coming: this server has not run one for
			// the session yet (or lost it). Start one, or reattach to the
			// one a previous server process left running.
			s, err := m.Get(ctx, tenant, id)
			if err != nil {
				return nil, err
			}
			if s.Status == api.StatusTerminated {
				return nil, fmt.Errorf("session %q is terminated: %w", id, errdefs.ErrNotFound)
			}
			unlock := m.lock(k)
			if e.sb == nil && e.start == nil && !e.deleted {
				m.kick(e, s)
			}
			unlock()
			continue
		}
		select {
		case <-st.done:
			if st.err != nil {
				return nil, st.err
			}
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// kick starts a sandbox for the session in the background, unless one is
// on its way. The caller holds the session's lock.
func (m *Manager) kick(e *entry, s *Session) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.start != nil || e.sb != nil {
		return
	}
	ctx, cancel := context.WithCancel(m.ctx)
	st := &startOp{done: make(chan struct{}), cancel: cancel}
	e.start = st
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		sb, err := m.startSandbox(ctx, s)
		e.mu.Lock()
		e.start = nil
		if err == nil && (e.deleted || ctx.Err() != nil) {
			err = fmt.Errorf("session %q: deleted while its sandbox started: %w", s.ID, errdefs.ErrNotFound)
		}
		if err == nil {
			e.sb, e.paused = sb, false
		}
		e.mu.Unlock()
		status, msg := api.StatusRunning, ""
		if err != nil {
			if sb != nil {
				m.destroy(context.Background(), sb)
			}
			if !errors.Is(err, errdefs.ErrNotFound) {
				m.log.Error("sandbox start failed", "tenant", s.Tenant, "session", s.ID, "err", err)
				err = fmt.Errorf("session %q: no sandbox: %v: %w", s.ID, err, errdefs.ErrUnavailable)
				status, msg = api.StatusError, err.Error()
			}
		}
		st.err = err
		if !errors.Is(err, errdefs.ErrNotFound) {
			m.recordStart(e.key, status, msg, sb)
		}
		close(st.done)
	}()
}

// recordStart writes the outcome of a sandbox start to the store, unless
// the session was deleted meanwhile.
func (m *Manager) recordStart(k key, status, msg string, sb *sandbox) {
	ctx := context.Background()
	unlock := m.lock(k)
	defer unlock()
	rec, err := m.opt.Store.GetSession(ctx, k.tenant, k.id)
	if err != nil || rec.Status == api.StatusTerminated {
		return
	}
	rec.Status, rec.Error, rec.UpdatedAt = status, msg, time.Now().UTC()
	if sb != nil && status == api.StatusRunning {
		rec.SandboxID = sb.id
	}
	if err := m.opt.Store.UpdateSession(ctx, rec); err != nil {
		m.log.Error("recording sandbox start", "session", k.id, "err", err)
	}
}

// startSandbox reattaches to the sandbox a previous server left running for
// the session, or builds the template if need be and creates a new one.
func (m *Manager) startSandbox(ctx context.Context, s *Session) (*sandbox, error) {
	spec, err := m.Template(s.TemplateID)
	if err != nil {
		return nil, err
	}
	rt, err := m.runtime(spec.Runtime)
	if err != nil {
		return nil, err
	}
	if s.SandboxID != "" {
		if sb := m.reattach(ctx, rt, s); sb != nil {
			return sb, nil
		}
	}
	tmpl, err := m.template(ctx, spec, s)
	if err != nil {
		return nil, err
	}
	env := maps.Clone(tmpl.Spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, s.Config.Env)
	res := tmpl.Spec.Resources
	res.CPU, res.MemoryMB, res.DiskMB = s.Config.Resources.CPU, s.Config.Resources.Memory, s.Config.Resources.Disk
	select {
	case m.starts <- struct{}{}:
		defer func() { <-m.starts }()
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	id := newID("sbx")
	ctx, cancel := context.WithTimeout(ctx, m.opt.StartTimeout)
	defer cancel()
	_, err = rt.Create(ctx, runtime.Spec{
		ID: id, Rootfs: tmpl.Rootfs, Workspace: m.workspaceDir(key{s.Tenant, s.ID}),
		Env: env, Preload: tmpl.Spec.Preload, Resources: res,
		Labels: map[string]string{LabelTenant: s.Tenant, LabelSession: s.ID, "sbx.template": s.TemplateID},
	})
	if err != nil {
		return nil, err
	}
	m.opt.Events("create")
	return &sandbox{id: id, rt: rt, client: dialer(rt, id)}, nil
}

// template finds the session's pinned template build, or builds (or
// finds) the current one and pins it.
func (m *Manager) template(ctx context.Context, spec template.Spec, s *Session) (*template.Template, error) {
	if h := s.Config.TemplateHash; h != "" {
		if t, err := m.opt.Templates.Get(h); err == nil {
			// The build is pinned; what is not part of its hash follows the
			// current definition.
			t.Spec.Env, t.Spec.Preload, t.Spec.Resources = spec.Env, spec.Preload, spec.Resources
			return t, nil
		}
		m.log.Warn("pinned template build is gone; using the current one", "session", s.ID, "hash", h)
	}
	t, ok := m.opt.Templates.Lookup(spec)
	if !ok {
		m.log.Info("building template (once; later sessions reuse it)", "template", spec.Name)
		var err error
		if t, err = m.opt.Templates.Ensure(ctx, spec, progressLog{m.log, spec.Name}); err != nil {
			return nil, fmt.Errorf("template %s: %w", spec.Name, err)
		}
	}
	if s.Config.TemplateHash != t.Hash {
		m.pin(s, t.Hash)
	}
	return t, nil
}

func (m *Manager) pin(s *Session, hash string) {
	ctx := context.Background()
	k := key{s.Tenant, s.ID}
	unlock := m.lock(k)
	defer unlock()
	rec, err := m.opt.Store.GetSession(ctx, k.tenant, k.id)
	if err != nil {
		return
	}
	cur, err := decode(rec)
	if err != nil {
		return
	}
	cur.Config.TemplateHash = hash
	rec.Config, _ = json.Marshal(cur.Config)
	if err := m.opt.Store.UpdateSession(ctx, rec); err != nil {
		m.log.Warn("pinning template", "session", s.ID, "err", err)
	}
}

// reattach adopts the sandbox recorded for the session if it is still
// there and its executor answers; otherwise it destroys whatever is left.
func (m *Manager) reattach(ctx context.Context, rt runtime.Runtime, s *Session) *sandbox {
	info, err := rt.Inspect(ctx, s.SandboxID)
	if err != nil {
		return nil
	}
	if info.Labels[LabelSession] == s.ID && info.Labels[LabelTenant] == s.Tenant {
		if info.State == runtime.StatePaused {
			if err := rt.Resume(ctx, info.ID); err != nil {
				m.log.Warn("resuming a sandbox to reattach", "sandbox", info.ID, "err", err)
			}
		}
		sb := &sandbox{id: info.ID, rt: rt, client: dialer(rt, info.ID)}
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := sb.client.WaitReady(hctx)
		cancel()
		if err == nil {
			m.log.Info("reattached to sandbox", "session", s.ID, "sandbox", info.ID)
			return sb
		}
		sb.client.Close()
		m.log.Warn("sandbox left by a previous server does not answer", "sandbox", info.ID, "err", err)
	}
	if err := rt.Destroy(ctx, info.ID); err != nil {
		m.log.Warn("destroying stale sandbox", "sandbox", info.ID, "err", err)
	}
	return nil
}

func dialer(rt runtime.Runtime, id string) *executor.Client {
	return executor.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
}

func (m *Manager) destroy(ctx context.Context, sb *sandbox) {
	sb.client.Close()
	if err := sb.rt.Destroy(ctx, sb.id); err != nil {
		m.log.Error("destroying sandbox", "sandbox", sb.id, "err", err)
		return
	}
	m.opt.Events("destroy")
}

// destroyByID destroys the sandbox a record names when this process did
// not hold it (a previous server started it).
func (m *Manager) destroyByID(ctx context.Context, rec *store.Session) {
	spec, err := m.Template(rec.TemplateID)
	if err != nil {
		m.log.Warn("cannot destroy sandbox: template unknown", "sandbox", rec.SandboxID, "err", err)
		return
	}
	rt, err := m.runtime(spec.Runtime)
	if err != nil {
		m.log.Warn("cannot destroy sandbox", "sandbox", rec.SandboxID, "err", err)
		return
	}
	if err := rt.Destroy(ctx, rec.SandboxID); err != nil {
		m.log.Error("destroying sandbox", "sandbox", rec.SandboxID, "err", err)
	}
}

// Sweep destroys the sandboxes of every runtime in use that no live
// session of this server holds and whose session does not name them:
// what a crashed server left behind. It runs once at start.
func (m *Manager) Sweep(ctx context.Context, runtimeNames ...string) error {
	for _, name := range runtimeNames {
		rt, err := m.runtime(name)
		if err != nil {
			return err
		}
		infos, err := rt.List(ctx)
		if err != nil {
			return err
		}
		for _, info := range infos {
			tenant, id := info.Labels[LabelTenant], info.Labels[LabelSession]
			if id == "" {
				continue // not a session's (sbx run's own, say)
			}
			rec, err := m.opt.Store.GetSession(ctx, tenant, id)
			if err == nil && rec.SandboxID == info.ID && rec.Status != api.StatusTerminated {
				continue // reattached on the session's next use
			}
			m.log.Info("destroying orphaned sandbox", "sandbox", info.ID, "session", id)
			if err := rt.Destroy(ctx, info.ID); err != nil {
				m.log.Warn("destroying orphaned sandbox", "sandbox", info.ID, "err", err)
			}
		}
	}
	return nil
}
