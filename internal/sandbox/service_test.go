package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newService is a Service of instance "inst", replica "me", over rt;
// alive names the replicas that still run.
func newService(t *testing.T, rt runtime.Runtime, alive ...string) *Service {
	t.Helper()
	dir := t.TempDir()
	s := New(Config{
		Templates:  template.NewStore(filepath.Join(dir, "templates")),
		Runtime:    func(string) (runtime.Runtime, error) { return rt, nil },
		Workspaces: workspace.NewDirs(workspace.DirsConfig{Root: filepath.Join(dir, "workspaces")}),
		Instance:   "inst", Replica: "me",
		Alive: func(ctx context.Context, replica string) (bool, error) {
			return slices.Contains(alive, replica), nil
		},
	})
	t.Cleanup(s.Close)
	return s
}

func labels(kv ...string) map[string]string {
	l := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return l
}

// List keeps this instance's sandboxes (a session's or a pool's), and
// those labelled before instances existed; DestroyOrphans destroys what
// no session took, but for live replicas' and those of no instance.
func TestListAndOrphans(t *testing.T) {
	rt := runtimetest.NewFake()
	rt.Labelled("mine", labels(LabelInstance, "inst", LabelReplica, "me", LabelSession, "s", LabelTenant, "t"))
	rt.Labelled("dead-start", labels(LabelInstance, "inst", LabelReplica, "dead", LabelSession, "s2", LabelTenant, "t"))
	rt.Labelled("live-pool", labels(LabelInstance, "inst", LabelReplica, "live", LabelPool, "python"))
	rt.Labelled("old", labels(LabelSession, "s3", LabelTenant, "t"))
	rt.Labelled("other-instance", labels(LabelInstance, "other", LabelSession, "s4", LabelTenant, "t"))
	rt.Labelled("sbx-run", labels(LabelInstance, "inst"))
	s := newService(t, rt, "live")
	ctx := context.Background()

	live, listed := s.List(ctx, []string{"", ""})
	if !listed[""] || len(listed) != 1 {
		t.Fatalf("listed runtimes: %v", listed)
	}
	var ids []string
	for id := range live {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if want := []string{"dead-start", "live-pool", "mine", "old"}; !slices.Equal(ids, want) {
		t.Fatalf("List = %v, want %v", ids, want)
	}

	delete(live, "mine") // a session took it
	peers := s.DestroyOrphans(ctx, live)
	if !peers["live-pool"] || len(peers) != 1 {
		t.Errorf("peers = %v, want live-pool alone", peers)
	}
	for id, want := range map[string]bool{"mine": true, "dead-start": false, "live-pool": true, "old": true, "other-instance": true} {
		_, err := rt.Inspect(ctx, id)
		if got := err == nil; got != want {
			t.Errorf("%s there after DestroyOrphans: %v, want %v", id, got, want)
		}
	}
}

// Reattach hands back a running or frozen sandbox, destroys a stopped
// one and says nil for one that is gone.
func TestReattach(t *testing.T) {
	rt := runtimetest.NewFake()
	s := newService(t, rt)
	ctx := context.Background()
	for _, id := range []string{"running", "paused", "stopped"} {
		rt.Add(id)
	}
	if err := rt.Pause(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(ctx, "stopped"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id            string
		found, frozen bool
	}{
		{"running", true, false},
		{"paused", true, true},
		{"stopped", false, false},
		{"gone", false, false},
	} {
		sb, frozen, _, err := s.Reattach(ctx, "t", "python", "", tc.id)
		if err != nil {
			t.Fatalf("%s: %v", tc.id, err)
		}
		if (sb != nil) != tc.found || frozen != tc.frozen {
			t.Errorf("%s: sandbox %v, frozen %v; want found %v, frozen %v", tc.id, sb != nil, frozen, tc.found, tc.frozen)
		}
		if sb != nil {
			sb.Client.Close()
		}
	}
	if _, err := rt.Inspect(ctx, "stopped"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a stopped sandbox after Reattach: %v, want it destroyed", err)
	}
	if _, _, _, err := s.Reattach(ctx, "t", "no-such-template", "", "running"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Reattach with an unknown template: %v, want ErrInvalidArgument", err)
	}
}

// Sweep destroys a dead replica's sandboxes that no record names, and
// its pooled workspaces; a recorded one waits for its session's next call.
func TestSweep(t *testing.T) {
	rt := runtimetest.NewFake()
	s := newService(t, rt, "live")
	ctx := context.Background()
	rt.Labelled("recorded", labels(LabelInstance, "inst", LabelReplica, "dead", LabelSession, "s"))
	rt.Labelled("unrecorded", labels(LabelInstance, "inst", LabelReplica, "dead", LabelSession, "s2"))
	rt.Labelled("dead-pool", labels(LabelInstance, "inst", LabelReplica, "dead", LabelPool, "python"))
	rt.Labelled("live-pool", labels(LabelInstance, "inst", LabelReplica, "live", LabelPool, "python"))
	rt.Labelled("own", labels(LabelInstance, "inst", LabelReplica, "me", LabelSession, "s3"))
	asked := 0
	s.Sweep(ctx, func(context.Context) (map[string]bool, error) {
		asked++
		return map[string]bool{"recorded": true}, nil
	})
	if asked != 1 {
		t.Errorf("the records were asked for %d times, want once", asked)
	}
	for id, want := range map[string]bool{"recorded": true, "unrecorded": false, "dead-pool": false, "live-pool": true, "own": true} {
		_, err := rt.Inspect(ctx, id)
		if got := err == nil; got != want {
			t.Errorf("%s there after Sweep: %v, want %v", id, got, want)
		}
	}
	// Nothing of a dead replica's left: the records are not read.
	if err := rt.Destroy(ctx, "recorded"); err != nil {
		t.Fatal(err)
	}
	s.Sweep(ctx, func(context.Context) (map[string]bool, error) {
		asked++
		return nil, nil
	})
	if asked != 1 {
		t.Errorf("records read with no candidate: %d", asked)
	}
}

// recordingRuntime creates nothing and notes every spec it was asked to
// create.
type recordingRuntime struct {
	*runtimetest.Fake
	mu    sync.Mutex
	specs []runtime.Spec
}

func (r *recordingRuntime) Create(ctx context.Context, spec runtime.Spec) (*runtime.Info, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.specs = append(r.specs, spec)
	return nil, fmt.Errorf("recorded: %w", errdefs.ErrUnavailable)
}

// A sandbox's spec names its template's runtime, for a runtime that runs
// every kind (Kubernetes: a RuntimeClass per template runtime) to pick
// the right one rather than run a gVisor template under runc: a session's
// sandbox and a warm pool's alike.
func TestSpecCarriesTheTemplatesRuntime(t *testing.T) {
	rt := &recordingRuntime{Fake: runtimetest.NewFake()}
	dir := t.TempDir()
	templates := template.NewStore(filepath.Join(dir, "templates"))
	spec, _ := template.Builtin("python")
	spec.Runtime = "runsc"
	runtimetest.SeedBuild(t, templates, spec)
	var asked []string
	s := New(Config{
		Templates: templates,
		Resolve:   func(context.Context, string, string) (template.Spec, error) { return spec, nil },
		Runtime: func(name string) (runtime.Runtime, error) {
			asked = append(asked, name)
			return rt, nil
		},
		Workspaces: workspace.NewDirs(workspace.DirsConfig{Root: filepath.Join(dir, "workspaces")}),
		Instance:   "inst", Replica: "me",
	})
	t.Cleanup(s.Close)
	ctx := context.Background()
	if _, _, err := s.Create(ctx, Request{Tenant: "t", Session: "s", Template: "python"}); err == nil {
		t.Fatal("create: the recording runtime created a sandbox")
	}
	if _, err := s.startPooled(ctx, "python"); err == nil {
		t.Fatal("pooled start: the recording runtime created a sandbox")
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.specs) != 2 {
		t.Fatalf("%d creates, want 2", len(rt.specs))
	}
	for i, got := range rt.specs {
		if got.Runtime != "runsc" {
			t.Errorf("create %d: spec's runtime %q, want the template's, runsc", i, got.Runtime)
		}
	}
	if !slices.Equal(asked, []string{"runsc"}) {
		t.Errorf("runtimes asked for: %q, want runsc once", asked)
	}
}
