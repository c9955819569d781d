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
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Options configure a Manager.
type Options struct {
	Store     store.Store
	Templates *template.Store
	// Resolve returns the spec of a tenant's template name (a built-in,
	// the tenant's own, the operator's). Default: built-ins and the
	// operator's.
	Resolve func(ctx context.Context, tenant, name string) (template.Spec, error)
	// NotBuilt explains why a tenant's template has no build yet
	// (sandbox.Config.NotBuilt).
	NotBuilt func(ctx context.Context, tenant, name string) error
	// Runtime returns the runtime for a template's runtime name ("" is the
	// default, runc). It is called once per name and its answer kept.
	Runtime func(name string) (runtime.Runtime, error)
	// Workspaces keeps the sessions' workspaces by name; nil: directories
	// of this host under WorkspaceDir (workspace.Dirs, with Quota, Owners
	// and Snapshots).
	Workspaces workspace.Store
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
	// Publish, if set, is told of every change of a session:
	// api.EventSession* with the session's record as written. It is
	// called under the session's lock and may wait a little (until the
	// event is recorded, events.Log.Record), so that changes made by the
	// next holder of the lock, in any replica, come after it.
	Publish func(ctx context.Context, e events.Event)
	// Reaped, if set, hears how long each reaper pass took and how many
	// sessions it acted on.
	Reaped func(took time.Duration, acted int)
	// Destroying, if set, hears of each sandbox a session had just before
	// it is destroyed, while its cgroups can still be read (the usage
	// sampler takes a last reading).
	Destroying func(ctx context.Context, rt runtime.Runtime, id string)
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
	// under which a tenant keeps bytes besides those of its own namespace
	// (Snapshots.Prefixes: snapshots, hibernated workspaces, resource
	// content): its presigned copies, for the StoredMB limit.
	StoredPrefixes func(tenant string) []string
	// Limits returns a tenant's limits; nil means none.
	Limits func(tenant string) Limits
	// MaxResources caps what one session may ask for, server-wide; zero
	// fields are the built-in maxima (16 cores, 64 GiB, 1 TiB).
	MaxResources Resources
	// DiskCapacityMB bounds the sum of the disk quotas (resources.disk)
	// of every tenant's sessions that are not terminated: what the
	// workspace file system can back (its size, times an overcommit the
	// operator chose). 0 is no bound.
	DiskCapacityMB int64
}

// Session is a session's record with its decoded configuration.
type Session struct {
	store.Session
	Config Config
	// SandboxState is what this server has of the session's sandbox
	// (api.SandboxNone, ...).
	SandboxState string
}

// Manager owns the sessions of one server: their records and the state
// machine they move by (state.go, records.go, lifecycle.go), their TTLs
// and the reaper (reaper.go), snapshots, file calls, the handing of
// sandboxes to executions (sandbox.go) and tenants' limits. It delegates
// what is not a session's own: the sessions' locks (locker, locks.go),
// the sandboxes on the runtimes and the warm pools (sandbox.Service), and
// the workspace directories on this host (workspace.Dirs). None of the
// three knows of records; the Manager writes what they do into them.
type Manager struct {
	opt  Options
	log  *slog.Logger
	ctx  context.Context // background work; cancelled by Close
	stop context.CancelFunc
	wg   sync.WaitGroup

	locks *locker
	// checkpoints serialises a session's checkpoints across replicas.
	checkpoints *locker
	sbx         *sandbox.Service
	ws          workspace.Store

	mu       sync.Mutex
	entries  map[key]*entry
	onDelete []func(tenant, id string)

	admission   *admission
	replicas    replicas
	starts      starts
	pauses      pauses
	hibernation hibernation
	stored      *Stored
}

type key struct{ tenant, id string }

// entry is a session's in-memory state: its sandbox, if it has one.
type entry struct {
	key
	mu sync.Mutex
	// slot is what this process holds of the session's sandbox, and
	// its state (sandbox.Slot).
	slot    sandbox.Slot
	deleted bool // the session is gone: drop whatever a start brings
	active  int  // leases out: executions using the slot's sandbox
	files   int  // file calls using the workspace
	// fileCalls counts the file calls under this process's file lease
	// (files.go), between replicas; fileMu, not mu, guards it, since the
	// lease is taken and given up in the store.
	fileMu    sync.Mutex
	fileCalls int
	// claiming: a warm-pool claim is moving the workspace; file calls
	// wait for it.
	claiming bool
	// saving: a hibernation is copying the workspace, which goes once the
	// copy is done; file calls wait for the session's lock.
	saving  bool
	touched time.Time // last activity written to the store
	// resMB and resMilliCPU are what the live sandbox holds, for the
	// tenant's quotas: set when its start is admitted or it is adopted,
	// read without mu (limits.go), as pub is.
	resMB, resMilliCPU atomic.Int64
	// snap is the session's last snapshot, whose hashes the next one
	// reuses for files that have not changed.
	snap *snapshot.Manifest
	// pub is state() as of the last release of mu: SandboxCounts reads
	// it without taking mu, which a lifecycle call may hold across a
	// runtime call. pubSB is held() likewise, for Held.
	pub   atomic.Int32
	pubSB atomic.Pointer[sandbox.Sandbox]
}

