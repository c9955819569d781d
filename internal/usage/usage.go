// Package usage samples the resource usage of the sandboxes a process
// holds. Every few seconds a Sampler reads each sandbox's cgroups
// (runtime.StatsReader) and its workspace's disk quota, and keeps the
// last minutes of readings per session: the history of GET
// /sessions/{id}/metrics and E2B's getMetrics, and, summed per tenant, the
// Prometheus series of internal/server/metrics.go. A request's current
// reading is taken when it comes (Read), not the last sample.
//
// What a sampler knows is its own process's: with replicas, each samples
// the sandboxes it holds (session.Manager.Held), so a session's history
// is in the replicas that hold its sandbox, while any replica on the host
// can read the sandbox now.
//
// A runtime that reads no stats (no runtime.StatsReader) has no live
// figures: its sandboxes are not sampled, and a request for their
// metrics answers no reading rather than an error (Now).
package usage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/session"
)

// Defaults of Config.
const (
	DefaultInterval = 5 * time.Second
	DefaultKeep     = 15 * time.Minute
)

// minWindow is the shortest time a reading's CPU share is measured over:
// a request's reading without an earlier one of the same sandbox at least
// this old reads the sandbox twice, this far apart.
const minWindow = 250 * time.Millisecond

// Config configures a Sampler.
type Config struct {
	// Held lists the sandboxes to sample (session.Manager.Held).
	Held func() []session.SandboxRef
	// Disk reads what a workspace volume (session.SandboxRef.Volume)
	// holds and its limit (quota.Dirs.Usage of its directory). Nil, or an
	// error: the disk is not known, and readings say 0 for both.
	Disk func(ctx context.Context, volume string) (used, limit int64, err error)
	// Interval is the time between two passes over the sandboxes; default
	// DefaultInterval.
	Interval time.Duration
	// Keep is how far back each session's samples go (Keep/Interval
	// samples at most); default DefaultKeep.
	Keep time.Duration
	Log  *slog.Logger
}

// Sample is one reading of a sandbox.
type Sample struct {
	Time time.Time
	// CPUPct is the CPU time the sandbox used since the reading before,
	// as a percentage of what its limit allows over that time (100: all
	// of its cores, all of the time).
	CPUPct float64
	// CPUCount is the sandbox's CPU limit, in cores (0.5: half a core).
	CPUCount float64
	// MemoryBytes is what its memory limit counts, page cache
	// (MemoryCacheBytes) included.
	MemoryBytes, MemoryCacheBytes, MemoryLimitBytes int64
	// DiskBytes is what its workspace holds as the disk quota counts it;
	// both are 0 when the disk cannot be read (no quotas on this server).
	DiskBytes, DiskLimitBytes int64
	// PIDs counts its processes and threads, the executor's few included;
	// PIDsLimit is the limit its code is held to.
	PIDs, PIDsLimit int64

	cpuNanos uint64 // the sandbox's CPU time so far
}

// Sampler samples the sandboxes Config.Held lists: Start starts it, Close
// stops it.
type Sampler struct {
	cfg    Config
	log    *slog.Logger
	size   int              // samples kept per session
	now    func() time.Time // time.Now; tests move it
	window time.Duration    // minWindow; tests shorten it

	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu        sync.Mutex
	rings     map[key]*ring
	bySandbox map[string]*ring
	// gone is the CPU time, per tenant, of the sandboxes no longer held,
	// so that a tenant's total never goes back when one goes.
	gone map[string]uint64
	// failed are the sandboxes whose reading failed in the last pass.
	failed map[string]bool
}

type key struct{ tenant, session string }

// New returns a sampler; Start starts its passes.
func New(cfg Config) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Sampler{
		cfg: cfg, log: cfg.Log, size: max(1, int(cfg.Keep/cfg.Interval)), now: time.Now, window: minWindow,
		ctx: ctx, stop: stop,
		rings: map[key]*ring{}, bySandbox: map[string]*ring{}, gone: map[string]uint64{},
	}
}

// Interval is the time between two samples.
func (s *Sampler) Interval() time.Duration { return s.cfg.Interval }

