package usage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/session"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a sampler over a fake runtime, with a clock the test moves
// and a list of held sandboxes it sets.
type fixture struct {
	*Sampler
	rt    *runtimetest.Fake
	clock time.Time
	mu    sync.Mutex
	held  []session.SandboxRef
	disk  map[string]int64
}

func newFixture(t *testing.T, keep time.Duration) *fixture {
	f := &fixture{rt: runtimetest.NewFake(), clock: time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC), disk: map[string]int64{}}
	f.Sampler = New(Config{
		Interval: 5 * time.Second, Keep: keep,
		Held: func() []session.SandboxRef {
			f.mu.Lock()
			defer f.mu.Unlock()
			return append([]session.SandboxRef(nil), f.held...)
		},
		Disk: func(_ context.Context, dir string) (int64, int64, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			used, ok := f.disk[dir]
			if !ok {
				return 0, 0, errors.New("no quota")
			}
			return used, 1 << 30, nil
		},
	})
	f.now = func() time.Time {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.clock
	}
	t.Cleanup(f.Close)
	return f
}

// hold makes the sandbox sbx-ID of tenant's session ID held, with limits
// of cpu cores.
func (f *fixture) hold(tenant, id string, cpu float64) session.SandboxRef {
	ref := session.SandboxRef{Tenant: tenant, Session: id, ID: "sbx-" + id, Runtime: f.rt, Volume: tenant + "/" + id}
	f.rt.Add(ref.ID)
	f.rt.SetStats(ref.ID, runtime.Stats{Limits: runtime.Resources{CPU: cpu, MemoryMB: 512, PIDs: 256}})
	f.mu.Lock()
	f.held = append(f.held, ref)
	f.mu.Unlock()
	return ref
}

func (f *fixture) letGo(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.held {
		if r.Session == id {
			f.held = append(f.held[:i], f.held[i+1:]...)
			return
		}
	}
}

// use sets what the sandbox has used so far.
func (f *fixture) use(ref session.SandboxRef, cpu time.Duration, mem uint64) {
	st, _ := f.rt.Stats(context.Background(), ref.ID)
	st.CPUNanos, st.MemoryBytes, st.PIDs = uint64(cpu), mem, 3
	f.rt.SetStats(ref.ID, *st)
}

func (f *fixture) tick(d time.Duration) {
	f.mu.Lock()
	f.clock = f.clock.Add(d)
	f.mu.Unlock()
	f.pass(context.Background())
}

func (f *fixture) tenant(name string) Tenant {
	for _, t := range f.Tenants() {
		if t.Name == name {
			return t
		}
	}
	return Tenant{}
}

// The CPU share is the CPU time used between two readings over what the
// sandbox's cores allow in that time; the first reading is only a base.
func TestCPUShareFromDeltas(t *testing.T) {
	f := newFixture(t, time.Minute)
	two := f.hold("t", "s", 2)
	half := f.hold("t", "h", 0.5)
	f.disk["t/s"] = 10 << 20
	f.tick(0)
	if h := f.History("t", "s", two.ID, time.Time{}); len(h) != 0 {
		t.Errorf("after the first reading: %d samples, want none (it is the base)", len(h))
	}
	f.use(two, 5*time.Second, 100<<20) // one core of two for 5 s
	f.use(half, time.Second, 50<<20)   // 0.2 core of 0.5 for 5 s
	f.tick(5 * time.Second)
	f.use(two, 15*time.Second, 100<<20) // two cores for 5 s
	f.use(half, 4*time.Second, 50<<20)  // 0.6 cores: more than it may, counted as all of it
	f.tick(5 * time.Second)
	for _, tc := range []struct {
		ref  session.SandboxRef
		want []float64
	}{{two, []float64{50, 100}}, {half, []float64{40, 100}}} {
		h := f.History("t", tc.ref.Session, tc.ref.ID, time.Time{})
		if len(h) != len(tc.want) {
			t.Fatalf("%s: %d samples, want %d", tc.ref.Session, len(h), len(tc.want))
		}
		for i, want := range tc.want {
			if h[i].CPUPct != want {
				t.Errorf("%s sample %d: %.2f%%, want %.2f%%", tc.ref.Session, i, h[i].CPUPct, want)
			}
		}
	}
	h := f.History("t", "s", two.ID, time.Time{})
	if s := h[1]; s.CPUCount != 2 || s.MemoryBytes != 100<<20 || s.MemoryLimitBytes != 512<<20 || s.PIDs != 3 || s.PIDsLimit != 256 ||
		s.DiskBytes != 10<<20 || s.DiskLimitBytes != 1<<30 || !h[0].Time.Before(s.Time) {
		t.Errorf("sample: %+v", s)
	}
	if s := f.History("t", "h", half.ID, time.Time{})[1]; s.DiskBytes != 0 || s.DiskLimitBytes != 0 {
		t.Errorf("a workspace whose disk cannot be read: %d of %d, want 0 of 0", s.DiskBytes, s.DiskLimitBytes)
	}
	if since := f.History("t", "s", two.ID, h[1].Time); len(since) != 1 || !since[0].Time.Equal(h[1].Time) {
		t.Errorf("since the last sample: %+v", since)
	}
	if other := f.History("t", "s", "sbx-other", time.Time{}); len(other) != 0 {
		t.Errorf("history of a sandbox the session no longer has: %+v", other)
	}
}

