// Package sandbox starts, finds and destroys the sandboxes that sessions
// run in, on the runtimes their templates name, and keeps the warm
// pools (pool.go, R-64).
//
// It never reads or writes a session's record: what a record must say of
// a sandbox (which one the session has, the template build it runs), the
// session package writes under the session's lock, from what this
// package's calls return. What a process does with a session's sandbox at
// a given moment is the session's Slot (slot.go), which the session
// package holds and moves.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	goruntime "runtime"
	"sync"
	"time"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Sandbox labels: a restarted server tells which session a sandbox served
// from them.
const (
	LabelTenant   = "sbx.tenant"
	LabelSession  = "sbx.session"
	LabelTemplate = "sbx.template"
	// LabelPool marks a sandbox started ahead of demand for a template's
	// warm pool.
	LabelPool = "sbx.pool"
	// LabelInstance is the deployment a sandbox belongs to
	// (Config.Instance): servers that do not share a store and data
	// directory can share a runtime's state (the default /run/sbx) without
	// touching each other's sandboxes.
	LabelInstance = "sbx.instance"
	// LabelReplica is the replica that started a sandbox (Config.Replica).
	LabelReplica = "sbx.replica"
)

// Sandbox is a sandbox this process can reach: its runtime and a client
// of its executor.
type Sandbox struct {
	ID      string
	Runtime runtime.Runtime
	Client  *execclient.Client
}

// Attach returns the sandbox id on rt, with a client that dials its
// executor when first used.
func Attach(rt runtime.Runtime, id string) *Sandbox {
	return &Sandbox{ID: id, Runtime: rt, Client: execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })}
}

// Config configures a Service.
type Config struct {
	Templates *template.Store
	// Resolve returns the spec of a tenant's template name (a built-in,
	// the tenant's own, the operator's); an unknown name is
	// ErrInvalidArgument. Default: built-ins and the operator's.
	Resolve func(ctx context.Context, tenant, name string) (template.Spec, error)
	// NotBuilt explains why a tenant's template has no build to start a
	// sandbox on (the registry's build is queued, running, failed or
	// cancelled). A tenant's templates are built only through the
	// registry's queue, never inline on a sandbox's start, where no build
	// limit would hold. Nil: ErrUnavailable without details.
	NotBuilt func(ctx context.Context, tenant, name string) error
	// Runtime returns the runtime for a template's runtime name ("" is the
	// default, runc). It is called once per name and its answer kept.
	Runtime func(name string) (runtime.Runtime, error)
	// Workspaces keeps the workspaces: sessions' sandboxes mount theirs,
	// pooled ones get their own (workspace.PoolVolume).
	Workspaces workspace.Store
	// StartTimeout bounds a sandbox start (template build and the wait
	// for a start slot excluded). Default 60s.
	StartTimeout time.Duration
	// MaxStarts bounds the sandbox starts in flight; more wait their turn.
	// Hundreds of runc starts at once on a small machine thrash until they
	// time out; queued, each takes its fair share. Default 2 per CPU.
	MaxStarts int
	// Pools sizes the warm pool of each template named.
	Pools map[string]int
	// Instance and Replica label every sandbox (LabelInstance,
	// LabelReplica); List and Sweep leave other instances' alone.
	Instance, Replica string
	// Leader, if set, says whether this process fills the warm pools
	// that replicas share (runtime.Pools) and collects their stale
	// sandboxes; the others only claim. nil: this process does.
	Leader func(ctx context.Context) bool
	// Alive says whether the replica of that name still runs: the
	// sandboxes of live replicas that no record names yet (warm pools,
	// starts in flight) are not orphans.
	Alive func(ctx context.Context, replica string) (bool, error)
	// Events, if set, hears of create and destroy, pool_hit and
	// pool_miss.
	Events func(event string)
	Log    *slog.Logger
	// Destroying, if set, hears of a session's sandbox (Destroy,
	// DestroyRecorded) just before it is destroyed.
	Destroying func(ctx context.Context, rt runtime.Runtime, id string)
}