// Start starts a pass over the sandboxes now and every Interval after,
// until Close.
func (s *Sampler) Start() {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(s.cfg.Interval)
		defer t.Stop()
		for {
			s.pass(s.ctx)
			select {
			case <-s.ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Close stops the passes and waits for the one under way.
func (s *Sampler) Close() {
	s.stop()
	s.wg.Wait()
}

// Pass runs a pass now, besides those Start runs (tests, benchmarks), and
// reports how many sandboxes it read.
func (s *Sampler) Pass(ctx context.Context) int { return s.pass(ctx) }

// readers bounds the sandboxes a pass reads at once. A reading may be a
// network call (a Pod's executor: internal/runtime/kube), and one whose
// sandbox does not answer takes its runtime's timeout: read one after
// another, a few such would leave no time for the rest.
const readers = 8

// readShare is the share of a pass one reading may take: the runtime's
// own bound comes first (kube: a second), this one holds for any runtime,
// so that a pass has time for readers*readShare stalled readings before
// the others.
const readShare = 5

// pass reads every sandbox held, and forgets the sessions whose sandbox
// is no longer held or gone from its runtime. It reports how many it read.
// Sandboxes whose last reading failed are read last, so that those of a
// tenant whose code starves its executors cannot take the pass's time
// from the others; a sandbox the pass had no time left for keeps what it
// had.
func (s *Sampler) pass(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Interval)
	defer cancel()
	start := time.Now()
	held := s.cfg.Held()
	s.mu.Lock()
	slices.SortStableFunc(held, func(a, b session.SandboxRef) int {
		switch fa, fb := s.failed[a.ID], s.failed[b.ID]; {
		case fa == fb:
			return 0
		case fb:
			return -1
		}
		return 1
	})
	s.mu.Unlock()
	var (
		mu     sync.Mutex // guards seen, failed and read
		seen   = make(map[key]bool, len(held))
		failed = map[string]bool{}
		read   int
		wg     sync.WaitGroup
		slots  = make(chan struct{}, readers)
	)
	for _, t := range held {
		if !Live(t.Runtime) {
			continue // nothing to sample
		}
		k := key{t.Tenant, t.Session}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			mu.Lock()
			seen[k] = true // no time left: it keeps what it has
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, s.cfg.Interval/readShare)
			smp, err := s.measure(rctx, t)
			cancel()
			<-slots
			mu.Lock()
			defer mu.Unlock()
			if errors.Is(err, errdefs.ErrNotFound) {
				return // destroyed since Held: forgotten below
			}
			seen[k] = true // a reading that failed keeps what there was
			if err != nil {
				failed[t.ID] = true
				s.log.Debug("usage: reading a sandbox", "session", t.Session, "sandbox", t.ID, "err", err)
				return
			}
			read++
			s.mu.Lock()
			s.record(k, t.ID, smp)
			s.mu.Unlock()
		}()
	}
	wg.Wait()
	s.mu.Lock()
	s.failed = failed
	for k, r := range s.rings {
		if !seen[k] {
			s.retire(k, r)
		}
	}
	s.mu.Unlock()
	s.log.Debug("usage: sampled the sandboxes", "sandboxes", len(held), "read", read, "failed", len(failed), "took", time.Since(start))
	return read
}

// Live says whether the sandboxes of rt have live figures: rt reads
// stats (runtime.StatsReader).
func Live(rt runtime.Runtime) bool { return rt != nil && runtime.CapabilitiesOf(rt).Stats }

// errNotLive is measure's answer for a runtime that reads no stats.
var errNotLive = fmt.Errorf("the runtime reads no sandbox stats: %w", errdefs.ErrFailedPrecondition)

// measure reads the sandbox's cgroups and its workspace's disk.
func (s *Sampler) measure(ctx context.Context, t session.SandboxRef) (Sample, error) {
	r, ok := runtime.StatsReaderOf(t.Runtime)
	if !ok {
		return Sample{}, errNotLive
	}
	st, err := r.Stats(ctx, t.ID)
	if err != nil {
		return Sample{}, err
	}
	smp := Sample{
		Time: s.now(), CPUCount: st.Limits.CPU,
		MemoryBytes: int64(st.MemoryBytes), MemoryCacheBytes: int64(st.MemoryCacheBytes), MemoryLimitBytes: st.Limits.MemoryMB << 20,
		PIDs: int64(st.PIDs), PIDsLimit: st.Limits.PIDs,
		cpuNanos: st.CPUNanos,
	}
	if s.cfg.Disk != nil && t.Volume != "" {
		if used, limit, err := s.cfg.Disk(ctx, t.Volume); err == nil {
			smp.DiskBytes, smp.DiskLimitBytes = used, limit
		}
	} else if st.DiskBytes > 0 || st.Limits.DiskMB > 0 {
		// No host quota to ask (a Pod): what the runtime read.
		smp.DiskBytes, smp.DiskLimitBytes = int64(min(st.DiskBytes, 1<<62)), st.Limits.DiskMB<<20
	}
	return smp, nil
}