// unlock publishes the sandbox state and releases mu. Every release of
// mu goes through it, so the published state is never older than the
// last change made under mu.
func (e *entry) unlock() {
	e.pub.Store(int32(e.slot.State()))
	e.pubSB.Store(e.slot.Held())
	e.mu.Unlock()
}

// New returns a manager. Call Start to recover what a previous server left
// and start the reaper, and Close to stop background work.
func New(opt Options) *Manager {
	if opt.Log == nil {
		opt.Log = slog.Default()
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
		opt: opt, log: opt.Log, ctx: ctx, stop: stop, entries: map[key]*entry{},
		locks: newLocker(opt.Store, opt.Replica, "session", opt.Log),
		// (checkpoints: sandbox.go)
		checkpoints: newLocker(opt.Store, opt.Replica, "checkpoint", opt.Log),
	}
	// Options are read when used: tests change them after New.
	m.admission = &admission{opt: &m.opt, live: m.usage}
	m.replicas, m.starts, m.pauses, m.hibernation = replicas{m}, starts{m}, pauses{m}, hibernation{m}
	m.stored = &Stored{snapshots: opt.Snapshots, more: opt.StoredPrefixes, limits: m.admission.limits}
	m.ws = opt.Workspaces
	if m.ws == nil {
		m.ws = workspace.NewDirs(workspace.DirsConfig{
			Root: opt.WorkspaceDir, Quota: opt.Quota, Owners: opt.Owners, Saved: opt.Snapshots, Log: opt.Log,
		})
	}
	m.sbx = sandbox.New(sandbox.Config{
		Templates: opt.Templates, Resolve: opt.Resolve, NotBuilt: opt.NotBuilt, Runtime: opt.Runtime, Workspaces: m.ws,
		StartTimeout: opt.StartTimeout, MaxStarts: opt.MaxStarts, Pools: opt.Pools,
		Instance: opt.Instance, Replica: opt.Replica, Alive: opt.Alive, Events: opt.Events, Log: opt.Log,
		Destroying: opt.Destroying, Leader: opt.Leader,
	})
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
	m.sbx.Close()
	m.ws.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.entries {
		if e.slot.Held() != nil {
			e.slot.Held().Client.Close()
		}
	}
}

func (m *Manager) entry(k key) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[k]
	if e == nil {
		e = &entry{key: k, slot: sandbox.Slot{Owner: k.id}}
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

// Template resolves a template name to its spec: a built-in or one
// defined in the template store. Unknown names are ErrInvalidArgument.
func (m *Manager) Template(ctx context.Context, tenant, name string) (template.Spec, error) {
	return m.sbx.Spec(ctx, tenant, name)
}

// pinnedBuild is the template build a session's record pins, "" for none
// (or a record that cannot be read, which decode reports).
func pinnedBuild(rec *store.Session) string {
	var c struct {
		TemplateHash string `json:"template_hash"`
	}
	json.Unmarshal(rec.Config, &c)
	return c.TemplateHash
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
		s.SandboxState = e.slot.State().String()
		e.unlock()
	}
	return s, nil
}

func newID(prefix string) string {
	b := make([]byte, 10)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

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
	sb, running := e.slot.Held(), e.slot.State() == sandbox.SlotRunning
	e.unlock()
	if !running {
		return
	}
	if _, err := sb.Client.DeleteConversation(ctx, cid); err != nil {
		m.log.Warn("dropping a conversation's contexts", "session", id, "conversation", cid, "err", err)
	}
}

// Prebuild builds the named templates in the background, one after the
// other, so that the first session of each does not wait for its build.
func (m *Manager) Prebuild(names []string) { m.sbx.Prebuild(names) }

// PoolSizes reports each warm pool's ready sandboxes.
func (m *Manager) PoolSizes() map[string]int { return m.sbx.PoolSizes() }