// Service is the sandboxes of one process.
type Service struct {
	cfg  Config
	log  *slog.Logger
	ws   workspace.Store
	ctx  context.Context // background work: pools, prebuilds
	stop context.CancelFunc
	wg   sync.WaitGroup

	starts chan struct{} // start slots (Config.MaxStarts)

	mu       sync.Mutex
	runtimes map[string]runtime.Runtime

	pools  map[string]*pool // by template; fixed at New
	refill chan struct{}    // wakes the pool filler
	wake   chan struct{}    // wakes the shared pools' filler
}

// New returns a Service. StartPools starts the warm pools; Close stops
// background work and destroys the pooled sandboxes.
func New(cfg Config) *Service {
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if cfg.MaxStarts <= 0 {
		cfg.MaxStarts = 2 * goruntime.NumCPU()
	}
	if cfg.Events == nil {
		cfg.Events = func(string) {}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Service{
		cfg: cfg, log: cfg.Log, ws: cfg.Workspaces, ctx: ctx, stop: stop,
		starts:   make(chan struct{}, cfg.MaxStarts),
		runtimes: map[string]runtime.Runtime{},
		pools:    map[string]*pool{}, refill: make(chan struct{}, 1), wake: make(chan struct{}, 1),
	}
	for name, size := range cfg.Pools {
		if size > 0 {
			s.pools[name] = &pool{template: name, size: size}
		}
	}
	return s
}

// Close stops the warm pools and prebuilds, destroys the pooled
// sandboxes and waits. Sandboxes that sessions have stay up: a restarted
// server reattaches to them.
func (s *Service) Close() {
	s.stop()
	s.wg.Wait()
}

// Runtime returns the runtime of that name ("" is the default), asked of
// Config.Runtime once.
func (s *Service) Runtime(name string) (runtime.Runtime, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rt := s.runtimes[name]; rt != nil {
		return rt, nil
	}
	rt, err := s.cfg.Runtime(name)
	if err != nil {
		return nil, fmt.Errorf("runtime %q: %v: %w", name, err, errdefs.ErrUnavailable)
	}
	s.runtimes[name] = rt
	return rt, nil
}

// Spec resolves a tenant's template name to its spec (Config.Resolve).
func (s *Service) Spec(ctx context.Context, tenant, name string) (template.Spec, error) {
	if s.cfg.Resolve != nil {
		return s.cfg.Resolve(ctx, tenant, name)
	}
	if spec, ok := template.Builtin(name); ok {
		return spec, nil
	}
	spec, err := s.cfg.Templates.Named(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return spec, fmt.Errorf("template_id %q: no such template: %w", name, errdefs.ErrInvalidArgument)
	}
	return spec, err
}

// specFor is Spec for a session pinned to build (its hash, "" for none):
// a template deleted while sessions use it (DELETE ?force=true) leaves
// them the spec their build was made from.
func (s *Service) specFor(ctx context.Context, tenant, name, build string) (template.Spec, error) {
	spec, err := s.Spec(ctx, tenant, name)
	if err != nil && build != "" && errors.Is(err, errdefs.ErrInvalidArgument) {
		if t, gerr := s.cfg.Templates.Get(build); gerr == nil {
			t.Spec.Owner = tenant
			return t.Spec, nil
		}
	}
	return spec, err
}

// build finds the template build pinned (by its hash; "" for none), or
// builds (or finds) the current one when there is no such build.
func (s *Service) build(ctx context.Context, spec template.Spec, pinned, session string) (*template.Template, error) {
	if pinned != "" {
		if t, err := s.cfg.Templates.Get(pinned); err == nil {
			// The build is pinned; what is not part of its hash follows the
			// current definition.
			t.Spec.Env, t.Spec.Preload, t.Spec.Resources = spec.Env, spec.Preload, spec.Resources
			return t, nil
		}
		s.log.Warn("pinned template build is gone; using the current one", "session", session, "hash", pinned)
	}
	if t, ok := s.cfg.Templates.Lookup(spec); ok {
		return t, nil
	}
	if spec.Owner != "" {
		if s.cfg.NotBuilt != nil {
			return nil, s.cfg.NotBuilt(ctx, spec.Owner, spec.Name)
		}
		return nil, fmt.Errorf("template %q: %w: %w", spec.Name, template.ErrNotBuilt, errdefs.ErrUnavailable)
	}
	s.log.Info("building template (once; later sessions reuse it)", "template", spec.Name)
	t, err := s.cfg.Templates.Ensure(ctx, spec, progressLog{s.log, spec.Name})
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	return t, nil
}

// Request asks for a session's sandbox.
type Request struct {
	Tenant, Session string
	// Template names the template; Build is the template build the
	// session is pinned to ("" for none: the current one).
	Template, Build string
	// Env are the session's variables, over the template's.
	Env map[string]string
	// Resources are the session's: CPU, MemoryMB and DiskMB, over the
	// template's.
	Resources runtime.Resources
}

// Create builds the template if need be and creates a sandbox over the
// session's workspace. It returns the sandbox and the template build it
// runs, for the session's record.
func (s *Service) Create(ctx context.Context, req Request) (*Sandbox, string, error) {
	spec, err := s.specFor(ctx, req.Tenant, req.Template, req.Build)
	if err != nil {
		return nil, "", err
	}
	rt, err := s.Runtime(spec.Runtime)
	if err != nil {
		return nil, "", err
	}
	tmpl, err := s.build(ctx, spec, req.Build, req.Session)
	if err != nil {
		return nil, "", err
	}
	env := maps.Clone(tmpl.Spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, req.Env)
	res := tmpl.Spec.Resources
	res.CPU, res.MemoryMB, res.DiskMB = req.Resources.CPU, req.Resources.MemoryMB, req.Resources.DiskMB
	release, err := s.startSlot(ctx)
	if err != nil {
		return nil, "", err
	}
	defer release()
	id := newID()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	_, err = rt.Create(ctx, runtime.Spec{
		ID: id, Image: tmpl.Image(), Runtime: spec.Runtime, Volume: workspace.SessionVolume(req.Tenant, req.Session),
		Env: env, Preload: tmpl.Spec.Preload, Resources: res,
		Labels: s.labels(map[string]string{LabelTenant: req.Tenant, LabelSession: req.Session, LabelTemplate: req.Template}),
	})
	if err != nil {
		return nil, "", err
	}
	s.cfg.Events("create")
	return Attach(rt, id), tmpl.Hash, nil
}

// startSlot waits for one of the MaxStarts start slots; release gives it
// back.
func (s *Service) startSlot(ctx context.Context) (release func(), err error) {
	select {
	case s.starts <- struct{}{}:
		return func() { <-s.starts }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// labels adds the instance's and replica's labels to a sandbox's labels.
func (s *Service) labels(l map[string]string) map[string]string {
	if s.cfg.Instance != "" {
		l[LabelInstance] = s.cfg.Instance
	}
	if s.cfg.Replica != "" {
		l[LabelReplica] = s.cfg.Replica
	}
	return l
}

// Destroy closes the sandbox's client and destroys it.
func (s *Service) Destroy(ctx context.Context, sb *Sandbox) {
	sb.Client.Close()
	if s.cfg.Destroying != nil {
		s.cfg.Destroying(ctx, sb.Runtime, sb.ID)
	}
	if err := sb.Runtime.Destroy(ctx, sb.ID); err != nil {
		s.log.Error("destroying sandbox", "sandbox", sb.ID, "err", err)
		return
	}
	s.cfg.Events("destroy")
}

// DestroyRecorded destroys the sandbox id, which a tenant's session of
// template templateID, pinned to build, records, when this process does
// not hold it (another process started it).
func (s *Service) DestroyRecorded(ctx context.Context, tenant, templateID, build, id string) {
	spec, err := s.specFor(ctx, tenant, templateID, build)
	if err != nil {
		s.log.Warn("cannot destroy sandbox: template unknown", "sandbox", id, "err", err)
		return
	}
	rt, err := s.Runtime(spec.Runtime)
	if err != nil {
		s.log.Warn("cannot destroy sandbox", "sandbox", id, "err", err)
		return
	}
	if s.cfg.Destroying != nil {
		s.cfg.Destroying(ctx, rt, id)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		s.log.Error("destroying sandbox", "sandbox", id, "err", err)
	}
}

// Reattach returns the sandbox id of a tenant's session of template
// templateID, pinned to build, if its runtime has it running or frozen
// (another replica started it, or a previous process), whether it is
// frozen, and what it was given. One that is stopped is destroyed; nil
// means the session has no sandbox any more.
func (s *Service) Reattach(ctx context.Context, tenant, templateID, build, id string) (sb *Sandbox, frozen bool, res runtime.Resources, err error) {
	spec, err := s.specFor(ctx, tenant, templateID, build)
	if err != nil {
		return nil, false, res, err
	}
	rt, err := s.Runtime(spec.Runtime)
	if err != nil {
		return nil, false, res, err
	}
	info, err := rt.Inspect(ctx, id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return nil, false, res, nil
	case err != nil:
		return nil, false, res, err
	case info.State == runtime.StateRunning || info.State == runtime.StatePaused:
		return Attach(rt, id), info.State == runtime.StatePaused, info.Resources, nil
	}
	if err := rt.Destroy(ctx, id); err != nil {
		s.log.Warn("destroying a stopped sandbox", "sandbox", id, "err", err)
	}
	return nil, false, res, nil
}

// Found is a sandbox a runtime listed.
type Found struct {
	Info    runtime.Info
	Runtime runtime.Runtime
}

// List lists the sandboxes of this instance (pooled or a session's) on
// the named runtimes, by id; listed says which runtimes could answer.
func (s *Service) List(ctx context.Context, runtimes []string) (live map[string]Found, listed map[string]bool) {
	live, listed = map[string]Found{}, map[string]bool{}
	for _, name := range runtimes {
		if _, done := listed[name]; done {
			continue
		}
		listed[name] = false
		rt, err := s.Runtime(name)
		if err != nil {
			s.log.Warn("cannot reconcile the sandboxes of a runtime", "runtime", name, "err", err)
			continue
		}
		infos, err := rt.List(ctx)
		if err != nil {
			s.log.Warn("cannot reconcile the sandboxes of a runtime", "runtime", name, "err", err)
			continue
		}
		listed[name] = true
		for _, info := range infos {
			if info.Labels[LabelSession] == "" && info.Labels[LabelPool] == "" { // sbx run's own
				continue
			}
			if inst := info.Labels[LabelInstance]; inst != s.cfg.Instance && (inst != "" || s.cfg.Instance == "") {
				continue // another deployment's
			}
			live[info.ID] = Found{info, rt}
		}
	}
	return live, listed
}

// DestroyOrphans destroys the listed sandboxes no session took, but for
// those of live replicas (their warm pools, their starts not recorded
// yet), which it returns, and those of no known instance.
func (s *Service) DestroyOrphans(ctx context.Context, orphans map[string]Found) (peers map[string]bool) {
	peers = map[string]bool{}
	for id, f := range orphans {
		if unclaimedShared(f.Runtime, f.Info) {
			continue // the pool's: its leader collects it (CollectPools)
		}
		if f.Info.Labels[LabelInstance] != s.cfg.Instance {
			// Made before instances: ours, or another server's that
			// shares the runtime's state. Not ours to destroy.
			s.log.Warn("a sandbox of no known instance is left alone; destroy it by hand if no server uses it", "sandbox", id, "session", f.Info.Labels[LabelSession])
			continue
		}
		if r := f.Info.Labels[LabelReplica]; r != "" && s.cfg.Alive != nil {
			if alive, err := s.cfg.Alive(ctx, r); err != nil || alive {
				peers[id] = true
				continue
			}
		}
		s.log.Info("destroying orphaned sandbox", "sandbox", id, "session", f.Info.Labels[LabelSession])
		if err := f.Runtime.Destroy(ctx, id); err != nil {
			s.log.Warn("destroying orphaned sandbox", "sandbox", id, "err", err)
		}
	}
	return peers
}

// Sweep destroys the sandboxes that replicas which died started and no
// record names (named says which ids records name): starts they did not
// live to record, and their warm pools with their workspaces. A replica
// that starts does this in Start; sweep is for replicas that never come
// back. The candidates are found from the labels, and only when there
// are some are the records asked for.
func (s *Service) Sweep(ctx context.Context, named func(context.Context) (map[string]bool, error)) {
	rt, err := s.Runtime("")
	if err != nil {
		return
	}
	infos, err := rt.List(ctx)
	if err != nil {
		s.log.Warn("sweeping dead replicas' sandboxes", "err", err)
		return
	}
	dead := map[string]bool{}
	var orphans []runtime.Info
	for _, info := range infos {
		r := info.Labels[LabelReplica]
		if r == "" || r == s.cfg.Replica || info.Labels[LabelInstance] != s.cfg.Instance || unclaimedShared(rt, info) {
			continue
		}
		gone, seen := dead[r]
		if !seen {
			alive, err := s.cfg.Alive(ctx, r)
			if err != nil {
				return
			}
			gone, dead[r] = !alive, !alive
		}
		if gone {
			orphans = append(orphans, info)
		}
	}
	if len(orphans) == 0 {
		return
	}
	ids, err := named(ctx)
	if err != nil {
		s.log.Warn("sweeping dead replicas' sandboxes", "err", err)
		return
	}
	for _, info := range orphans {
		if ids[info.ID] {
			continue // a session's: adopted at its next call
		}
		s.log.Info("destroying a sandbox a dead replica left", "sandbox", info.ID, "replica", info.Labels[LabelReplica], "session", info.Labels[LabelSession])
		if err := rt.Destroy(ctx, info.ID); err != nil {
			s.log.Warn("destroying a sandbox a dead replica left", "sandbox", info.ID, "err", err)
			continue
		}
		if info.Labels[LabelPool] != "" {
			if err := s.ws.Remove(ctx, workspace.PoolVolume(info.ID)); err != nil {
				s.log.Warn("removing a dead replica's pooled workspace", "sandbox", info.ID, "err", err)
			}
		}
	}
}

// Prebuild builds the named templates in the background, one after the
// other, so that the first session of each does not wait for its build.
func (s *Service) Prebuild(names []string) {
	if len(names) == 0 {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for _, name := range names {
			spec, err := s.Spec(s.ctx, "", name)
			if err != nil {
				s.log.Warn("prebuild", "template", name, "err", err)
				continue
			}
			if _, ok := s.cfg.Templates.Lookup(spec); ok {
				continue
			}
			s.log.Info("building template in the background (once; cached)", "template", name)
			if _, err := s.cfg.Templates.Ensure(s.ctx, spec, progressLog{s.log, name}); err != nil {
				if s.ctx.Err() == nil {
					s.log.Error("template build failed", "template", name, "err", err)
				}
				continue
			}
			s.log.Info("template ready", "template", name)
		}
	}()
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

// newID is a new sandbox's id.
func newID() string {
	b := make([]byte, 10)
	rand.Read(b)
	return "sbx-" + hex.EncodeToString(b)
}