// Each session keeps Keep/Interval samples, the newest, oldest first.
func TestRingBound(t *testing.T) {
	f := newFixture(t, 15*time.Second) // 3 samples
	ref := f.hold("t", "s", 1)
	for i := range 10 {
		f.use(ref, time.Duration(i)*time.Second, uint64(i))
		f.tick(5 * time.Second)
	}
	h := f.History("t", "s", ref.ID, time.Time{})
	if len(h) != 3 {
		t.Fatalf("%d samples, want 3", len(h))
	}
	for i, s := range h {
		if s.MemoryBytes != int64(7+i) {
			t.Errorf("sample %d is reading %d, want %d", i, s.MemoryBytes, 7+i)
		}
	}
	if r := f.rings[key{"t", "s"}]; cap(r.buf) > 4 {
		t.Errorf("the ring holds room for %d samples", cap(r.buf))
	}
}

// A sandbox destroyed, let go or replaced takes its session's samples
// with it, and its tenant's CPU time never goes back.
func TestForgetAndCounter(t *testing.T) {
	f := newFixture(t, time.Minute)
	a := f.hold("t", "a", 1)
	b := f.hold("t", "b", 1)
	c := f.hold("u", "c", 1)
	f.tick(0)
	f.use(a, 2*time.Second, 10)
	f.use(b, 3*time.Second, 20)
	f.use(c, 4*time.Second, 30)
	f.tick(5 * time.Second)
	if got := f.tenant("t"); got.CPUSeconds != 5 || got.MemoryBytes != 30 || got.PIDs != 6 || got.Sandboxes != 2 {
		t.Errorf("tenant t: %+v", got)
	}
	if got := f.tenant("u"); got.CPUSeconds != 4 || got.Sandboxes != 1 {
		t.Errorf("tenant u: %+v", got)
	}

	// a is destroyed (its last seconds read as it goes), b let go.
	f.use(a, 7*time.Second, 10)
	f.Final(context.Background(), f.rt, a.ID)
	f.rt.Destroy(context.Background(), a.ID)
	f.letGo("b")
	f.tick(5 * time.Second)
	if h := f.History("t", "a", a.ID, time.Time{}); len(h) != 0 {
		t.Errorf("a destroyed sandbox's session kept %d samples", len(h))
	}
	if h := f.History("t", "b", b.ID, time.Time{}); len(h) != 0 {
		t.Errorf("a session whose sandbox was let go kept %d samples", len(h))
	}
	if got := f.tenant("t"); got.CPUSeconds != 10 || got.MemoryBytes != 0 || got.Sandboxes != 0 {
		t.Errorf("tenant t, its sandboxes gone: %+v; want 10 CPU seconds kept, nothing held", got)
	}

	// c's session gets a new sandbox, which starts from nothing.
	f.letGo("c")
	c2 := session.SandboxRef{Tenant: "u", Session: "c", ID: "sbx-c2", Runtime: f.rt}
	f.rt.Add(c2.ID)
	f.mu.Lock()
	f.held = append(f.held, c2)
	f.mu.Unlock()
	f.tick(5 * time.Second)
	if h := f.History("u", "c", c.ID, time.Time{}); len(h) != 0 {
		t.Errorf("the old sandbox's samples stayed: %d", len(h))
	}
	f.use(c2, time.Second, 1)
	f.tick(5 * time.Second)
	if got := f.tenant("u"); got.CPUSeconds != 5 || got.Sandboxes != 1 {
		t.Errorf("tenant u with a new sandbox: %+v; want 4 + 1 CPU seconds", got)
	}
	if h := f.History("u", "c", c2.ID, time.Time{}); len(h) != 1 || h[0].CPUPct != 20 {
		t.Errorf("the new sandbox's samples: %+v", h)
	}
}

