package execution

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

func TestMain(m *testing.M) { runtimetest.Main(m) }

// harness is one server's execution service over real sessions, a real
// SQLite store and sandboxes of the in-process runtime.
type harness struct {
	st  store.Store
	rt  *runtimetest.InProcess
	m   *session.Manager
	svc *Service
	pub *published
}

// published keeps what a Service publishes, in order.
type published struct {
	mu  sync.Mutex
	evs []events.Event
}

func (p *published) add(e events.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.evs = append(p.evs, e)
}

// of returns the events of the execution id.
func (p *published) of(id string) []events.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []events.Event
	for _, e := range p.evs {
		if e.Data.ExecutionID == id {
			out = append(out, e)
		}
	}
	return out
}

func newHarness(t *testing.T, configure ...func(*Options)) *harness {
	t.Helper()
	rt := runtimetest.NewInProcess(t) // skips unless root
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	templates := template.NewStore(filepath.Join(dir, "templates"))
	spec, _ := template.Builtin(session.DefaultTemplate)
	runtimetest.SeedBuild(t, templates, spec)
	wsRoot := runtimetest.WorkspaceRoot(t, "t")
	rt.Volumes = workspace.Volumes(wsRoot)
	m := session.New(session.Options{
		Store: st, Templates: templates,
		Runtime:      func(string) (runtime.Runtime, error) { return rt, nil },
		WorkspaceDir: wsRoot,
		Owners:       workspace.Owners{Root: workspace.Owner{UID: 0, GID: 0}, User: workspace.Owner{UID: runtimetest.SandboxUID, GID: runtimetest.SandboxUID}},
	})
	t.Cleanup(m.Close)
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := &harness{st: st, rt: rt, m: m, pub: &published{}}
	opt := Options{Store: st, Sessions: m, Owner: "me", Publish: h.pub.add}
	for _, f := range configure {
		f(&opt)
	}
	h.svc = New(opt)
	t.Cleanup(h.svc.Close)
	return h
}

// session creates a session of tenant t.
func (h *harness) session(t *testing.T, id string) {
	t.Helper()
	if _, _, err := h.m.Create(context.Background(), "t", session.CreateRequest{ID: id}); err != nil {
		t.Fatal(err)
	}
}

// submit submits code to session s of tenant t.
func (h *harness) submit(t *testing.T, s string, req api.ExecuteRequest) *Run {
	t.Helper()
	r, err := h.svc.Submit(context.Background(), "t", s, req)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	return r
}

// wait waits for the execution's end. The bound only keeps a hang from
// holding the test for ever; it is no timing assertion.
func (h *harness) wait(t *testing.T, svc *Service, id string) *api.Execution {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	x, err := svc.Wait(ctx, "t", id)
	if err != nil {
		t.Fatalf("wait %s: %v", id, err)
	}
	if unfinished(x.Status) {
		t.Fatalf("execution %s still %s after the wait's bound: it hangs", id, x.Status)
	}
	return x
}

// output waits until r printed want on stdout, and fails if it ends
// before.
func output(t *testing.T, r *Run, want string) {
	t.Helper()
	var got string
	for i := 0; ; {
		evs, more := r.Events(i)
		i += len(evs)
		for _, ev := range evs {
			got += ev.Text
		}
		if got == want || len(got) > len(want) {
			break
		}
		select {
		case <-more:
		case <-r.Done():
			if evs, _ := r.Events(i); len(evs) == 0 {
				t.Fatalf("execution ended having printed %q, not %q: %+v", got, want, r.Result())
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("no output %q after two minutes (got %q)", want, got)
		}
	}
	if got != want {
		t.Fatalf("output %q, want %q", got, want)
	}
}

// sandboxes lists the sandboxes of the runtime, by state.
func (h *harness) sandboxes(t *testing.T) []runtime.Info {
	t.Helper()
	l, err := h.rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(l, func(a, b runtime.Info) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return l
}
