package session

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// LabelPool marks a sandbox started ahead of demand for a template's
// warm pool.
const LabelPool = "sbx.pool"

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

	mu       sync.Mutex
	ready    []*pooled
	starting int
}

type pooled struct {
	sb   *sandbox
	dir  string // its workspace, under WorkspaceDir/.pool
	hash string // the template build it runs
}

// poolSizes reports each pool's ready sandboxes.
func (s *sandboxes) poolSizes() map[string]int {
	out := map[string]int{}
	for name, p := range s.pools {
		p.mu.Lock()
		out[name] = len(p.ready)
		p.mu.Unlock()
	}
	return out
}

// filler keeps the pools full: it starts what is missing, one sandbox at a
// time per pool, when a claim wakes it and every few seconds.
func (s *sandboxes) filler() {
	defer s.wg.Done()
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		for _, p := range s.pools {
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
func (s *sandboxes) fill(p *pool) {
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
		s.dropPooled(pd)
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

func (s *sandboxes) startPooled(ctx context.Context, name string) (*pooled, error) {
	spec, err := s.spec(name)
	if err != nil {
		return nil, err
	}
	rt, err := s.runtime(spec.Runtime)
	if err != nil {
		return nil, err
	}
	tmpl, ok := s.opt.Templates.Lookup(spec)
	if !ok {
		s.log.Info("building template for its warm pool (once; cached)", "template", name)
		if tmpl, err = s.opt.Templates.Ensure(ctx, spec, progressLog{s.log, name}); err != nil {
			return nil, err
		}
	}
	release, err := s.startSlot(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	id := newID("sbx")
	dir := filepath.Join(s.ws.poolDir(), id)
	if err := os.MkdirAll(s.ws.poolDir(), 0o711); err != nil {
		return nil, err
	}
	// The template's default disk: a session claims a pooled sandbox only
	// if it asked for that.
	if err := s.ws.make(ctx, dir, spec.Resources.WithDefaults().DiskMB); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.opt.StartTimeout)
	defer cancel()
	_, err = rt.Create(cctx, runtime.Spec{
		ID: id, Rootfs: tmpl.Rootfs, Workspace: dir, Env: maps.Clone(tmpl.Spec.Env), Preload: tmpl.Spec.Preload,
		Resources: tmpl.Spec.Resources, Labels: s.labels(map[string]string{LabelPool: name, "sbx.template": name}),
	})
	if err != nil {
		s.ws.remove(context.WithoutCancel(ctx), dir)
		return nil, err
	}
	pd := &pooled{sb: &sandbox{id: id, rt: rt, client: dialer(rt, id)}, dir: dir, hash: tmpl.Hash}
	// Ready means preload done, so that the first execution pays nothing.
	if err := pd.sb.client.WaitReady(cctx); err != nil {
		s.dropPooled(pd)
		return nil, err
	}
	s.opt.Events("create")
	return pd, nil
}

func (s *sandboxes) dropPooled(pd *pooled) {
	s.destroy(context.Background(), pd.sb)
	if err := s.ws.remove(context.Background(), pd.dir); err != nil {
		s.log.Warn("warm pool: removing a workspace", "dir", pd.dir, "err", err)
	}
}

// drainPools destroys the pooled sandboxes: they hold nothing of anyone's,
// and a restarted server would find them orphaned anyway.
func (s *sandboxes) drainPools() {
	for _, p := range s.pools {
		p.mu.Lock()
		ready := p.ready
		p.ready = nil
		p.mu.Unlock()
		for _, pd := range ready {
			s.dropPooled(pd)
		}
	}
}

// claim hands the session a pooled sandbox if its template has a pool
// with one ready and the session fits it, moving the session's files into
// the pooled workspace, which takes the session's workspace's place; it
// reports whether it did. The caller holds the session's lock; no file
// call is using the workspace (e.claiming keeps new ones out).
func (s *sandboxes) claim(sess *Session) (*pooled, bool) {
	p := s.pools[sess.TemplateID]
	if p == nil {
		return nil, false
	}
	spec, err := s.spec(sess.TemplateID)
	if err != nil {
		return nil, false
	}
	def := spec.Resources.WithDefaults()
	if r := sess.Config.Resources; r.CPU != def.CPU || r.Memory != def.MemoryMB || r.Disk != def.DiskMB {
		return nil, false // the pool's sandboxes have the template's limits
	}
	p.mu.Lock()
	var pd *pooled
	for i, c := range p.ready {
		if sess.Config.TemplateHash == "" || c.hash == sess.Config.TemplateHash {
			pd = c
			p.ready = append(p.ready[:i], p.ready[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
	if pd == nil {
		s.opt.Events("pool_miss")
		return nil, false
	}
	select {
	case s.refill <- struct{}{}:
	default:
	}
	if err := s.ws.moveInto(pd.dir, s.ws.dir(key{sess.Tenant, sess.ID})); err != nil {
		s.log.Error("warm pool: moving a workspace into a pooled sandbox", "session", sess.ID, "err", err)
		s.dropPooled(pd)
		return nil, false
	}
	s.opt.Events("pool_hit")
	return pd, true
}

// pinLocked records the template build a session's sandbox runs. The
// caller holds the session's lock.
func (m *Manager) pinLocked(k key, hash string) {
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