// A request's reading is taken now: its CPU share is over the time since
// the sampler's last reading of that sandbox, or, without one, over a
// short wait; a paused sandbox is read once; a gone one is NotFound.
func TestRead(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.window = time.Millisecond
	ref := f.hold("t", "s", 1)
	f.tick(0)
	f.use(ref, 2500*time.Millisecond, 42)
	f.mu.Lock()
	f.clock = f.clock.Add(5 * time.Second)
	f.mu.Unlock()
	cur, err := f.Read(context.Background(), ref)
	if err != nil || cur.CPUPct != 50 || cur.MemoryBytes != 42 {
		t.Errorf("read: %+v, %v; want 50%% since the last pass", cur, err)
	}

	// No base (a sandbox this sampler does not hold): read twice.
	other := session.SandboxRef{Tenant: "t", Session: "o", ID: "sbx-o", Runtime: f.rt}
	f.rt.Add(other.ID)
	if cur, err = f.Read(context.Background(), other); err != nil || cur.CPUPct != 0 || cur.CPUCount != 1 {
		t.Errorf("read without a base: %+v, %v", cur, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err = f.Read(ctx, other); !errors.Is(err, context.Canceled) {
		t.Errorf("read without a base, the request gone: %v", err)
	}

	paused := ref
	paused.Paused = true
	if cur, err = f.Read(context.Background(), paused); err != nil || cur.CPUPct != 0 || cur.MemoryBytes != 42 {
		t.Errorf("read of a paused sandbox: %+v, %v", cur, err)
	}
	f.rt.Destroy(context.Background(), ref.ID)
	if _, err := f.Read(context.Background(), ref); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("read of a destroyed sandbox: %v, want ErrNotFound", err)
	}
}

// Start runs passes until Close, which waits for them (goleak checks no
// goroutine is left).
func TestStartClose(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.cfg.Interval = 10 * time.Millisecond
	f.hold("t", "s", 1)
	f.Start()
	deadline := time.Now().Add(time.Minute)
	for f.tenant("t").Sandboxes == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no pass ran")
		}
		time.Sleep(time.Millisecond)
	}
	f.Close()
	f.Close() // twice is fine: t.Cleanup does it again
}

// A runtime that reads no stats has no live figures: its sandboxes are
// not sampled, a request for one answers no reading and no samples
// rather than an error, and the runtime is never asked for stats.
func TestNoStatsNoFigures(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.rt.Declare(runtime.Capabilities{Pause: true})
	ref := f.hold("t", "s", 1)
	f.disk["t/s"] = 10 << 20
	if n := f.Pass(context.Background()); n != 0 {
		t.Errorf("a pass read %d sandboxes, want none", n)
	}
	f.tick(5 * time.Second)
	cur, samples, err := f.Now(context.Background(), &ref, time.Time{})
	if err != nil || cur != nil || samples == nil || len(samples) != 0 {
		t.Errorf("now: %+v, %v, %v; want no reading, no samples, no error", cur, samples, err)
	}
	f.Final(context.Background(), f.rt, ref.ID)
	if len(f.Tenants()) != 0 {
		t.Errorf("tenants: %+v, want none", f.Tenants())
	}
	if n := f.rt.Calls("Stats"); n != 0 {
		t.Errorf("the runtime that reads no stats was asked for them %d times", n)
	}
}

// stallingRuntime is a runtime whose Stats of the sandboxes in stall
// answers only when the caller gives up: Pods whose executors a tenant's
// code starved, or a Pod gone without a word. It notes the most time a
// caller gave one of them.
type stallingRuntime struct {
	*runtimetest.Fake
	mu    sync.Mutex
	stall map[string]bool
	most  time.Duration
}

