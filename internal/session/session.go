// Package session owns sessions: their records in the store, their
// workspaces on disk and the one sandbox each may have at a time.
//
// A session is a durable record plus a workspace; its sandbox is
// disposable (R-60..R-66). Create writes the record and the workspace; the
// sandbox comes with the first execution, or at once with warm_up.
// Acquire hands the executor of a ready sandbox to an execution: it thaws
// a paused sandbox, restores a hibernated workspace and starts a sandbox
// when there is none. The reaper (reaper.go) pauses idle sandboxes,
// hibernates sessions idle for longer and terminates those past their TTL.
// Statuses move by the state machine of state.go and are written to the
// store at every move. Lifecycle changes of one session are serialized by
// a per-session lock; no lock is held across sessions.
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
	"sync/atomic"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor"
	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Sandbox labels: a restarted server tells which session a sandbox served
// from them.
const (
	LabelTenant  = "sbx.tenant"
	LabelSession = "sbx.session"
	// LabelInstance is the deployment a sandbox belongs to
	// (Options.Instance): servers that do not share a store and data
	// directory can share a runtime's state (the default /run/sbx) without
	// touching each other's sandboxes.
	LabelInstance = "sbx.instance"
	// LabelReplica is the replica that started a sandbox (Options.Replica).
	LabelReplica = "sbx.replica"
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
	// Quota makes each workspace a directory limited to the session's
	// resources.disk; nil is quota.None, no limit at all.
	Quota quota.Dirs
	// Owners are the host ids of the sandbox's root and user.
	Owners workspace.Owners
	// StartTimeout bounds a sandbox start (template build and the wait
	// for a start slot excluded). Default 60s.
	StartTimeout time.Duration
	// MaxStarts bounds the sandbox starts in flight; more wait their turn.
	// Hundreds of runc starts at once on a small machine thrash until they
	// time out; queued, each takes its fair share. Default 2 per CPU.
	MaxStarts int
	// MaxSandboxes bounds the sandboxes this server has (starting, running
	// or paused); a start beyond it is ErrUnavailable, which an execution
	// answers with 503 and Retry-After. 0 is no bound.
	MaxSandboxes int
	// Defaults are the lifecycle periods of sessions that set none.
	Defaults Defaults
	// Snapshots keeps snapshots and hibernated workspaces. Without it
	// sessions are never hibernated and snapshots are ErrUnavailable.
	Snapshots *snapshot.Store
	// ReapInterval is how often the reaper looks for due sessions
	// (default 5s); ReapBatch is the most it takes in one pass (default
	// 256).
	ReapInterval time.Duration
	ReapBatch    int
	Log          *slog.Logger
	// Events, if set, hears of lifecycle events, for metrics: create and
	// destroy (sandboxes), pause, resume, hibernate, restore, expire, and
	// lost (a sandbox that died under its session).
	Events func(event string)
	// Reaped, if set, hears how long each reaper pass took and how many
	// sessions it acted on.
	Reaped func(took time.Duration, acted int)
	// Pools sizes the warm pool of each template named.
	Pools map[string]int
	// Leader, if set, says whether this process is the one that runs the
	// reaper and the collectors now: replicas sharing a store elect one
	// (a lease in the store, internal/app). nil: this process always is.
	Leader func(ctx context.Context) bool
	// Instance names the deployment (the servers sharing this store and
	// data directory): its sandboxes carry it, and Start leaves sandboxes
	// of other instances alone. "" labels nothing and claims every
	// sandbox, as servers did before instances.
	Instance string
	// Replica names this process among the replicas that serve the same
	// sessions over one store and data directory (replicas.go); "" for a
	// process alone with its store (SQLite), whose sessions' locks are
	// in memory only.
	Replica string
	// Alive says whether the replica of that name still runs (its
	// liveness lease): Start leaves the sandboxes of live replicas that
	// no record names yet (warm pools, starts in flight) alone.
	Alive func(ctx context.Context, replica string) (bool, error)
	// StoredPrefixes returns the prefixes in the snapshots' blob store
	// under which a tenant keeps bytes besides its snapshots (its
	// presigned copies), for the StoredMB limit.
	StoredPrefixes func(tenant string) []string
	// Limits returns a tenant's limits; nil means none.
	Limits func(tenant string) Limits
	// MaxResources caps what one session may ask for, server-wide; zero
	// fields are the built-in maxima (16 cores, 64 GiB, 1 TiB).
	MaxResources api.Resources
}

