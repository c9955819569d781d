package sandbox

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// A warm pool keeps sandboxes of one template started, executor up and
// preload done, each over an empty workspace of its own. A session's
// first sandbox comes from its template's pool when the session asks for
// nothing the pool's sandboxes lack (the template's default resources, the
// same template build): the session's files move into the pooled
// workspace, a rename per top-level entry on one filesystem, and that
// directory takes the session's workspace path. The sandbox's /workspace
// is a bind of the directory itself, not of its path, so it sees the
// session's files from then on. A pooled sandbox serves one session only
// and goes with it: nothing of one user ever reaches another.
type pool struct {
	template string
	size     int

	// shared is the runtime's pool when it shares pools among replicas
	// (runtime.Pools; set by StartPools): then ready is always empty,
	// the pool is the runtime's, and sharedReady is its last count.
	shared runtime.Pools
	rt     runtime.Runtime

	mu          sync.Mutex
	ready       []*Pooled
	starting    int
	sharedReady int
}

// Pooled is a sandbox from a warm pool, claimed for a session.
type Pooled struct {
	Sandbox *Sandbox
	// Build is the template build it runs.
	Build  string
	volume string // its workspace (workspace.PoolVolume)
}

// PoolSizes reports each pool's ready sandboxes.
func (s *Service) PoolSizes() map[string]int {
	out := map[string]int{}
	for name, p := range s.pools {
		p.mu.Lock()
		out[name] = len(p.ready) + p.sharedReady
		p.mu.Unlock()
	}
	return out
}

// filler keeps the pools full: it starts what is missing, one sandbox at a
// time per pool, when a claim wakes it and every few seconds.
func (s *Service) filler() {
	defer s.wg.Done()
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		for _, p := range s.pools {
			if p.shared != nil {
				continue // sharedFiller's
			}
			p.mu.Lock()
			missing := p.size - len(p.ready) - p.starting
			if missing > 0 {
				p.starting++
			}
			p.mu.Unlock()
			if missing > 0 {
				s.wg.Add(1)
				go s.fill(p)
			}
		}
		select {
		case <-s.ctx.Done():
			s.drainPools()
			return
		case <-t.C:
		case <-s.refill:
			// A claim woke us: let the session's first execution have the
			// CPU first. A sandbox start is a few hundred milliseconds of
			// both cores; started at once, it doubled that execution's
			// time.
			select {
			case <-s.ctx.Done():
			case <-time.After(refillDelay):
			}
		}
	}
}

// refillDelay is how long the filler waits after a claim.
const refillDelay = 250 * time.Millisecond

