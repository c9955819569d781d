package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/template"
)

// sandboxes starts, finds and destroys the sandboxes that sessions run
// in, on the runtimes their templates name, and keeps the warm pools
// (pool.go). It never reads or writes a session's record: what a record
// must say of a sandbox (which one the session has, the template build it
// runs), the Manager writes, under the session's lock. What this process
// does with a session's sandbox at a given moment is the entry's state
// machine (sandboxstate.go).
type sandboxes struct {
	opt *Options // the Manager's, defaults applied
	log *slog.Logger
	ws  *workspaces
	ctx context.Context // the Manager's: background work stops with it
	wg  *sync.WaitGroup // the Manager's: Close waits for the pools' starts

	starts chan struct{} // start slots (Options.MaxStarts)

	mu       sync.Mutex
	runtimes map[string]runtime.Runtime

	pools  map[string]*pool // by template; fixed at New
	refill chan struct{}    // wakes the pool filler
}

func newSandboxes(ctx context.Context, opt *Options, ws *workspaces, wg *sync.WaitGroup) *sandboxes {
	s := &sandboxes{
		opt: opt, log: opt.Log, ws: ws, ctx: ctx, wg: wg,
		starts:   make(chan struct{}, opt.MaxStarts),
		runtimes: map[string]runtime.Runtime{},
		pools:    map[string]*pool{}, refill: make(chan struct{}, 1),
	}
	for name, size := range opt.Pools {
		if size > 0 {
			s.pools[name] = &pool{template: name, size: size}
		}
	}
	return s
}

// sandbox is a sandbox this process can reach: its runtime and a client
// of its executor.
type sandbox struct {
	id     string
	rt     runtime.Runtime
	client *executor.Client
}

func dialer(rt runtime.Runtime, id string) *executor.Client {
	return executor.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
}

// runtime returns the runtime of that name ("" is the default), asked of
// Options.Runtime once.
func (s *sandboxes) runtime(name string) (runtime.Runtime, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rt := s.runtimes[name]; rt != nil {
		return rt, nil
	}
	rt, err := s.opt.Runtime(name)
	if err != nil {
		return nil, fmt.Errorf("runtime %q: %v: %w", name, err, errdefs.ErrUnavailable)
	}
	s.runtimes[name] = rt
	return rt, nil
}

// spec resolves a template name to its spec: a built-in or one defined in
// the template store. Unknown names are ErrInvalidArgument.
func (s *sandboxes) spec(name string) (template.Spec, error) {
	if spec, ok := template.Builtin(name); ok {
		return spec, nil
	}
	spec, err := s.opt.Templates.Named(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		names := []string{}
		for _, b := range template.Builtins() {
			names = append(names, b.Name)
		}
		return spec, invalid("template_id %q: no such template (built-in: %v)", name, names)
	}
	return spec, err
}

// build finds the template build pinned (by its hash; "" for none), or
// builds (or finds) the current one when there is no such build.
func (s *sandboxes) build(ctx context.Context, spec template.Spec, pinned, session string) (*template.Template, error) {
	if pinned != "" {
		if t, err := s.opt.Templates.Get(pinned); err == nil {
			// The build is pinned; what is not part of its hash follows the
			// current definition.
			t.Spec.Env, t.Spec.Preload, t.Spec.Resources = spec.Env, spec.Preload, spec.Resources
			return t, nil
		}
		s.log.Warn("pinned template build is gone; using the current one", "session", session, "hash", pinned)
	}
	if t, ok := s.opt.Templates.Lookup(spec); ok {
		return t, nil
	}
	s.log.Info("building template (once; later sessions reuse it)", "template", spec.Name)
	t, err := s.opt.Templates.Ensure(ctx, spec, progressLog{s.log, spec.Name})
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	return t, nil
}

// create builds the session's template if need be and creates a sandbox
// over its workspace. It returns the sandbox and the template build it
// runs, for the record.
func (s *sandboxes) create(ctx context.Context, sess *Session) (*sandbox, string, error) {
	spec, err := s.spec(sess.TemplateID)
	if err != nil {
		return nil, "", err
	}
	rt, err := s.runtime(spec.Runtime)
	if err != nil {
		return nil, "", err
	}
	tmpl, err := s.build(ctx, spec, sess.Config.TemplateHash, sess.ID)
	if err != nil {
		return nil, "", err
	}
	env := maps.Clone(tmpl.Spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, sess.Config.Env)
	res := tmpl.Spec.Resources
	res.CPU, res.MemoryMB, res.DiskMB = sess.Config.Resources.CPU, sess.Config.Resources.Memory, sess.Config.Resources.Disk
	release, err := s.startSlot(ctx)
	if err != nil {
		return nil, "", err
	}
	defer release()
	id := newID("sbx")
	ctx, cancel := context.WithTimeout(ctx, s.opt.StartTimeout)
	defer cancel()
	_, err = rt.Create(ctx, runtime.Spec{
		ID: id, Rootfs: tmpl.Rootfs, Workspace: s.ws.dir(key{sess.Tenant, sess.ID}),
		Env: env, Preload: tmpl.Spec.Preload, Resources: res,
		Labels: s.labels(map[string]string{LabelTenant: sess.Tenant, LabelSession: sess.ID, "sbx.template": sess.TemplateID}),
	})
	if err != nil {
		return nil, "", err
	}
	s.opt.Events("create")
	return &sandbox{id: id, rt: rt, client: dialer(rt, id)}, tmpl.Hash, nil
}

