package session

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/quota"
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

func (m *Manager) poolDir() string { return filepath.Join(m.opt.WorkspaceDir, ".pool") }

// PoolSizes reports each pool's ready sandboxes.
func (m *Manager) PoolSizes() map[string]int {
	out := map[string]int{}
	for name, p := range m.pools {
		p.mu.Lock()
		out[name] = len(p.ready)
		p.mu.Unlock()
	}
	return out
}

// filler keeps the pools full: it starts what is missing, one sandbox at a
// time per pool, when a claim wakes it and every few seconds.
func (m *Manager) filler() {
	defer m.wg.Done()
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		for _, p := range m.pools {
			p.mu.Lock()
			missing := p.size - len(p.ready) - p.starting
			if missing > 0 {
				p.starting++
			}
			p.mu.Unlock()
			if missing > 0 {
				m.wg.Add(1)
				go m.fill(p)
			}
		}
		select {
		case <-m.ctx.Done():
			m.drainPools()
			return
		case <-t.C:
		case <-m.refill:
			// A claim woke us: let the session's first execution have the
			// CPU first. A sandbox start is a few hundred milliseconds of
			// both cores; started at once, it doubled that execution's
			// time.
			select {
			case <-m.ctx.Done():
			case <-time.After(refillDelay):
			}
		}
	}
}

// refillDelay is how long the filler waits after a claim.
const refillDelay = 250 * time.Millisecond

// fill starts one pooled sandbox.
func (m *Manager) fill(p *pool) {
	defer m.wg.Done()
	pd, err := m.startPooled(m.ctx, p.template)
	p.mu.Lock()
	p.starting--
	if err == nil && m.ctx.Err() == nil {
		p.ready = append(p.ready, pd)
		pd = nil
	}
	p.mu.Unlock()
	if pd != nil {
		m.dropPooled(pd)
	}
	if err != nil && m.ctx.Err() == nil {
		m.log.Warn("warm pool: sandbox start failed", "template", p.template, "err", err)
		select { // not at once again: the runtime may be down
		case <-m.ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
	select {
	case m.refill <- struct{}{}:
	default:
	}
}

func (m *Manager) startPooled(ctx context.Context, name string) (*pooled, error) {
	spec, err := m.Template(name)
	if err != nil {
		return nil, err
	}
	rt, err := m.runtime(spec.Runtime)
	if err != nil {
		return nil, err
	}
	tmpl, ok := m.opt.Templates.Lookup(spec)
	if !ok {
		m.log.Info("building template for its warm pool (once; cached)", "template", name)
		if tmpl, err = m.opt.Templates.Ensure(ctx, spec, progressLog{m.log, name}); err != nil {
			return nil, err
		}
	}
	release, err := m.startSlot(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	id := newID("sbx")
	dir := filepath.Join(m.poolDir(), id)
	if err := os.MkdirAll(m.poolDir(), 0o711); err != nil {
		return nil, err
	}
	// The template's default disk: a session claims a pooled sandbox only
	// if it asked for that.
	if err := m.makeWorkspace(ctx, dir, spec.Resources.WithDefaults().DiskMB); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, m.opt.StartTimeout)
	defer cancel()
	_, err = rt.Create(cctx, runtime.Spec{
		ID: id, Rootfs: tmpl.Rootfs, Workspace: dir, Env: maps.Clone(tmpl.Spec.Env), Preload: tmpl.Spec.Preload,
		Resources: tmpl.Spec.Resources, Labels: m.labels(map[string]string{LabelPool: name, "sbx.template": name}),
	})
	if err != nil {
		m.opt.Quota.Remove(context.WithoutCancel(ctx), dir)
		return nil, err
	}
	pd := &pooled{sb: &sandbox{id: id, rt: rt, client: dialer(rt, id)}, dir: dir, hash: tmpl.Hash}
	// Ready means preload done, so that the first execution pays nothing.
	if err := pd.sb.client.WaitReady(cctx); err != nil {
		m.dropPooled(pd)
		return nil, err
	}
	m.opt.Events("create")
	return pd, nil
}

func (m *Manager) dropPooled(pd *pooled) {
	m.destroy(context.Background(), pd.sb)
	if err := m.opt.Quota.Remove(context.Background(), pd.dir); err != nil {
		m.log.Warn("warm pool: removing a workspace", "dir", pd.dir, "err", err)
	}
}

// drainPools destroys the pooled sandboxes: they hold nothing of anyone's,
// and a restarted server would find them orphaned anyway.
func (m *Manager) drainPools() {
	for _, p := range m.pools {
		p.mu.Lock()
		ready := p.ready
		p.ready = nil
		p.mu.Unlock()
		for _, pd := range ready {
			m.dropPooled(pd)
		}
	}
}

// claim hands the session a pooled sandbox if its template has a pool
// with one ready and the session fits it; it reports whether it did. The
// caller holds the session's lock; no file call is using the workspace
// (e.claiming keeps new ones out).
func (m *Manager) claim(e *entry, s *Session) (*pooled, bool) {
	p := m.pools[s.TemplateID]
	if p == nil {
		return nil, false
	}
	spec, err := m.Template(s.TemplateID)
	if err != nil {
		return nil, false
	}
	def := spec.Resources.WithDefaults()
	if r := s.Config.Resources; r.CPU != def.CPU || r.Memory != def.MemoryMB || r.Disk != def.DiskMB {
		return nil, false // the pool's sandboxes have the template's limits
	}
	p.mu.Lock()
	var pd *pooled
	for i, c := range p.ready {
		if s.Config.TemplateHash == "" || c.hash == s.Config.TemplateHash {
			pd = c
			p.ready = append(p.ready[:i], p.ready[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
	if pd == nil {
		m.opt.Events("pool_miss")
		return nil, false
	}
	select {
	case m.refill <- struct{}{}:
	default:
	}
	if err := m.moveInto(pd.dir, m.workspaceDir(e.key)); err != nil {
		m.log.Error("warm pool: moving a workspace into a pooled sandbox", "session", s.ID, "err", err)
		m.dropPooled(pd)
		return nil, false
	}
	m.opt.Events("pool_hit")
	return pd, true
}

// moveInto makes the pooled workspace dir the session's workspace at
// dst: dst's entries move into dir, then dir takes dst's place. The two
// have quotas of their own, equal (the claim checked), so the entries are
// copied, by reflink, rather than renamed (quota.MoveEntries). If that
// or the exchange fails, dst is left as it was.
func (m *Manager) moveInto(dir, dst string) error {
	undo, err := quota.MoveEntries(dst, dir)
	if err != nil {
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err != nil {
		undo()
		return err
	}
	// dir now holds the session's old directory, emptied or copied from.
	if err := m.opt.Quota.Remove(context.Background(), dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Warn("warm pool: removing an emptied workspace", "dir", dir, "err", err)
	}
	return nil
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