// Session is a session's record with its decoded configuration.
type Session struct {
	store.Session
	Config Config
	// SandboxState is what this server has of the session's sandbox
	// (api.SandboxNone, ...).
	SandboxState string
}

// Manager owns the sessions of one server.
type Manager struct {
	opt  Options
	log  *slog.Logger
	ctx  context.Context // background work; cancelled by Close
	stop context.CancelFunc
	wg   sync.WaitGroup

	starts chan struct{} // start slots
	trash  string        // workspaces go here to be removed

	mu       sync.Mutex
	entries  map[key]*entry
	locks    map[key]*keyLock
	runtimes map[string]runtime.Runtime
	onDelete []func(tenant, id string)

	pools  map[string]*pool // by template; fixed at New
	refill chan struct{}    // wakes the pool filler

	// admit is held from a tenant's sandbox quota check until the start
	// it admits is on its entry (quota.go); tenants serializes the session
	// quota check of one tenant with the insert it admits.
	admit   sync.Mutex
	tenants tenantLocks
	stored  storedBytes
}

type key struct{ tenant, id string }

// entry is a session's in-memory state: its sandbox, if it has one.
type entry struct {
	key
	mu sync.Mutex
	// sbState is the sandbox's state (sandboxstate.go); sb is the
	// sandbox held (running, paused), start the start in flight
	// (starting). They change together, by moveSandbox.
	sbState sandboxState
	sb      *sandbox
	start   *startOp
	deleted bool // the session is gone: drop whatever a start brings
	active  int  // leases out: executions using sb
	files   int  // file calls using the workspace
	// claiming: a warm-pool claim is moving the workspace; file calls
	// wait for it.
	claiming bool
	// saving: a hibernation is copying the workspace, which goes once the
	// copy is done; file calls wait for the session's lock.
	saving  bool
	touched time.Time // last activity written to the store
	// resMB and resMilliCPU are what the live sandbox holds, for the
	// tenant's quotas: set when its start is admitted or it is adopted,
	// read without mu (quota.go), as pub is.
	resMB, resMilliCPU atomic.Int64
	// snap is the session's last snapshot, whose hashes the next one
	// reuses for files that have not changed.
	snap *snapshot.Manifest
	// pub is state() as of the last release of mu: SandboxCounts reads
	// it without taking mu, which a lifecycle call may hold across a
	// runtime call.
	pub atomic.Int32
}

// unlock publishes the sandbox state and releases mu. Every release of
// mu goes through it, so the published state is never older than the
// last change made under mu.
func (e *entry) unlock() {
	e.pub.Store(int32(e.sbState))
	e.mu.Unlock()
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

// New returns a manager. Call Start to recover what a previous server left
// and start the reaper, and Close to stop background work.
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
	if opt.Reaped == nil {
		opt.Reaped = func(time.Duration, int) {}
	}
	if opt.ReapInterval <= 0 {
		opt.ReapInterval = 5 * time.Second
	}
	if opt.ReapBatch <= 0 {
		opt.ReapBatch = 256
	}
	if opt.Quota == nil {
		opt.Quota = quota.None{}
	}
	opt.Defaults = opt.Defaults.withDefaults()
	ctx, stop := context.WithCancel(context.Background())
	m := &Manager{
		opt: opt, log: opt.Log, ctx: ctx, stop: stop, starts: make(chan struct{}, opt.MaxStarts),
		trash:   filepath.Join(opt.WorkspaceDir, ".trash"),
		entries: map[key]*entry{}, locks: map[key]*keyLock{}, runtimes: map[string]runtime.Runtime{},
		pools: map[string]*pool{}, refill: make(chan struct{}, 1),
	}
	for name, size := range opt.Pools {
		if size > 0 {
			m.pools[name] = &pool{template: name, size: size}
		}
	}
	return m
}

// OnDelete registers f to be called when a session is deleted or expires,
// before its sandbox is destroyed (the execution layer cancels the
// session's runs).
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