// startSlot waits for one of the MaxStarts start slots; release gives it
// back.
func (s *sandboxes) startSlot(ctx context.Context) (release func(), err error) {
	select {
	case s.starts <- struct{}{}:
		return func() { <-s.starts }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// labels adds the instance's and replica's labels to a sandbox's labels.
func (s *sandboxes) labels(l map[string]string) map[string]string {
	if s.opt.Instance != "" {
		l[LabelInstance] = s.opt.Instance
	}
	if s.opt.Replica != "" {
		l[LabelReplica] = s.opt.Replica
	}
	return l
}

func (s *sandboxes) destroy(ctx context.Context, sb *sandbox) {
	sb.client.Close()
	if err := sb.rt.Destroy(ctx, sb.id); err != nil {
		s.log.Error("destroying sandbox", "sandbox", sb.id, "err", err)
		return
	}
	s.opt.Events("destroy")
}

// destroyRecorded destroys the sandbox id, which a session of template
// templateID records, when this process does not hold it (another
// process started it).
func (s *sandboxes) destroyRecorded(ctx context.Context, templateID, id string) {
	spec, err := s.spec(templateID)
	if err != nil {
		s.log.Warn("cannot destroy sandbox: template unknown", "sandbox", id, "err", err)
		return
	}
	rt, err := s.runtime(spec.Runtime)
	if err != nil {
		s.log.Warn("cannot destroy sandbox", "sandbox", id, "err", err)
		return
	}
	if err := rt.Destroy(ctx, id); err != nil {
		s.log.Error("destroying sandbox", "sandbox", id, "err", err)
	}
}

// reattach returns the sandbox id of a session of template templateID, if
// its runtime has it running or frozen (another replica started it, or a
// previous process), whether it is frozen, and what it was given. One
// that is stopped is destroyed; nil means the session has no sandbox any
// more.
func (s *sandboxes) reattach(ctx context.Context, templateID, id string) (sb *sandbox, frozen bool, res runtime.Resources, err error) {
	spec, err := s.spec(templateID)
	if err != nil {
		return nil, false, res, err
	}
	rt, err := s.runtime(spec.Runtime)
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
		return &sandbox{id: id, rt: rt, client: dialer(rt, id)}, info.State == runtime.StatePaused, info.Resources, nil
	}
	if err := rt.Destroy(ctx, id); err != nil {
		s.log.Warn("destroying a stopped sandbox", "sandbox", id, "err", err)
	}
	return nil, false, res, nil
}

// found is a sandbox a runtime listed.
type found struct {
	info runtime.Info
	rt   runtime.Runtime
}

// list lists the sandboxes of this instance (pooled or a session's) on
// the named runtimes, by id; listed says which runtimes could answer.
func (s *sandboxes) list(ctx context.Context, runtimes []string) (live map[string]found, listed map[string]bool) {
	live, listed = map[string]found{}, map[string]bool{}
	for _, name := range runtimes {
		if _, done := listed[name]; done {
			continue
		}
		listed[name] = false
		rt, err := s.runtime(name)
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
			if inst := info.Labels[LabelInstance]; inst != s.opt.Instance && (inst != "" || s.opt.Instance == "") {
				continue // another deployment's
			}
			live[info.ID] = found{info, rt}
		}
	}
	return live, listed
}

// destroyOrphans destroys the listed sandboxes no session took, but for
// those of live replicas (their warm pools, their starts not recorded
// yet), which it returns, and those of no known instance.
func (s *sandboxes) destroyOrphans(ctx context.Context, orphans map[string]found) (peers map[string]bool) {
	peers = map[string]bool{}
	for id, f := range orphans {
		if f.info.Labels[LabelInstance] != s.opt.Instance {
			// Made before instances: ours, or another server's that
			// shares the runtime's state. Not ours to destroy.
			s.log.Warn("a sandbox of no known instance is left alone; destroy it by hand if no server uses it", "sandbox", id, "session", f.info.Labels[LabelSession])
			continue
		}
		if r := f.info.Labels[LabelReplica]; r != "" && s.opt.Alive != nil {
			if alive, err := s.opt.Alive(ctx, r); err != nil || alive {
				peers[id] = true
				continue
			}
		}
		s.log.Info("destroying orphaned sandbox", "sandbox", id, "session", f.info.Labels[LabelSession])
		if err := f.rt.Destroy(ctx, id); err != nil {
			s.log.Warn("destroying orphaned sandbox", "sandbox", id, "err", err)
		}
	}
	return peers
}

// sweep destroys the sandboxes that replicas which died started and no
// record names (named says which ids records name): starts they did not
// live to record, and their warm pools with their workspaces. A replica
// that starts does this in Start; sweep is for replicas that never come
// back. The candidates are found from the labels, and only when there
// are some are the records asked for.
func (s *sandboxes) sweep(ctx context.Context, named func(context.Context) (map[string]bool, error)) {
	rt, err := s.runtime("")
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
		if r == "" || r == s.opt.Replica || info.Labels[LabelInstance] != s.opt.Instance {
			continue
		}
		gone, seen := dead[r]
		if !seen {
			alive, err := s.opt.Alive(ctx, r)
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
			if err := s.ws.remove(ctx, filepath.Join(s.ws.poolDir(), info.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
				s.log.Warn("removing a dead replica's pooled workspace", "sandbox", info.ID, "err", err)
			}
		}
	}
}

// prebuild builds the named templates in the background, one after the
// other, so that the first session of each does not wait for its build.
func (s *sandboxes) prebuild(names []string) {
	if len(names) == 0 {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for _, name := range names {
			spec, err := s.spec(name)
			if err != nil {
				s.log.Warn("prebuild", "template", name, "err", err)
				continue
			}
			if _, ok := s.opt.Templates.Lookup(spec); ok {
				continue
			}
			s.log.Info("building template in the background (once; cached)", "template", name)
			if _, err := s.opt.Templates.Ensure(s.ctx, spec, progressLog{s.log, name}); err != nil {
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