// record adds a pass's reading of the session's sandbox. The caller
// holds s.mu.
func (s *Sampler) record(k key, sandbox string, smp Sample) {
	r := s.rings[k]
	if r != nil && r.sandbox != sandbox {
		s.retire(k, r) // a new sandbox: the old one's samples go with it
		r = nil
	}
	if r == nil {
		r = &ring{tenant: k.tenant, sandbox: sandbox, last: smp}
		s.rings[k], s.bySandbox[sandbox] = r, r
		return // the first reading is the base of the next one's CPU
	}
	// The CPU time only grows (a sandbox whose cgroups are gone reads 0).
	smp.cpuNanos = max(smp.cpuNanos, r.last.cpuNanos)
	smp.CPUPct = cpuPct(r.last, smp)
	r.add(smp, s.size)
	r.last = smp
}

// retire forgets a session's samples, keeping its sandbox's CPU time in
// its tenant's total. The caller holds s.mu.
func (s *Sampler) retire(k key, r *ring) {
	s.gone[r.tenant] += r.cpu()
	delete(s.rings, k)
	if s.bySandbox[r.sandbox] == r {
		delete(s.bySandbox, r.sandbox)
	}
}

// Final takes a last reading of the CPU time of sandbox id, about to be
// destroyed (session.Options.Destroying), so that its tenant's total
// has what it used since the last pass. A sandbox never sampled is
// unknown here, and left out.
func (s *Sampler) Final(ctx context.Context, rt runtime.Runtime, id string) {
	s.mu.Lock()
	r := s.bySandbox[id]
	s.mu.Unlock()
	sr, ok := runtime.StatsReaderOf(rt)
	if r == nil || !ok {
		return
	}
	st, err := sr.Stats(ctx, id)
	if err != nil {
		return
	}
	s.mu.Lock()
	r.final = max(r.final, st.CPUNanos)
	s.mu.Unlock()
}

// Read takes a reading of the sandbox now. Its CPU share is measured
// since the latest reading of the same sandbox this sampler has that is
// at least a quarter of a second old; without one (a sandbox another
// replica holds, or one just started) the sandbox is read twice, a
// quarter of a second apart. A paused sandbox uses no CPU and is read
// once. ErrNotFound: the sandbox is gone.
func (s *Sampler) Read(ctx context.Context, t session.SandboxRef) (Sample, error) {
	cur, err := s.measure(ctx, t)
	if err != nil || t.Paused {
		return cur, err
	}
	s.mu.Lock()
	base, ok := s.base(key{t.Tenant, t.Session}, t.ID, cur.Time)
	s.mu.Unlock()
	if !ok {
		select {
		case <-time.After(s.window):
		case <-ctx.Done():
			return Sample{}, context.Cause(ctx)
		}
		base = cur
		if cur, err = s.measure(ctx, t); err != nil {
			return Sample{}, err
		}
	}
	cur.cpuNanos = max(cur.cpuNanos, base.cpuNanos)
	cur.CPUPct = cpuPct(base, cur)
	return cur, nil
}

// base is the newest reading of the session's sandbox at least s.window
// older than at. The caller holds s.mu.
func (s *Sampler) base(k key, sandbox string, at time.Time) (Sample, bool) {
	r := s.rings[k]
	if r == nil || r.sandbox != sandbox {
		return Sample{}, false
	}
	if at.Sub(r.last.Time) >= s.window {
		return r.last, true
	}
	for i := r.len() - 1; i >= 0; i-- {
		if smp := r.at(i); at.Sub(smp.Time) >= s.window {
			return smp, true
		}
	}
	return Sample{}, false
}

