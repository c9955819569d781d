// Package session owns sessions: their records in the store, their
// workspaces on disk and the one sandbox each may have at a time.
//
// A session is a durable record plus a workspace directory; its sandbox is
// disposable. Create writes the record and the workspace and starts the
// sandbox in the background (status pending, then running or error);
// Acquire hands the executor of a ready sandbox to an execution, waiting
// for a start in flight, resuming a paused sandbox and starting a new one
// when there is none. Lifecycle changes of one session (create, delete,
// pause, resume) are serialized by a per-session lock; the store holds the
// truth and is written on every change of status.
package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Sandbox labels: a restarted server tells which session a sandbox served
// from them.
const (
	LabelTenant  = "sbx.tenant"
	LabelSession = "sbx.session"
)

// Options configure a Manager.
type Options struct {
	Store     store.Store
	Templates *template.Store
	// Runtime returns the runtime for a template's runtime name ("" is the
	// default, runc). It is called once per name and its answer kept.
	Runtime func(name string) (runtime.Runtime, error)
	// WorkspaceDir holds the workspaces: WorkspaceDir/TENANT/SESSION.
	WorkspaceDir string
	// Owners are the host ids of the sandbox's root and user.
	Owners workspace.Owners
	// StartTimeout bounds a sandbox start (template build and the wait
	// for a start slot excluded). Default 60s.
	StartTimeout time.Duration
	// MaxStarts bounds the sandbox starts in flight; more wait their turn.
	// Hundreds of runc starts at once on a small machine thrash until they
	// time out; queued, each takes its fair share. Default 2 per CPU.
	MaxStarts int
	Log       *slog.Logger
	// Events, if set, hears of sandboxes created and destroyed (metrics).
	Events func(event string)
}

// Session is a session's record with its decoded configuration.
type Session struct {
	store.Session
	Config Config
}

// Manager owns the sessions of one server.
type Manager struct {
	opt  Options
	log  *slog.Logger
	ctx  context.Context // background work; cancelled by Close
	stop context.CancelFunc
	wg   sync.WaitGroup

	starts chan struct{} // start slots

	mu       sync.Mutex
	entries  map[key]*entry
	locks    map[key]*keyLock
	runtimes map[string]runtime.Runtime
	onDelete []func(tenant, id string)
}

type key struct{ tenant, id string }

// entry is a session's in-memory state: its sandbox, if it has one.
type entry struct {
	key
	mu      sync.Mutex
	sb      *sandbox  // the ready sandbox, or nil
	start   *startOp  // a start in flight, or nil
	paused  bool      // sb is frozen
	deleted bool      // the session is gone: drop whatever a start brings
	touched time.Time // last activity written to the store
}

type sandbox struct {
	id     string
	rt     runtime.Runtime
	client *executor.Client
}

type startOp struct {
	done   chan struct{}
	cancel context.CancelFunc
	err    error
}

// New returns a manager. Call Close to stop its background work.
func New(opt Options) *Manager {
	if opt.StartTimeout == 0 {
		opt.StartTimeout = 60 * time.Second
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.MaxStarts <= 0 {
		opt.MaxStarts = 2 * goruntime.NumCPU()
	}
	if opt.Events == nil {
		opt.Events = func(string) {}
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Manager{
		opt: opt, log: opt.Log, ctx: ctx, stop: stop, starts: make(chan struct{}, opt.MaxStarts),
		entries: map[key]*entry{}, locks: map[key]*keyLock{}, runtimes: map[string]runtime.Runtime{},
	}
}

// OnDelete registers f to be called when a session is deleted, before its
// sandbox is destroyed (the execution layer cancels the session's runs).
func (m *Manager) OnDelete(f func(tenant, id string)) { m.onDelete = append(m.onDelete, f) }

// Close stops background work (sandbox starts in flight are abandoned and
// their sandboxes destroyed). Sandboxes that are up stay up: a restarted
// server reattaches to them.
func (m *Manager) Close() {
	m.stop()
	m.wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.entries {
		if e.sb != nil {
			e.sb.client.Close()
		}
	}
}

// keyLock serializes the lifecycle changes of one session.
type keyLock struct {
	sync.Mutex
	refs int
}

func (m *Manager) lock(k key) func() {
	m.mu.Lock()
	l := m.locks[k]
	if l == nil {
		l = &keyLock{}
		m.locks[k] = l
	}
	l.refs++
	m.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.locks, k)
		}
		m.mu.Unlock()
	}
}

func (m *Manager) entry(k key) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[k]
	if e == nil {
		e = &entry{key: k}
		m.entries[k] = e
	}
	return e
}