func (r *stallingRuntime) Stats(ctx context.Context, id string) (*runtime.Stats, error) {
	r.mu.Lock()
	stall := r.stall[id]
	if d, ok := ctx.Deadline(); stall && ok {
		r.most = max(r.most, time.Until(d))
	}
	r.mu.Unlock()
	if stall {
		<-ctx.Done()
		return nil, fmt.Errorf("stats of %s: %w: %w", id, errdefs.ErrUnavailable, ctx.Err())
	}
	return r.Fake.Stats(ctx, id)
}

// TestSlowSandboxesDoNotStallThePass: sandboxes whose readings stall
// until their caller gives up (one tenant's dozen) cost nobody their
// samples: a pass gives each reading a fifth of its time at most, reads
// eight at once, the stalled ones and any it had no time left for keep
// what they had, and the next pass reads the others first.
func TestSlowSandboxesDoNotStallThePass(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.cfg.Interval = time.Second
	rt := &stallingRuntime{Fake: f.rt, stall: map[string]bool{}}
	var refs []session.SandboxRef
	for i := range 12 {
		refs = append(refs, session.SandboxRef{Tenant: "bad", Session: fmt.Sprintf("b%d", i), ID: fmt.Sprintf("sbx-b%d", i), Runtime: rt})
	}
	for i := range 3 {
		refs = append(refs, session.SandboxRef{Tenant: "good", Session: fmt.Sprintf("g%d", i), ID: fmt.Sprintf("sbx-g%d", i), Runtime: rt})
	}
	for _, ref := range refs {
		rt.Add(ref.ID)
		rt.SetStats(ref.ID, runtime.Stats{CPUNanos: 1, Limits: runtime.Resources{CPU: 1, MemoryMB: 512, PIDs: 256}})
	}
	f.mu.Lock()
	f.held = refs
	f.mu.Unlock()
	ctx := context.Background()
	if n := f.Pass(ctx); n != len(refs) {
		t.Fatalf("the first pass read %d sandboxes, want %d", n, len(refs))
	}
	rt.mu.Lock()
	for _, ref := range refs[:12] {
		rt.stall[ref.ID] = true
	}
	rt.mu.Unlock()
	for pass := range 2 {
		f.mu.Lock()
		f.clock = f.clock.Add(5 * time.Second)
		f.mu.Unlock()
		n := f.Pass(ctx)
		// The first pass after the stall began may run out of time before
		// it reaches the others; the next reads them first.
		if pass > 0 && n != 3 {
			t.Errorf("pass %d with 12 stalling sandboxes read %d, want the 3 others", pass, n)
		}
		for _, tn := range []struct {
			name string
			want int
		}{{"good", 3}, {"bad", 12}} {
			if got := f.tenant(tn.name).Sandboxes; got != tn.want {
				t.Errorf("pass %d: tenant %s has %d sandboxes sampled, want %d: a reading that failed or never came keeps what there was", pass, tn.name, got, tn.want)
			}
		}
	}
	for _, ref := range refs[12:] {
		if h := f.History(ref.Tenant, ref.Session, ref.ID, time.Time{}); len(h) == 0 {
			t.Errorf("%s has no samples", ref.Session)
		}
	}
	rt.mu.Lock()
	most := rt.most
	rt.mu.Unlock()
	if most > f.cfg.Interval/readShare {
		t.Errorf("a stalled reading was given %v, more than a fifth of the pass (%v)", most, f.cfg.Interval/readShare)
	}
}

// Without a host quota to ask (Disk nil: a server of Pods), a sample's
// disk is what the runtime read, of the sandbox's disk limit.
func TestDiskFromTheRuntime(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.cfg.Disk = nil
	ref := f.hold("t", "p", 1)
	st, _ := f.rt.Stats(context.Background(), ref.ID)
	st.DiskBytes, st.Limits.DiskMB = 5<<20, 1024
	f.rt.SetStats(ref.ID, *st)
	f.tick(0)
	f.tick(5 * time.Second)
	h := f.History("t", "p", ref.ID, time.Time{})
	if len(h) != 1 || h[0].DiskBytes != 5<<20 || h[0].DiskLimitBytes != 1<<30 {
		t.Fatalf("samples %+v, want one of 5 MiB used of 1 GiB", h)
	}
}