func (m *Manager) keyLock(k key) (*keyLock, func()) {
	m.mu.Lock()
	l := m.locks[k]
	if l == nil {
		l = &keyLock{}
		m.locks[k] = l
	}
	l.refs++
	m.mu.Unlock()
	return l, func() {
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.locks, k)
		}
		m.mu.Unlock()
	}
}

// lock takes the session's lock and returns its release. Between
// replicas (Options.Replica) the lock is also a lease in the store,
// taken after the in-process mutex, so that processes queue on the store
// and threads of one process in memory.
func (m *Manager) lock(ctx context.Context, k key) (func(), error) {
	l, release := m.keyLock(k)
	l.Lock()
	held, err := m.lease(ctx, k, true)
	if err != nil {
		l.Unlock()
		release()
		return nil, err
	}
	return func() { held.release(); l.Unlock(); release() }, nil
}

// tryLock takes the session's lock if no one holds it.
func (m *Manager) tryLock(ctx context.Context, k key) (func(), bool) {
	l, release := m.keyLock(k)
	if !l.TryLock() {
		release()
		return nil, false
	}
	held, err := m.lease(ctx, k, false)
	if err != nil || held == nil {
		l.Unlock()
		release()
		return nil, false
	}
	return func() { held.release(); l.Unlock(); release() }, true
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

// peek returns the session's entry if there is one.
func (m *Manager) peek(k key) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.entries[k]
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

func (m *Manager) decode(rec *store.Session) (*Session, error) {
	s := &Session{Session: *rec, SandboxState: api.SandboxNone}
	if err := json.Unmarshal(rec.Config, &s.Config); err != nil {
		return nil, fmt.Errorf("session %q: stored config: %w", rec.ID, err)
	}
	if s.Config.HibernateTimeout == 0 {
		s.Config.HibernateTimeout = int64(m.opt.Defaults.HibernateTimeout / time.Second)
	}
	if e := m.peek(key{rec.Tenant, rec.ID}); e != nil {
		e.mu.Lock()
		s.SandboxState = e.sbState.String()
		e.unlock()
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
func (m *Manager) Create(ctx context.Context, tenant string, req api.CreateSessionRequest) (*Session, bool, error) {
	cfg, err := validate(&req, m.opt.Defaults, m.opt.MaxResources)
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
	unlock, err := m.lock(ctx, k)
	if err != nil {
		return nil, false, err
	}
	defer unlock()

	rec, err := m.opt.Store.GetSession(ctx, tenant, req.SessionID)
	switch {
	case err == nil && rec.Status != api.StatusTerminated:
		if rec.Status == api.StatusError {
			s, err := m.decode(rec)
			if err != nil {
				return nil, false, err
			}
			// No sandbox to be had now leaves the session in error,
			// to be tried again by its next execution.
			if started, _ := m.kick(m.entry(k), s); started {
				// A sandbox from a warm pool is in the record already
				// (kick wrote it, running): read it again.
				if rec, err = m.opt.Store.GetSession(ctx, tenant, req.SessionID); err != nil {
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
	status := api.StatusRunning
	if cfg.WarmUp {
		status = api.StatusPending
	}
	rec = &store.Session{
		Tenant: tenant, ID: req.SessionID, Status: status, TemplateID: req.TemplateID,
		Metadata: meta, Config: raw, DiskMB: cfg.Resources.Disk,
		CreatedAt: now, UpdatedAt: now, LastActivityAt: now, ExpiresAt: now.Add(time.Duration(cfg.TTL) * time.Second),
	}
	rec.DueAt = dueAt(rec, cfg, m.opt.Defaults)
	// The tenant's quotas hold from this check until the record is in.
	unlockTenant := m.tenants.lock(tenant)
	defer unlockTenant()
	if err := m.admitSession(ctx, tenant, cfg.Resources.Disk); err != nil {
		return nil, false, err
	}
	// Every uid of the sandbox must be able to traverse the parents.
	if err := os.MkdirAll(filepath.Dir(m.workspaceDir(k)), 0o711); err != nil {
		return nil, false, err
	}
	// A workspace left by a session of this id that a crash kept from
	// being removed is not this session's.
	if err := m.discard(m.workspaceDir(k)); err != nil {
		return nil, false, err
	}
	if err := m.makeWorkspace(ctx, m.workspaceDir(k), cfg.Resources.Disk); err != nil {
		return nil, false, fmt.Errorf("session %q: workspace: %w", req.SessionID, err)
	}
	if err := m.opt.Store.CreateSession(ctx, rec); err != nil {
		return nil, false, err
	}
	s := &Session{Session: *rec, Config: *cfg, SandboxState: api.SandboxNone}
	if cfg.WarmUp {
		started, err := m.kick(m.entry(k), s)
		if !started {
			// No sandbox to be had now: the session is created
			// anyway, lazy, and its first execution says why.
			m.log.Warn("warm-up refused; the session starts lazily", "session", s.ID, "err", err)
			if rec, err = m.move(ctx, rec, api.StatusRunning, ""); err != nil {
				return nil, false, err
			}
			s, err := m.decode(rec)
			return s, true, err
		}
		// From a warm pool it is running already.
		if rec, err = m.opt.Store.GetSession(ctx, tenant, req.SessionID); err != nil {
			return nil, false, err
		}
		s, err := m.decode(rec)
		return s, true, err
	}
	return s, true, nil
}

func (m *Manager) workspaceDir(k key) string {
	return filepath.Join(m.opt.WorkspaceDir, k.tenant, k.id)
}

// discard moves dir, if it exists, to the trash and removes it in the
// background: the path is free at once, and a crash halfway leaves no
// half-removed workspace where a session would find it.
func (m *Manager) discard(dir string) error {
	if err := os.MkdirAll(m.trash, 0o700); err != nil {
		return err
	}
	junk := filepath.Join(m.trash, newID("ws"))
	if err := os.Rename(dir, junk); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		// Gone meanwhile: a replica sharing the data directory emptied
		// the trash as it started.
		if err := m.opt.Quota.Remove(context.Background(), junk); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.log.Error("removing a discarded workspace", "dir", junk, "err", err)
		}
	}()
	return nil
}

// Files is a session's workspace open for a file call (files.go). Close
// it: while it is open the workspace is not hibernated or replaced under
// the call.
type Files struct {
	ws   *workspace.Workspace
	sess *Session
	m    *Manager
	e    *entry
	once sync.Once
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
			if unlock, err := m.lock(ctx, k); err != nil {
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
		f := &Files{e: e}
		if m.shared() {
			// Another replica may be hibernating the session: it marks
			// the record paused first, and an idle hibernation gives way
			// to activity written before that.
			err := m.touchIf(ctx, k, func(rec *store.Session) bool {
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
		ws, err := workspace.Open(m.workspaceDir(k), m.opt.Owners)
		if err != nil {
			f.release()
			return nil, nil, err
		}
		f.ws, f.sess, f.m = ws, s, m
		m.touch(ctx, k)
		return s, f, nil
	}
}

func (f *Files) release() {
	f.once.Do(func() {
		f.e.mu.Lock()
		f.e.files--
		f.e.unlock()
	})
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
		if e.start != nil {
			e.start.cancel()
		}
		e.unlock()
	}
	unlock, err := m.lock(ctx, k)
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
		st := e.start
		sb := e.drop()
		e.unlock()
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
	if err := m.discard(m.workspaceDir(k)); err != nil {
		m.log.Error("removing workspace", "session", k.id, "err", err)
	}
	m.dropSnapshots(ctx, k)
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
	unlock, err := m.lock(ctx, k)
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
	err := m.touchIf(ctx, k, func(*store.Session) bool { return true })
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) && ctx.Err() == nil {
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
// running and paused. It never waits on a session: every sandbox start
// and /metrics read calls it, and one session's snapshot or hibernation
// must not hold up the server's other tenants.
func (m *Manager) SandboxCounts() map[string]int {
	var n [4]int
	m.mu.Lock()
	for _, e := range m.entries {
		n[e.pub.Load()]++
	}
	m.mu.Unlock()
	return map[string]int{api.SandboxStarting: n[1], api.SandboxRunning: n[2], api.SandboxPaused: n[3]}
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
	sb, running := e.held(), e.sbState == sandboxRunning
	e.unlock()
	if !running {
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