// fill starts one pooled sandbox.
func (s *Service) fill(p *pool) {
	defer s.wg.Done()
	pd, err := s.startPooled(s.ctx, p.template)
	p.mu.Lock()
	p.starting--
	if err == nil && s.ctx.Err() == nil {
		p.ready = append(p.ready, pd)
		pd = nil
	}
	p.mu.Unlock()
	if pd != nil {
		s.DropPooled(pd)
	}
	if err != nil && s.ctx.Err() == nil {
		s.log.Warn("warm pool: sandbox start failed", "template", p.template, "err", err)
		select { // not at once again: the runtime may be down
		case <-s.ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
	select {
	case s.refill <- struct{}{}:
	default:
	}
}

func (s *Service) startPooled(ctx context.Context, name string) (*Pooled, error) {
	spec, err := s.Spec(ctx, "", name)
	if err != nil {
		return nil, err
	}
	rt, err := s.Runtime(spec.Runtime)
	if err != nil {
		return nil, err
	}
	tmpl, ok := s.cfg.Templates.Lookup(spec)
	if !ok {
		s.log.Info("building template for its warm pool (once; cached)", "template", name)
		if tmpl, err = s.cfg.Templates.Ensure(ctx, spec, progressLog{s.log, name}); err != nil {
			return nil, err
		}
	}
	release, err := s.startSlot(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	id := newID()
	vol := workspace.PoolVolume(id)
	// The template's default disk: a session claims a pooled sandbox only
	// if it asked for that.
	if err := s.ws.Create(ctx, vol, spec.Resources.WithDefaults().DiskMB); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	_, err = rt.Create(cctx, runtime.Spec{
		ID: id, Image: tmpl.Image(), Runtime: tmpl.Spec.Runtime, Volume: vol, Env: maps.Clone(tmpl.Spec.Env), Preload: tmpl.Spec.Preload,
		Resources: tmpl.Spec.Resources, Labels: s.labels(map[string]string{LabelPool: name, LabelTemplate: name}),
	})
	if err != nil {
		s.ws.Remove(context.WithoutCancel(ctx), vol)
		return nil, err
	}
	pd := &Pooled{Sandbox: Attach(rt, id), Build: tmpl.Hash, volume: vol}
	// Ready means preload done, so that the first execution pays nothing.
	if err := pd.Sandbox.Client.WaitReady(cctx); err != nil {
		s.DropPooled(pd)
		return nil, err
	}
	s.cfg.Events("create")
	return pd, nil
}

// DropPooled destroys a claimed sandbox that could not be used, and its
// workspace.
func (s *Service) DropPooled(pd *Pooled) {
	s.Destroy(context.Background(), pd.Sandbox)
	if err := s.ws.Remove(context.Background(), pd.volume); err != nil {
		s.log.Warn("warm pool: removing a workspace", "volume", pd.volume, "err", err)
	}
}

// drainPools destroys the pooled sandboxes: they hold nothing of anyone's,
// and a restarted server would find them orphaned anyway.
func (s *Service) drainPools() {
	for _, p := range s.pools {
		if p.shared != nil {
			continue // other replicas claim from it
		}
		p.mu.Lock()
		ready := p.ready
		p.ready = nil
		p.mu.Unlock()
		for _, pd := range ready {
			s.DropPooled(pd)
		}
	}
}

// Claim hands the session a pooled sandbox if its template has a pool
// with one ready and the session fits it, moving the session's files into
// the pooled workspace, which takes the session's workspace's place; it
// reports whether it did. The caller holds the session's lock; no file
// call is using the workspace (e.claiming keeps new ones out).
func (s *Service) Claim(req Request) (*Pooled, bool) {
	p := s.pools[req.Template]
	if p == nil {
		return nil, false
	}
	// A pool is of the operator's template (or a built-in's): a tenant's
	// own template of the same name is another template.
	spec, err := s.Spec(context.Background(), req.Tenant, req.Template)
	if err != nil || spec.Owner != "" {
		return nil, false
	}
	def := spec.Resources.WithDefaults()
	if r := req.Resources; r.CPU != def.CPU || r.MemoryMB != def.MemoryMB || r.DiskMB != def.DiskMB {
		return nil, false // the pool's sandboxes have the template's limits
	}
	if p.shared != nil {
		return s.claimShared(p, req)
	}
	p.mu.Lock()
	var pd *Pooled
	for i, c := range p.ready {
		if req.Build == "" || c.Build == req.Build {
			pd = c
			p.ready = append(p.ready[:i], p.ready[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
	if pd == nil {
		s.cfg.Events("pool_miss")
		return nil, false
	}
	select {
	case s.refill <- struct{}{}:
	default:
	}
	if err := s.ws.Claim(context.Background(), pd.volume, workspace.SessionVolume(req.Tenant, req.Session)); err != nil {
		s.log.Error("warm pool: moving a workspace into a pooled sandbox", "session", req.Session, "err", err)
		s.DropPooled(pd)
		return nil, false
	}
	s.cfg.Events("pool_hit")
	return pd, true
}

// CheckPools checks that every pool's template exists.
func (s *Service) CheckPools() error {
	for name := range s.pools {
		if _, err := s.Spec(context.Background(), "", name); err != nil {
			return fmt.Errorf("warm pool: %w", err)
		}
	}
	return nil
}

// StartPools starts keeping the warm pools full, until Close. A pool
// whose template's runtime shares pools among replicas (runtime.Pools)
// is the runtime's: the leader fills it, every replica claims from it.
func (s *Service) StartPools() {
	if len(s.pools) == 0 {
		return
	}
	shared := false
	for name, p := range s.pools {
		spec, err := s.Spec(s.ctx, "", name)
		if err != nil {
			continue
		}
		rt, err := s.Runtime(spec.Runtime)
		if err != nil {
			continue
		}
		if sp, ok := runtime.PoolsOf(rt); ok {
			p.shared, p.rt, shared = sp, rt, true
		}
	}
	s.wg.Add(1)
	go s.filler()
	if shared {
		s.wg.Add(1)
		go s.sharedFiller()
	}
}

// Pooling says whether any template has a warm pool.
func (s *Service) Pooling() bool { return len(s.pools) > 0 }