func (m *Manager) runtime(name string) (runtime.Runtime, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rt := m.runtimes[name]; rt != nil {
		return rt, nil
	}
	rt, err := m.opt.Runtime(name)
	if err != nil {
		return nil, fmt.Errorf("runtime %q: %v: %w", name, err, errdefs.ErrUnavailable)
	}
	m.runtimes[name] = rt
	return rt, nil
}

// Template resolves a template name to its spec: a built-in or one
// defined in the template store. Unknown names are ErrInvalidArgument.
func (m *Manager) Template(name string) (template.Spec, error) {
	if spec, ok := template.Builtin(name); ok {
		return spec, nil
	}
	spec, err := m.opt.Templates.Named(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		names := []string{}
		for _, b := range template.Builtins() {
			names = append(names, b.Name)
		}
		return spec, invalid("template_id %q: no such template (built-in: %v)", name, names)
	}
	return spec, err
}

func decode(rec *store.Session) (*Session, error) {
	s := &Session{Session: *rec}
	if err := json.Unmarshal(rec.Config, &s.Config); err != nil {
		return nil, fmt.Errorf("session %q: stored config: %w", rec.ID, err)
	}
	return s, nil
}

// Get returns a session; ErrNotFound if the tenant has none of that id.
func (m *Manager) Get(ctx context.Context, tenant, id string) (*Session, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("session %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := m.opt.Store.GetSession(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return decode(rec)
}

// List returns a page of the tenant's sessions.
func (m *Manager) List(ctx context.Context, f store.SessionFilter) ([]*Session, string, error) {
	recs, next, err := m.opt.Store.ListSessions(ctx, f)
	if err != nil {
		return nil, "", err
	}
	out := make([]*Session, 0, len(recs))
	for _, r := range recs {
		s, err := decode(r)
		if err != nil {
			return nil, "", err
		}
		out = append(out, s)
	}
	return out, next, nil
}

// Create creates a session, or returns the existing one of that id
// (created false). A session in error is recovered: a new sandbox, the same
// workspace. A terminated one is replaced by a fresh session.
func (m *Manager) Create(ctx context.Context, tenant string, req api.CreateSessionRequest) (*Session, bool, error) {
	cfg, err := validate(&req)
	if err != nil {
		return nil, false, err
	}
	if req.TemplateID == "" {
		req.TemplateID = DefaultTemplate
	}
	spec, err := m.Template(req.TemplateID)
	if err != nil {
		return nil, false, err
	}
	if req.SessionID == "" {
		req.SessionID = newID("ses")
	}
	k := key{tenant, req.SessionID}
	unlock := m.lock(k)
	defer unlock()

	rec, err := m.opt.Store.GetSession(ctx, tenant, req.SessionID)
	switch {
	case err == nil && rec.Status != api.StatusTerminated:
		s, err := decode(rec)
		if err != nil {
			return nil, false, err
		}
		if s.Status == api.StatusError {
			m.kick(m.entry(k), s)
			s, err = m.setStatus(ctx, k, api.StatusPending, "")
		}
		return s, false, err
	case err == nil:
		// Terminated: its record goes and a new session takes the id.
		if err := m.opt.Store.DeleteSession(ctx, tenant, req.SessionID); err != nil {
			return nil, false, err
		}
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, false, err
	}

	if t, ok := m.opt.Templates.Lookup(spec); ok {
		cfg.TemplateHash = t.Hash
	}
	if cfg.Resources.Memory == 0 {
		cfg.Resources.Memory = spec.Resources.WithDefaults().MemoryMB
	}
	if cfg.Resources.CPU == 0 {
		cfg.Resources.CPU = spec.Resources.WithDefaults().CPU
	}
	if cfg.Resources.Disk == 0 {
		cfg.Resources.Disk = spec.Resources.WithDefaults().DiskMB
	}
	raw, _ := json.Marshal(cfg)
	now := time.Now().UTC().Truncate(time.Microsecond) // what the store keeps
	meta := req.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	rec = &store.Session{
		Tenant: tenant, ID: req.SessionID, Status: api.StatusPending, TemplateID: req.TemplateID,
		Metadata: meta, Config: raw,
		CreatedAt: now, UpdatedAt: now, LastActivityAt: now, ExpiresAt: now.Add(time.Duration(cfg.TTL) * time.Second),
	}
	// Every uid of the sandbox must be able to traverse the parents.
	if err := os.MkdirAll(filepath.Dir(m.workspaceDir(k)), 0o711); err != nil {
		return nil, false, err
	}
	ws, err := workspace.Create(m.workspaceDir(k), m.opt.Owners)
	if err != nil {
		return nil, false, fmt.Errorf("session %q: workspace: %w", req.SessionID, err)
	}
	ws.Close()
	if err := m.opt.Store.CreateSession(ctx, rec); err != nil {
		return nil, false, err
	}
	s := &Session{Session: *rec, Config: *cfg}
	// Issue 4 makes this lazy; for now every session gets its
	// sandbox at once.
	m.kick(m.entry(k), s)
	return s, true, nil
}

func (m *Manager) workspaceDir(k key) string {
	return filepath.Join(m.opt.WorkspaceDir, k.tenant, k.id)
}

// Workspace opens the session's workspace for the file endpoints. The
// caller closes it.
func (m *Manager) Workspace(ctx context.Context, tenant, id string) (*Session, *workspace.Workspace, error) {
	s, err := m.Get(ctx, tenant, id)
	if err != nil {
		return nil, nil, err
	}
	if s.Status == api.StatusTerminated {
		return nil, nil, fmt.Errorf("session %q is terminated: %w", id, errdefs.ErrNotFound)
	}
	ws, err := workspace.Open(m.workspaceDir(key{tenant, id}), m.opt.Owners)
	if err != nil {
		return nil, nil, err
	}
	m.touch(ctx, key{tenant, id})
	return s, ws, nil
}

// Delete kills the session's sandbox at once, removes its workspace,
// executions and uploads, and marks it terminated. Deleting a terminated
// session again is not an error.
func (m *Manager) Delete(ctx context.Context, tenant, id string) (*Session, error) {
	k := key{tenant, id}
	if !ValidID(id) {
		return nil, fmt.Errorf("session %q: %w", id, errdefs.ErrNotFound)
	}
	unlock := m.lock(k)
	defer unlock()
	rec, err := m.opt.Store.GetSession(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if rec.Status == api.StatusTerminated {
		return decode(rec)
	}
	for _, f := range m.onDelete {
		f(tenant, id)
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
		sb, st := e.sb, e.start
		e.sb = nil
		e.mu.Unlock()
		if st != nil {
			// The start sees deleted and destroys what it made. Waiting for
			// it here would deadlock: it takes the session's lock to record
			// its outcome.
			st.cancel()
		}
		if sb != nil {
			held = sb.id
			m.destroy(ctx, sb)
		}
	}
	if rec.SandboxID != "" && rec.SandboxID != held {
		m.destroyByID(ctx, rec)
	}
	if ws, err := workspace.Open(m.workspaceDir(k), m.opt.Owners); err == nil {
		if err := ws.Destroy(); err != nil {
			m.log.Error("removing workspace", "session", id, "err", err)
		}
		ws.Close()
	}
	if err := m.opt.Store.DeleteExecutions(ctx, tenant, id); err != nil {
		return nil, err
	}
	if err := m.opt.Store.DeleteUploads(ctx, tenant, id, ""); err != nil {
		return nil, err
	}
	return m.setStatus(ctx, k, api.StatusTerminated, "")
}

// Pause freezes the session's sandbox. Only a session with a running
// sandbox can be paused (ErrFailedPrecondition otherwise).
func (m *Manager) Pause(ctx context.Context, tenant, id string) (*Session, error) {
	k := key{tenant, id}
	unlock := m.lock(k)
	defer unlock()
	s, err := m.Get(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if s.Status == api.StatusPaused {
		return s, nil
	}
	e := m.entry(k)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb == nil {
		return nil, fmt.Errorf("session %q is %s, not running: only a running session can be paused: %w", id, s.Status, errdefs.ErrFailedPrecondition)
	}
	if err := e.sb.rt.Pause(ctx, e.sb.id); err != nil {
		return nil, err
	}
	e.paused = true
	return m.setStatus(ctx, k, api.StatusPaused, "")
}

// Resume thaws a paused session. A session without a sandbox gets one
// started (status pending); a running one is returned as is.
func (m *Manager) Resume(ctx context.Context, tenant, id string) (*Session, error) {
	k := key{tenant, id}
	unlock := m.lock(k)
	defer unlock()
	s, err := m.Get(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if s.Status == api.StatusTerminated {
		return nil, fmt.Errorf("session %q is terminated: %w", id, errdefs.ErrFailedPrecondition)
	}
	e := m.entry(k)
	e.mu.Lock()
	if e.sb != nil {
		defer e.mu.Unlock()
		if !e.paused {
			return s, nil
		}
		if err := e.sb.rt.Resume(ctx, e.sb.id); err != nil {
			return nil, err
		}
		e.paused = false
		return m.setStatus(ctx, k, api.StatusRunning, "")
	}
	e.mu.Unlock()
	if s.Status == api.StatusPending && e.start != nil {
		return s, nil
	}
	m.kick(e, s)
	return m.setStatus(ctx, k, api.StatusPending, "")
}

// Keepalive extends the session's life: it expires timeout from now (its
// TTL when timeout is 0), never more than MaxTTL from now.
func (m *Manager) Keepalive(ctx context.Context, tenant, id string, timeout int64) (*Session, error) {
	if timeout < 0 || timeout > int64(MaxTTL/time.Second) {
		return nil, invalid("timeout %d: want 1..%d seconds (0 for the session's TTL)", timeout, int64(MaxTTL/time.Second))
	}
	k := key{tenant, id}
	unlock := m.lock(k)
	defer unlock()
	s, err := m.Get(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if s.Status == api.StatusTerminated {
		return nil, fmt.Errorf("session %q is terminated: %w", id, errdefs.ErrFailedPrecondition)
	}
	if timeout == 0 {
		timeout = s.Config.TTL
	}
	now := time.Now().UTC()
	s.ExpiresAt = now.Add(time.Duration(timeout) * time.Second)
	s.LastActivityAt, s.UpdatedAt = now, now
	if err := m.opt.Store.UpdateSession(ctx, &s.Session); err != nil {
		return nil, err
	}
	return s, nil
}

// setStatus writes a new status (and error message) to the record. The
// caller holds the session's lock.
func (m *Manager) setStatus(ctx context.Context, k key, status, msg string) (*Session, error) {
	rec, err := m.opt.Store.GetSession(ctx, k.tenant, k.id)
	if err != nil {
		return nil, err
	}
	rec.Status, rec.Error, rec.UpdatedAt = status, msg, time.Now().UTC()
	if status == api.StatusTerminated {
		rec.SandboxID = ""
	}
	if err := m.opt.Store.UpdateSession(ctx, rec); err != nil {
		return nil, err
	}
	return decode(rec)
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
	e.mu.Unlock()
	if !stale {
		return
	}
	unlock := m.lock(k)
	defer unlock()
	rec, err := m.opt.Store.GetSession(ctx, k.tenant, k.id)
	if err != nil || rec.Status == api.StatusTerminated {
		return
	}
	rec.LastActivityAt = now.UTC()
	if err := m.opt.Store.UpdateSession(ctx, rec); err != nil {
		m.log.Warn("recording activity", "session", k.id, "err", err)
	}
}

func newID(prefix string) string {
	b := make([]byte, 10)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// progressLog turns a template build's progress into log lines.
type progressLog struct {
	log  *slog.Logger
	name string
}

func (p progressLog) Write(b []byte) (int, error) {
	p.log.Info("template build", "template", p.name, "progress", string(b))
	return len(b), nil
}

var _ io.Writer = progressLog{}

// SandboxCounts counts this server's sandboxes by state: starting,
// running and paused.
func (m *Manager) SandboxCounts() map[string]int {
	m.mu.Lock()
	entries := make([]*entry, 0, len(m.entries))
	for _, e := range m.entries {
		entries = append(entries, e)
	}
	m.mu.Unlock()
	out := map[string]int{"starting": 0, "running": 0, "paused": 0}
	for _, e := range entries {
		e.mu.Lock()
		switch {
		case e.start != nil:
			out["starting"]++
		case e.sb != nil && e.paused:
			out["paused"]++
		case e.sb != nil:
			out["running"]++
		}
		e.mu.Unlock()
	}
	return out
}

// Owners are the host ids of the sandbox's root and user, for files the
// control plane puts into workspaces.
func (m *Manager) Owners() workspace.Owners { return m.opt.Owners }

// DropConversation ends the stateful contexts of a conversation in the
// session's sandbox, if it has one up (a sandbox started later has none).
func (m *Manager) DropConversation(ctx context.Context, tenant, id, cid string) {
	m.mu.Lock()
	e := m.entries[key{tenant, id}]
	m.mu.Unlock()
	if e == nil {
		return
	}
	e.mu.Lock()
	sb, paused := e.sb, e.paused
	e.mu.Unlock()
	if sb == nil || paused {
		return
	}
	if _, err := sb.client.DeleteConversation(ctx, cid); err != nil {
		m.log.Warn("dropping a conversation's contexts", "session", id, "conversation", cid, "err", err)
	}
}

// Prebuild builds the named templates in the background, one after the
// other, so that the first session of each does not wait for its build.
func (m *Manager) Prebuild(names []string) {
	if len(names) == 0 {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for _, name := range names {
			spec, err := m.Template(name)
			if err != nil {
				m.log.Warn("prebuild", "template", name, "err", err)
				continue
			}
			if _, ok := m.opt.Templates.Lookup(spec); ok {
				continue
			}
			m.log.Info("building template in the background (once; cached)", "template", name)
			if _, err := m.opt.Templates.Ensure(m.ctx, spec, progressLog{m.log, name}); err != nil {
				if m.ctx.Err() == nil {
					m.log.Error("template build failed", "template", name, "err", err)
				}
				continue
			}
			m.log.Info("template ready", "template", name)
		}
	}()
}
