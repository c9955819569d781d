package sandbox

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Warm pools that replicas share (runtime.Pools, the Kubernetes runtime):
// the pool's size is the deployment's, not each replica's. Only the
// leader (Config.Leader) starts pool sandboxes and collects those nobody
// will claim; every replica claims, from the runtime's watch of the pool,
// and the runtime makes sure that no two claims get one sandbox. Close
// leaves the pool as it is: the other replicas use it.

// sharedTick is how often the shared pools' filler looks at the pools:
// a replica's claim wakes it at once, another replica's only shows in the
// runtime's watch.
const sharedTick = time.Second

// collectEvery is how often the leader collects the pools' stale
// sandboxes; leaderEvery, how long it trusts an answer of Config.Leader.
const (
	collectEvery = 30 * time.Second
	leaderEvery  = 5 * time.Second
)

// sharedFiller keeps the shared pools full while this process leads.
func (s *Service) sharedFiller() {
	defer s.wg.Done()
	t := time.NewTicker(sharedTick)
	defer t.Stop()
	var leading bool
	var asked, collected time.Time
	for {
		if time.Since(asked) > leaderEvery {
			leading, asked = s.leading(), time.Now()
		}
		want := map[runtime.Pools]map[string]string{}
		complete := map[runtime.Pools]bool{}
		for _, p := range s.pools {
			if p.shared == nil {
				continue
			}
			if want[p.shared] == nil {
				want[p.shared], complete[p.shared] = map[string]string{}, true
			}
			build, ok := s.fillShared(p, leading)
			if ok {
				want[p.shared][p.template] = build
			} else {
				complete[p.shared] = false
			}
		}
		if leading && time.Since(collected) > collectEvery {
			collected = time.Now()
			for sp, w := range want {
				if !complete[sp] {
					continue // a pool's build is not known: its Pods are not stale
				}
				// Stuck: its starter gave up long ago (StartTimeout).
				if _, err := sp.CollectPools(s.ctx, w, 2*s.cfg.StartTimeout+time.Minute); err != nil && s.ctx.Err() == nil {
					s.log.Warn("warm pool: collecting stale sandboxes", "err", err)
				}
			}
		}
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		case <-s.wake:
			select { // as filler: the claimed sandbox's first execution first
			case <-s.ctx.Done():
			case <-time.After(refillDelay):
			}
		}
	}
}

// leading asks Config.Leader.
func (s *Service) leading() bool {
	if s.cfg.Leader == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 10*time.Second)
	defer cancel()
	return s.cfg.Leader(ctx)
}

// fillShared counts shared pool p's sandboxes of its template's current
// build and, when leading, starts what is missing. It returns that build.
func (s *Service) fillShared(p *pool, leading bool) (string, bool) {
	spec, err := s.Spec(s.ctx, "", p.template)
	if err != nil {
		return "", false
	}
	tmpl, ok := s.cfg.Templates.Lookup(spec)
	if !ok {
		if leading {
			p.mu.Lock()
			idle := p.starting == 0
			if idle {
				p.starting++
			}
			p.mu.Unlock()
			if idle {
				s.wg.Add(1)
				go s.ensurePoolTemplate(p)
			}
		}
		return "", false
	}
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	ready, starting, err := p.shared.PoolCounts(ctx, p.template, tmpl.Hash)
	cancel()
	if err != nil {
		if s.ctx.Err() == nil {
			s.log.Warn("warm pool: counting", "template", p.template, "err", err)
		}
		return tmpl.Hash, true
	}
	p.mu.Lock()
	p.sharedReady = ready
	// Starts of this process in flight show in the watch as starting
	// once their Pods exist: count them once.
	missing := p.size - ready - max(starting, p.starting)
	if !leading || missing < 0 {
		missing = 0
	}
	p.starting += missing
	p.mu.Unlock()
	for range missing {
		s.wg.Add(1)
		go s.startShared(p, tmpl.Hash)
	}
	return tmpl.Hash, true
}