// History returns the samples of the session's sandbox taken at or
// after since (all of them for a zero since), oldest first; none if the
// sampler's samples are of another sandbox or of none.
func (s *Sampler) History(tenant, session, sandbox string, since time.Time) []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rings[key{tenant, session}]
	out := []Sample{}
	if r == nil || r.sandbox != sandbox {
		return out
	}
	for i := range r.len() {
		if smp := r.at(i); !smp.Time.Before(since) {
			out = append(out, smp)
		}
	}
	return out
}

// Tenant is what a tenant's sandboxes held by this process use, as of
// the last pass.
type Tenant struct {
	Name string
	// CPUSeconds is the CPU time of its sandboxes, those destroyed or let
	// go since this sampler started included: it never decreases.
	CPUSeconds float64
	// MemoryBytes, DiskBytes and PIDs are summed over the sandboxes held,
	// Sandboxes counts them.
	MemoryBytes, DiskBytes, PIDs int64
	Sandboxes                    int
}

// Tenants sums the last readings per tenant: every tenant with a
// sandbox held, or one since this sampler started.
func (s *Sampler) Tenants() []Tenant {
	s.mu.Lock()
	defer s.mu.Unlock()
	byName := map[string]*Tenant{}
	get := func(name string) *Tenant {
		t := byName[name]
		if t == nil {
			t = &Tenant{Name: name}
			byName[name] = t
		}
		return t
	}
	cpu := map[string]uint64{}
	for name, n := range s.gone {
		get(name)
		cpu[name] += n
	}
	for _, r := range s.rings {
		t := get(r.tenant)
		cpu[r.tenant] += r.cpu()
		t.MemoryBytes += r.last.MemoryBytes
		t.DiskBytes += r.last.DiskBytes
		t.PIDs += r.last.PIDs
		t.Sandboxes++
	}
	out := make([]Tenant, 0, len(byName))
	for name, t := range byName {
		t.CPUSeconds = float64(cpu[name]) / 1e9
		out = append(out, *t)
	}
	return out
}

// cpuPct is the share of its CPU limit the sandbox used from base to cur,
// in percent, to two decimals. The limit is enforced, so more than 100
// is the edge of a period counted in: it is shown as 100.
func cpuPct(base, cur Sample) float64 {
	dt := cur.Time.Sub(base.Time)
	if dt <= 0 || cur.CPUCount <= 0 || cur.cpuNanos < base.cpuNanos {
		return 0
	}
	pct := float64(cur.cpuNanos-base.cpuNanos) / float64(dt) / cur.CPUCount * 100
	return math.Round(min(pct, 100)*100) / 100
}

// ring is one session's samples, of one sandbox: at most size, the
// oldest dropped first.
type ring struct {
	tenant, sandbox string
	buf             []Sample // in time order from start, wrapping round
	start           int
	// last is the latest reading, the base of the next one's CPU share
	// (the first reading of a sandbox is only that).
	last Sample
	// final is the CPU time read as the sandbox was destroyed (Final).
	final uint64
}

func (r *ring) add(smp Sample, size int) {
	if len(r.buf) < size {
		r.buf = append(r.buf, smp) // grows to size as samples come
		return
	}
	r.buf[r.start] = smp
	r.start = (r.start + 1) % size
}

// len counts the samples.
func (r *ring) len() int { return len(r.buf) }

// at is the i-th sample, oldest first.
func (r *ring) at(i int) Sample { return r.buf[(r.start+i)%len(r.buf)] }

// cpu is the sandbox's CPU time as last read.
func (r *ring) cpu() uint64 { return max(r.last.cpuNanos, r.final) }

// Now is what a request for a session's metrics answers: a reading of
// ref's sandbox taken now (Read) and the samples of it taken at or after
// since. Both are empty when there is no sandbox to read: ref nil, the
// sandbox gone since it was named, or a runtime with no live figures
// (Live).
func (s *Sampler) Now(ctx context.Context, ref *session.SandboxRef, since time.Time) (*Sample, []Sample, error) {
	if ref == nil || !Live(ref.Runtime) {
		return nil, []Sample{}, nil
	}
	cur, err := s.Read(ctx, *ref)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, []Sample{}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return &cur, s.History(ref.Tenant, ref.Session, ref.ID, since), nil
}
