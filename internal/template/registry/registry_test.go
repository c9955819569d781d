package registry

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
	"github.com/sbx-sandbox/sbx/internal/template"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var ctx = context.Background()

// harness is a registry over a real SQLite store and a template store in
// a temporary directory whose builds are made by hand: a test holds a
// build's lock, as another process building it would, so that the
// registry's build waits, and then writes the build or lets it go.
type harness struct {
	t         *testing.T
	held      []func()
	reg       *Registry
	st        store.Store
	templates *template.Store
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	templates := template.NewStore(filepath.Join(dir, "templates"))
	cfg.Templates, cfg.Store, cfg.Replica, cfg.LogDir = templates, st, "r1", filepath.Join(dir, "logs")
	h := &harness{t: t, reg: New(cfg), st: st, templates: templates}
	// Builds end before their locks go: a build let go would build for
	// real.
	t.Cleanup(func() {
		h.reg.Close()
		for _, release := range h.held {
			release()
		}
	})
	return h
}

// hold takes the build lock of spec (as tenant's), so that a build of it
// waits; release lets it go.
func (h *harness) hold(tenant string, spec template.Spec) (release func()) {
	h.t.Helper()
	spec.Owner = tenant
	dir := filepath.Join(h.templates.Dir, "locks")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, spec.HashWithShift(h.templates.UIDShift)+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		h.t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { f.Close() }) }
	h.held = append(h.held, release)
	return release
}

// fakeBuild writes a build of spec (as tenant's) as a finished build
// leaves it.
func (h *harness) fakeBuild(tenant string, spec template.Spec) string {
	h.t.Helper()
	spec.Owner = tenant
	hash := spec.HashWithShift(h.templates.UIDShift)
	dir := filepath.Join(h.templates.Dir, "builds", hash)
	if err := os.MkdirAll(filepath.Join(dir, "rootfs", "etc"), 0o755); err != nil {
		h.t.Fatal(err)
	}
	for name, v := range map[string]any{
		"build.json": map[string]any{"hash": hash, "size_bytes": 4096, "built_at": time.Now().UTC()},
		"spec.json":  spec,
	} {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			h.t.Fatal(err)
		}
	}
	return hash
}