// ensurePoolTemplate builds shared pool p's template.
func (s *Service) ensurePoolTemplate(p *pool) {
	defer s.wg.Done()
	defer func() { p.mu.Lock(); p.starting--; p.mu.Unlock() }()
	spec, err := s.Spec(s.ctx, "", p.template)
	if err == nil {
		s.log.Info("building template for its warm pool (once; cached)", "template", p.template)
		_, err = s.cfg.Templates.Ensure(s.ctx, spec, progressLog{s.log, p.template})
	}
	if err != nil && s.ctx.Err() == nil {
		s.log.Warn("warm pool: template build failed", "template", p.template, "err", err)
		s.pause(5 * time.Second)
	}
}

func (s *Service) pause(d time.Duration) {
	select {
	case <-s.ctx.Done():
	case <-time.After(d):
	}
}

// startShared starts one sandbox of shared pool p, of build.
func (s *Service) startShared(p *pool, build string) {
	defer s.wg.Done()
	defer func() { p.mu.Lock(); p.starting--; p.mu.Unlock() }()
	err := s.startSharedSandbox(p, build)
	if err != nil && s.ctx.Err() == nil {
		s.log.Warn("warm pool: sandbox start failed", "template", p.template, "err", err)
		s.pause(5 * time.Second) // not at once again: the runtime may be down
	}
}

func (s *Service) startSharedSandbox(p *pool, build string) error {
	spec, err := s.Spec(s.ctx, "", p.template)
	if err != nil {
		return err
	}
	tmpl, err := s.cfg.Templates.Get(build)
	if err != nil {
		return err
	}
	release, err := s.startSlot(s.ctx)
	if err != nil {
		return err
	}
	defer release()
	id := newID()
	vol := workspace.PoolVolume(id)
	if err := s.ws.Create(s.ctx, vol, spec.Resources.WithDefaults().DiskMB); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.StartTimeout)
	defer cancel()
	err = p.shared.StartPooled(ctx, p.template, build, runtime.Spec{
		ID: id, Image: tmpl.Image(), Runtime: spec.Runtime, Volume: vol, Env: maps.Clone(spec.Env), Preload: spec.Preload,
		Resources: spec.Resources, Labels: s.labels(map[string]string{LabelPool: p.template, LabelTemplate: p.template}),
	})
	if err != nil {
		s.ws.Remove(context.WithoutCancel(ctx), vol)
		return err
	}
	s.cfg.Events("create")
	return nil
}

// claimShared claims a sandbox of shared pool p for req: the runtime's
// claim makes it the holder of the session's workspace and records the
// session and this replica on it, in one write, so that a claim this
// replica does not live to record is a dead replica's orphan
// (DestroyOrphans, Sweep). The caller checked that req fits the pool.
func (s *Service) claimShared(p *pool, req Request) (*Pooled, bool) {
	vol := workspace.SessionVolume(req.Tenant, req.Session)
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.StartTimeout)
	defer cancel()
	labels := s.labels(map[string]string{LabelTenant: req.Tenant, LabelSession: req.Session, LabelTemplate: req.Template})
	id, build, err := p.shared.ClaimPooled(ctx, p.template, req.Build, vol, labels)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			s.log.Warn("warm pool: claiming", "template", p.template, "session", req.Session, "err", err)
		}
		s.cfg.Events("pool_miss")
		return nil, false
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
	pd := &Pooled{Sandbox: Attach(p.rt, id), Build: build, volume: workspace.PoolVolume(id)}
	// The session's saved workspace, if it has one, into the claimed
	// sandbox (through its executor: its spec never changes).
	if err := s.ws.Claim(ctx, pd.volume, vol); err != nil {
		s.log.Error("warm pool: giving a pooled sandbox the session's workspace", "session", req.Session, "err", err)
		s.DropPooled(pd)
		return nil, false
	}
	s.cfg.Events("pool_hit")
	return pd, true
}

// unclaimedShared says whether info is a sandbox of a shared pool that
// no session claimed (starting or ready): orphan sweeps leave it to the
// pool's leader, which collects what is stale (runtime.Pools
// CollectPools). A claimed one carries its session's labels and the
// claiming replica's, and is swept as any session's sandbox.
func unclaimedShared(rt runtime.Runtime, info runtime.Info) bool {
	return runtime.CapabilitiesOf(rt).Pools && info.Labels[LabelPool] != "" && info.Labels[LabelSession] == ""
}