// waitStatus polls the template until its status is want.
func (h *harness) waitStatus(tenant, name, want string) api.Template {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := h.reg.Get(ctx, tenant, name)
		if err != nil {
			h.t.Fatal(err)
		}
		if got.Status == want {
			return got
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("template %s is %s (%s); want %s", name, got.Status, got.LastError, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func spec(name, file string) template.Spec {
	return template.Spec{Name: name, Files: map[string]string{"/etc/probe": file}}
}

// TestBuildInBackground: a post queues a build (202), its log streams
// while it runs, and it ends ready with a version; the template is the
// tenant's alone; posting the same spec again starts nothing.
func TestBuildInBackground(t *testing.T) {
	h := newHarness(t, Config{})
	s := spec("mine", "v1")
	release := h.hold("acme", s)
	got, queued, err := h.reg.Submit(ctx, "acme", s)
	if err != nil || !queued || got.Source != "tenant" || (got.Status != api.TemplateQueued && got.Status != api.TemplateBuilding) || got.Build == nil {
		t.Fatalf("Submit = %+v, queued %v, %v", got, queued, err)
	}
	id := got.Build.BuildID
	h.waitStatus("acme", "mine", api.TemplateBuilding)

	var (
		log  strings.Builder
		mu   sync.Mutex
		done = make(chan error, 1)
		seen = make(chan struct{})
	)
	go func() {
		var once sync.Once
		done <- h.reg.Logs(ctx, "acme", "mine", id, true, func(b []byte) error {
			mu.Lock()
			log.Write(b)
			mu.Unlock()
			once.Do(func() { close(seen) })
			return nil
		})
	}()
	<-seen // the log streams while the build runs
	mu.Lock()
	if !strings.Contains(log.String(), "another process is building it") {
		t.Errorf("log so far: %q", log.String())
	}
	mu.Unlock()

	hash := h.fakeBuild("acme", s)
	release()
	ready := h.waitStatus("acme", "mine", api.TemplateReady)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ready.Hash != hash || len(ready.Versions) != 1 || ready.Versions[0].BuildID != id || ready.BuiltAt == nil || ready.SizeBytes != 4096 {
		t.Errorf("ready: %+v", ready)
	}

	// The tenant's own: another tenant neither sees nor resolves it.
	if _, err := h.reg.Get(ctx, "other", "mine"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("other tenant's Get = %v; want ErrNotFound", err)
	}
	if _, err := h.reg.Resolve(ctx, "other", "mine"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("other tenant's Resolve = %v; want ErrInvalidArgument", err)
	}
	list, err := h.reg.List(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	for _, tmpl := range list {
		if tmpl.Name == "mine" {
			t.Errorf("other tenant lists %+v", tmpl)
		}
	}
	resolved, err := h.reg.Resolve(ctx, "acme", "mine")
	if err != nil || resolved.Owner != "acme" || resolved.HashWithShift(h.templates.UIDShift) != hash {
		t.Errorf("Resolve = %+v, %v", resolved, err)
	}

	// The same spec again: ready at once, no new build.
	again, queued, err := h.reg.Submit(ctx, "acme", s)
	if err != nil || queued || again.Build.BuildID != id || again.Status != api.TemplateReady {
		t.Errorf("posted again: %+v, queued %v, %v", again, queued, err)
	}
	// A change outside the rootfs (env) is ready at once too, as a new
	// build of the same version.
	s.Env = map[string]string{"A": "1"}
	env, queued, err := h.reg.Submit(ctx, "acme", s)
	if err != nil || queued || env.Status != api.TemplateReady || env.Hash != hash {
		t.Errorf("env changed: %+v, queued %v, %v", env, queued, err)
	}
	if r, _ := h.reg.Resolve(ctx, "acme", "mine"); r.Env["A"] != "1" {
		t.Errorf("resolved after the env change: %+v", r)
	}
}

// TestCancel: a cancelled build ends cancelled and leaves no build; a
// second cancel, or one of an unknown build, is refused.
func TestCancel(t *testing.T) {
	h := newHarness(t, Config{})
	v0 := spec("slow", "v0")
	h.fakeBuild("acme", v0)
	if _, _, err := h.reg.Submit(ctx, "acme", v0); err != nil {
		t.Fatal(err)
	}
	s := spec("slow", "v1")
	h.hold("acme", s)
	got, _, err := h.reg.Submit(ctx, "acme", s)
	if err != nil {
		t.Fatal(err)
	}
	h.waitStatus("acme", "slow", api.TemplateBuilding)
	// New sessions get the version built while the next one builds.
	if r, err := h.reg.Resolve(ctx, "acme", "slow"); err != nil || r.Files["/etc/probe"] != "v0" {
		t.Errorf("Resolve while v1 builds = %+v, %v; want v0", r, err)
	}
	if _, err := h.reg.Cancel(ctx, "other", "slow", got.Build.BuildID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("other tenant's cancel = %v; want ErrNotFound", err)
	}
	if _, err := h.reg.Cancel(ctx, "acme", "slow", "bld_nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("cancel of an unknown build = %v; want ErrNotFound", err)
	}
	if _, err := h.reg.Cancel(ctx, "acme", "slow", got.Build.BuildID); err != nil {
		t.Fatal(err)
	}
	end := h.waitStatus("acme", "slow", api.TemplateCancelled)
	if r, err := h.reg.Resolve(ctx, "acme", "slow"); err != nil || r.Files["/etc/probe"] != "v0" {
		t.Errorf("Resolve after v1 was cancelled = %+v, %v; want v0", r, err)
	}
	if !strings.Contains(end.LastError, "cancelled") || end.Build.FinishedAt == nil || len(end.Versions) != 1 {
		t.Errorf("cancelled: %+v", end)
	}
	if _, err := h.reg.Cancel(ctx, "acme", "slow", got.Build.BuildID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("second cancel = %v; want ErrFailedPrecondition", err)
	}
	if _, err := os.Stat(filepath.Join(h.templates.Dir, "builds", got.Hash)); !os.IsNotExist(err) {
		t.Errorf("a cancelled build left %v", err)
	}
	var log strings.Builder
	if err := h.reg.Logs(ctx, "acme", "slow", got.Build.BuildID, false, func(b []byte) error { log.Write(b); return nil }); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "cancelled") {
		t.Errorf("log of a cancelled build: %q", log.String())
	}
}

// TestQueue: with one build slot, a second template's build waits for
// the first; a newer spec supersedes a build in progress.
func TestQueue(t *testing.T) {
	h := newHarness(t, Config{Builds: 1})
	a, b := spec("a", "a1"), spec("b", "b1")
	releaseA := h.hold("acme", a)
	if _, _, err := h.reg.Submit(ctx, "acme", a); err != nil {
		t.Fatal(err)
	}
	h.waitStatus("acme", "a", api.TemplateBuilding)
	h.fakeBuild("acme", b)
	// b's build is there already: ready at once, no slot needed.
	if got, queued, err := h.reg.Submit(ctx, "acme", b); err != nil || queued || got.Status != api.TemplateReady {
		t.Fatalf("b: %+v, %v, %v", got, queued, err)
	}
	c := spec("c", "c1")
	h.hold("acme", c)
	if _, _, err := h.reg.Submit(ctx, "acme", c); err != nil {
		t.Fatal(err)
	}
	if got := h.waitStatus("acme", "c", api.TemplateQueued); got.Build.StartedAt != nil {
		t.Errorf("queued build started: %+v", got.Build)
	}
	// A newer spec of a supersedes its build, and starts its own.
	a2 := spec("a", "a2")
	h.fakeBuild("acme", a2)
	if got, queued, err := h.reg.Submit(ctx, "acme", a2); err != nil || queued || got.Status != api.TemplateReady {
		t.Fatalf("a2: %+v, %v, %v", got, queued, err)
	}
	releaseA()
	h.waitStatus("acme", "c", api.TemplateBuilding) // the slot passed on
	a2.Owner = "acme"
	if got := h.waitStatus("acme", "a", api.TemplateReady); got.Hash != a2.HashWithShift(h.templates.UIDShift) {
		t.Errorf("a: %+v; want a2's build", got)
	}
}

// TestSubmitRefusals: built-in names, bad specs and the per-tenant cap.
func TestSubmitRefusals(t *testing.T) {
	h := newHarness(t, Config{MaxTemplates: 2})
	if _, _, err := h.reg.Submit(ctx, "acme", spec("python", "x")); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("a built-in's name = %v; want ErrAlreadyExists", err)
	}
	if _, _, err := h.reg.Submit(ctx, "acme", template.Spec{Name: "Bad Name"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a bad name = %v; want ErrInvalidArgument", err)
	}
	for _, n := range []string{"one", "two"} {
		h.fakeBuild("acme", spec(n, "x"))
		if _, _, err := h.reg.Submit(ctx, "acme", spec(n, "x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := h.reg.Submit(ctx, "acme", spec("three", "x")); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("past the cap = %v; want ErrResourceExhausted", err)
	}
	// Redefining one of them is not a new template.
	h.fakeBuild("acme", spec("two", "y"))
	if _, _, err := h.reg.Submit(ctx, "acme", spec("two", "y")); err != nil {
		t.Errorf("redefining at the cap: %v", err)
	}
	// Another tenant has a cap of its own.
	h.fakeBuild("other", spec("three", "x"))
	if _, _, err := h.reg.Submit(ctx, "other", spec("three", "x")); err != nil {
		t.Errorf("another tenant: %v", err)
	}
}

// TestTenantsNeverShareBuilds: the same spec of two tenants is two builds.
func TestTenantsNeverShareBuilds(t *testing.T) {
	a, b := spec("x", "same"), spec("x", "same")
	a.Owner, b.Owner = "acme", "other"
	if a.Hash() == b.Hash() {
		t.Error("two tenants' identical specs hash the same")
	}
	a.Owner = ""
	if a.Hash() != (template.Spec{Name: "y", Files: a.Files}).Hash() {
		t.Error("an operator spec's hash depends on more than its rootfs")
	}
}

// session records a session of the tenant's template, pinned to hash.
func (h *harness) session(tenant, id, template, hash string) {
	h.t.Helper()
	cfg, _ := json.Marshal(map[string]string{"template_hash": hash})
	if err := h.st.CreateSession(ctx, &store.Session{Tenant: tenant, ID: id, Status: api.StatusRunning, TemplateID: template, Config: cfg, CreatedAt: time.Now()}); err != nil {
		h.t.Fatal(err)
	}
}

// TestDelete: refused while sessions use the template unless forced;
// forced, the build stays for them; otherwise it goes.
func TestDelete(t *testing.T) {
	h := newHarness(t, Config{})
	for _, n := range []string{"kept", "gone"} {
		h.fakeBuild("acme", spec(n, n))
		if _, _, err := h.reg.Submit(ctx, "acme", spec(n, n)); err != nil {
			t.Fatal(err)
		}
	}
	kept, _ := h.reg.Get(ctx, "acme", "kept")
	h.session("acme", "s1", "kept", kept.Hash)
	h.session("other", "s1", "gone", "") // another tenant's session of that name
	if err := h.reg.Delete(ctx, "acme", "kept", false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("delete in use = %v; want ErrConflict", err)
	}
	if err := h.reg.Delete(ctx, "other", "kept", false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("other tenant's delete = %v; want ErrNotFound", err)
	}
	if err := h.reg.Delete(ctx, "acme", "python", true); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("delete of a built-in = %v; want ErrFailedPrecondition", err)
	}
	if err := h.reg.Delete(ctx, "acme", "kept", true); err != nil {
		t.Fatal(err)
	}
	if _, err := h.templates.Get(kept.Hash); err != nil {
		t.Errorf("a forced delete removed the build sessions run on: %v", err)
	}
	gone, _ := h.reg.Get(ctx, "acme", "gone")
	if err := h.reg.Delete(ctx, "acme", "gone", false); err != nil {
		t.Fatal(err)
	}
	if _, err := h.templates.Get(gone.Hash); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the deleted template's build: %v; want it gone", err)
	}
	for _, n := range []string{"kept", "gone"} {
		if _, err := h.reg.Get(ctx, "acme", n); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Get of deleted %s = %v", n, err)
		}
	}
}

// TestPrune: once a newer version is built, the older ones no session
// runs on are removed, from the disk and from the versions.
func TestPrune(t *testing.T) {
	h := newHarness(t, Config{})
	var hashes []string
	for i, v := range []string{"v1", "v2", "v3"} {
		hashes = append(hashes, h.fakeBuild("acme", spec("p", v)))
		if _, _, err := h.reg.Submit(ctx, "acme", spec("p", v)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			h.session("acme", "s1", "p", hashes[0]) // runs on v1
		}
	}
	got, err := h.reg.Get(ctx, "acme", "p")
	if err != nil {
		t.Fatal(err)
	}
	var versions []string
	for _, v := range got.Versions {
		versions = append(versions, v.Hash)
	}
	if want := []string{hashes[2], hashes[0]}; strings.Join(versions, " ") != strings.Join(want, " ") {
		t.Errorf("versions %v; want v3 and v1 (which s1 runs on)", versions)
	}
	for i, want := range []bool{true, false, true} {
		if _, err := h.templates.Get(hashes[i]); (err == nil) != want {
			t.Errorf("build of v%d: %v; want kept %v", i+1, err, want)
		}
	}
}

// TestDiskBounds: a build over the size limit fails and is removed; a
// tenant whose templates hold their share cannot start another build.
func TestDiskBounds(t *testing.T) {
	h := newHarness(t, Config{MaxBuildBytes: 2048, MaxTenantBytes: 6000})
	big := spec("big", "x")
	release := h.hold("acme", big)
	if _, _, err := h.reg.Submit(ctx, "acme", big); err != nil {
		t.Fatal(err)
	}
	hash := h.fakeBuild("acme", big) // 4096 bytes: over 2048
	release()
	got := h.waitStatus("acme", "big", api.TemplateFailed)
	if !strings.Contains(got.LastError, "more than") {
		t.Errorf("oversized build: %+v", got)
	}
	if _, err := h.templates.Get(hash); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the oversized build was kept: %v", err)
	}
	// One template of 4096 bytes built (at once): a build that may take
	// 2048 more would pass 6000.
	h.fakeBuild("acme", spec("one", "1"))
	if _, _, err := h.reg.Submit(ctx, "acme", spec("one", "1")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.reg.Submit(ctx, "acme", spec("two", "2")); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("a build past the tenant's bytes = %v; want ErrResourceExhausted", err)
	}
	h.hold("other", spec("two", "2")) // its build waits, and is never made
	if _, _, err := h.reg.Submit(ctx, "other", spec("two", "2")); err != nil {
		t.Errorf("another tenant: %v", err)
	}
}

// TestAbandonedBuild: a build recorded by a process that is gone shows as
// failed, not as building for ever.
func TestAbandonedBuild(t *testing.T) {
	h := newHarness(t, Config{})
	s := spec("orphan", "x")
	s.Owner = "acme"
	rec := record{Spec: s, Build: build{TemplateBuild: api.TemplateBuild{BuildID: "bld_old", Hash: "h", Status: api.TemplateBuilding, QueuedAt: time.Now()}, Replica: "r0"}}
	b, _ := json.Marshal(rec)
	if err := h.st.PutDocument(ctx, &store.Document{Kind: Kind, Tenant: "acme", Key: "orphan", Value: b}); err != nil {
		t.Fatal(err)
	}
	got, err := h.reg.Get(ctx, "acme", "orphan")
	if err != nil || got.Status != api.TemplateFailed || !strings.Contains(got.LastError, "stopped") {
		t.Errorf("abandoned build: %+v, %v", got, err)
	}
}

// TestCloseCancels: closing the registry ends its builds as cancelled.
func TestCloseCancels(t *testing.T) {
	h := newHarness(t, Config{})
	s := spec("long", "x")
	h.hold("acme", s)
	if _, _, err := h.reg.Submit(ctx, "acme", s); err != nil {
		t.Fatal(err)
	}
	h.waitStatus("acme", "long", api.TemplateBuilding)
	h.reg.Close()
	d, err := h.st.GetDocument(ctx, Kind, "acme", "long")
	if err != nil {
		t.Fatal(err)
	}
	var rec record
	json.Unmarshal(d.Value, &rec)
	if rec.Build.Status != api.TemplateCancelled || !strings.Contains(rec.Build.Error, "shutting down") {
		t.Errorf("after Close: %+v", rec.Build)
	}
}

// TestResourceCaps: a tenant's template may not default to more than a
// session may ask for, nor to more processes or /tmp than any template.
func TestResourceCaps(t *testing.T) {
	h := newHarness(t, Config{MaxResources: api.Resources{CPU: 2, Memory: 2048, Disk: 4096}})
	for name, res := range map[string]runtime.Resources{
		"pids":   {PIDs: MaxPIDs + 1},
		"tmp":    {TmpMB: MaxTmpMB + 1},
		"cpu":    {CPU: 3},
		"memory": {MemoryMB: 4096},
		"disk":   {DiskMB: 8192},
	} {
		s := spec("caps", name)
		s.Resources = res
		if _, _, err := h.reg.Submit(ctx, "acme", s); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s over the cap: %v; want ErrInvalidArgument", name, err)
		}
	}
	s := spec("caps", "ok")
	s.Resources = runtime.Resources{CPU: 2, MemoryMB: 2048, DiskMB: 4096, PIDs: MaxPIDs, TmpMB: 128}
	h.fakeBuild("acme", s)
	if _, _, err := h.reg.Submit(ctx, "acme", s); err != nil {
		t.Errorf("at the caps: %v", err)
	}
}
