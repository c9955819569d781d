// Package registry is templates over the API: each tenant's own
// templates, kept as documents in the metadata store so that every replica
// knows them, built in the background a few at a time, with logs that
// stream while they build. Built-ins and the operator's templates (`sbx
// template build` on the server) are every tenant's; a tenant's are its
// own, and their builds too (template.Spec.Owner).
package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/template"
)

// Kind is the store document kind of a tenant's template; the key is its
// name.
const Kind = "template"

const (
	// MaxSpecBytes bounds a spec sent over the API: it is kept whole in a
	// store document. Large files belong in the workspace or in resources.
	MaxSpecBytes = 768 << 10
	// maxVersions is how many built versions a template remembers.
	maxVersions = 10
	// logTail is how much of a finished build's log its document keeps,
	// for replicas that did not run the build.
	logTail = 64 << 10
	// maxLog bounds a build log kept in memory and on disk.
	maxLog = 8 << 20
	// watchEvery is how often a build looks at its document for a cancel
	// asked through another replica, and a log reader for the end of a
	// build on another replica.
	watchEvery = time.Second
)

// Config configures a Registry.
type Config struct {
	Templates *template.Store
	Store     store.Store
	// Replica names this process among those sharing Store; builds say
	// which replica runs them.
	Replica string
	// Alive says whether a replica still runs; nil when only this process
	// uses the store, so that a build no process runs is known dead.
	Alive func(ctx context.Context, replica string) (bool, error)
	// Builds is how many builds run at once; more queue. Default 1: a
	// build uses a core and the network for a minute.
	Builds int
	// MaxTemplates bounds a tenant's templates. Default 50.
	MaxTemplates int
	// MaxResources caps the default resources of a tenant's template: what
	// one session may ask for (session.CapResources). Zero fields: no cap
	// but the built-in ones of MaxPIDs and MaxTmpMB.
	MaxResources api.Resources
	// MaxBuildBytes bounds one build's root filesystem (default: the
	// store's, Templates.BuildLimit, which a build cannot pass as it runs), MaxTenantBytes a tenant's builds together
	// (default DefaultMaxTenantBytes); see disk.go.
	MaxBuildBytes, MaxTenantBytes int64
	// LogDir keeps the logs of the builds this process ran.
	LogDir string
	Log    *slog.Logger
}

// Registry is the tenants' templates. Close stops its builds.
type Registry struct {
	cfg   Config
	log   *slog.Logger
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	slots chan struct{}

	mu   sync.Mutex
	jobs map[string]*job // builds of this process, by build id
}

// job is a build this process runs or queues.
type job struct {
	tenant, name, id string
	spec             template.Spec
	ctx              context.Context
	cancel           context.CancelCauseFunc
	log              *buildLog
}

// record is a tenant template's document.
type record struct {
	// Spec is the latest spec posted; its Owner is the tenant.
	Spec template.Spec `json:"spec"`
	// Ready is the spec of the newest version built: what new sessions
	// get while a newer spec builds, or after its build failed.
	Ready    *template.Spec        `json:"ready,omitempty"`
	Build    build                 `json:"build"`
	Versions []api.TemplateVersion `json:"versions,omitempty"`
}

// build is the latest build of a record's spec.
type build struct {
	api.TemplateBuild
	SizeBytes       int64  `json:"size_bytes,omitempty"`
	Replica         string `json:"replica,omitempty"`
	CancelRequested bool   `json:"cancel_requested,omitempty"`
	LogTail         string `json:"log_tail,omitempty"`
}

func (b *build) running() bool {
	return b.Status == api.TemplateQueued || b.Status == api.TemplateBuilding
}

// New returns a registry; Close stops it.
func New(cfg Config) *Registry {
	if cfg.Builds <= 0 {
		cfg.Builds = 1
	}
	if cfg.MaxTemplates <= 0 {
		cfg.MaxTemplates = 50
	}
	if cfg.MaxBuildBytes <= 0 {
		cfg.MaxBuildBytes = cfg.Templates.BuildLimit()
	}
	if cfg.MaxTenantBytes <= 0 {
		cfg.MaxTenantBytes = DefaultMaxTenantBytes
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Registry{cfg: cfg, log: cfg.Log, ctx: ctx, stop: stop, slots: make(chan struct{}, cfg.Builds), jobs: map[string]*job{}}
}

// Close cancels the builds in progress and waits for them; their records
// say cancelled.
func (r *Registry) Close() {
	r.stop()
	r.wg.Wait()
}

// Resolve returns the spec a tenant's session of template name runs: a
// built-in, else the tenant's own, else the operator's. Unknown names are
// ErrInvalidArgument, as a session's template_id is an argument.
func (r *Registry) Resolve(ctx context.Context, tenant, name string) (template.Spec, error) {
	if spec, ok := template.Builtin(name); ok {
		return spec, nil
	}
	if tenant != "" {
		rec, _, err := r.get(ctx, tenant, name)
		if err == nil {
			if rec.Build.Status != api.TemplateReady && rec.Ready != nil {
				return *rec.Ready, nil
			}
			return rec.Spec, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return template.Spec{}, err
		}
	}
	spec, err := r.cfg.Templates.Named(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		names := []string{}
		for _, b := range template.Builtins() {
			names = append(names, b.Name)
		}
		return spec, fmt.Errorf("template_id %q: no such template (built-in: %v): %w", name, names, errdefs.ErrInvalidArgument)
	}
	return spec, err
}

// NotBuilt explains why the tenant's template name has no build a sandbox
// can start on: 503 (ErrUnavailable, retry) while its build is queued or
// running, with the build's id and where its log is; 409
// (ErrFailedPrecondition) when its last build failed or was cancelled, or
// its build is not on this server's disk. Sandboxes never build a
// tenant's template themselves: only the queue does, within its limits.
func (r *Registry) NotBuilt(ctx context.Context, tenant, name string) error {
	rec, _, err := r.get(ctx, tenant, name)
	if err != nil {
		return fmt.Errorf("template %q has no build: %w: %w", name, template.ErrNotBuilt, errdefs.ErrFailedPrecondition)
	}
	rec = r.settle(ctx, tenant, name, rec)
	b := rec.Build
	switch {
	case b.running():
		return fmt.Errorf("template %q is building (build %s is %s): a session can start on it once it is ready; GET /api/v1/templates/%s/builds/%s/logs follows the build: %w: %w",
			name, b.BuildID, b.Status, name, b.BuildID, template.ErrNotBuilt, errdefs.ErrUnavailable)
	case b.Status == api.TemplateReady:
		return fmt.Errorf("template %q: its build %s is not on this server; post the spec again to rebuild it: %w: %w", name, b.BuildID, template.ErrNotBuilt, errdefs.ErrFailedPrecondition)
	default:
		return fmt.Errorf("template %q has no build to start a session on: its last build (%s) is %s (%s): %w: %w",
			name, b.BuildID, b.Status, b.Error, template.ErrNotBuilt, errdefs.ErrFailedPrecondition)
	}
}

// get reads a tenant's template record.
func (r *Registry) get(ctx context.Context, tenant, name string) (*record, *store.Document, error) {
	d, err := r.cfg.Store.GetDocument(ctx, Kind, tenant, name)
	if err != nil {
		return nil, nil, fmt.Errorf("template %q: %w", name, err)
	}
	var rec record
	if err := json.Unmarshal(d.Value, &rec); err != nil {
		return nil, nil, fmt.Errorf("template %q: stored record: %w", name, err)
	}
	rec.Spec.Owner = tenant
	if rec.Ready != nil {
		rec.Ready.Owner = tenant
	}
	return &rec, d, nil
}

// put writes rec over d (a create when d.Revision is 0).
func (r *Registry) put(ctx context.Context, d *store.Document, rec *record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	d.Value = b
	return r.cfg.Store.PutDocument(ctx, d)
}

// update reads the tenant's record, lets fn change it and writes it back,
// again from the read when another write came between. fn returning
// false writes nothing.
func (r *Registry) update(ctx context.Context, tenant, name string, fn func(rec *record) (bool, error)) (*record, error) {
	for {
		rec, d, err := r.get(ctx, tenant, name)
		if err != nil {
			return nil, err
		}
		ok, err := fn(rec)
		if err != nil || !ok {
			return rec, err
		}
		err = r.put(ctx, d, rec)
		if errors.Is(err, errdefs.ErrConflict) {
			continue
		}
		return rec, err
	}
}

// List returns the templates a tenant can use, by name.
func (r *Registry) List(ctx context.Context, tenant string) ([]api.Template, error) {
	var out []api.Template
	seen := map[string]bool{}
	for _, b := range template.Builtins() {
		out = append(out, r.shared(b, "builtin"))
		seen[b.Name] = true
	}
	builds, err := r.cfg.Templates.List()
	if err != nil {
		return nil, err
	}
	for _, t := range builds {
		for _, n := range t.Names {
			if seen[n] {
				continue
			}
			if spec, err := r.cfg.Templates.Named(n); err == nil {
				out = append(out, r.shared(spec, "operator"))
				seen[n] = true
			}
		}
	}
	after := ""
	for {
		docs, err := r.cfg.Store.ListDocuments(ctx, Kind, tenant, "", after, 1000)
		if err != nil {
			return nil, err
		}
		for _, d := range docs {
			var rec record
			if err := json.Unmarshal(d.Value, &rec); err != nil {
				return nil, fmt.Errorf("template %q: stored record: %w", d.Key, err)
			}
			rec.Spec.Owner = tenant
			out = append(out, r.view(r.settle(ctx, tenant, d.Key, &rec)))
		}
		if len(docs) < 1000 {
			break
		}
		after = docs[len(docs)-1].Key
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Get returns one template a tenant can use.
func (r *Registry) Get(ctx context.Context, tenant, name string) (api.Template, error) {
	if spec, ok := template.Builtin(name); ok {
		return r.shared(spec, "builtin"), nil
	}
	rec, _, err := r.get(ctx, tenant, name)
	if err == nil {
		return r.view(r.settle(ctx, tenant, name, rec)), nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return api.Template{}, err
	}
	if spec, err := r.cfg.Templates.Named(name); err == nil {
		return r.shared(spec, "operator"), nil
	}
	return api.Template{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
}

// shared is the view of a built-in or operator template.
func (r *Registry) shared(spec template.Spec, source string) api.Template {
	v := api.Template{Name: spec.Name, Source: source, Status: api.TemplateNotBuilt, Runtime: runtimeName(spec.Runtime), Release: release(spec)}
	v.Hash = spec.HashWithShift(r.cfg.Templates.UIDShift)
	if t, ok := r.cfg.Templates.Lookup(spec); ok {
		v.Status, v.Hash, v.SizeBytes = api.TemplateReady, t.Hash, t.SizeBytes
		v.BuiltAt = timePtr(t.BuiltAt)
	}
	return v
}

// view is the API's view of a tenant's record.
func (r *Registry) view(rec *record) api.Template {
	v := api.Template{
		Name: rec.Spec.Name, Source: "tenant", Status: rec.Build.Status, Hash: rec.Build.Hash,
		Runtime: runtimeName(rec.Spec.Runtime), Release: release(rec.Spec), LastError: rec.Build.Error,
		Versions: rec.Versions,
	}
	b := rec.Build.TemplateBuild
	v.Build = &b
	for _, ver := range rec.Versions {
		if ver.Hash == rec.Build.Hash {
			v.SizeBytes, v.BuiltAt = ver.SizeBytes, timePtr(ver.BuiltAt)
			break
		}
	}
	return v
}

// settle fails a build that no live process runs any more (its server
// stopped during it), so that it does not show as building for ever.
func (r *Registry) settle(ctx context.Context, tenant, name string, rec *record) *record {
	if !rec.Build.running() || r.local(rec.Build.BuildID) != nil {
		return rec
	}
	// This process's builds are all in r.jobs from before their records
	// are written; another replica's is dead when that replica is, and
	// without Alive only this process uses the store.
	if rec.Build.Replica != r.cfg.Replica && r.cfg.Alive != nil {
		if alive, err := r.cfg.Alive(ctx, rec.Build.Replica); err != nil || alive {
			return rec
		}
	}
	id := rec.Build.BuildID
	got, err := r.update(ctx, tenant, name, func(rec *record) (bool, error) {
		if rec.Build.BuildID != id || !rec.Build.running() {
			return false, nil
		}
		r.finish(rec, api.TemplateFailed, "the server running the build stopped before it ended; post the spec again", nil)
		return true, nil
	})
	if err != nil {
		r.log.Warn("failing an abandoned template build", "tenant", tenant, "template", name, "err", err)
		return rec
	}
	return got
}

// finish records the end of rec's build.
func (r *Registry) finish(rec *record, status, msg string, t *template.Template) {
	now := time.Now().UTC()
	rec.Build.Status, rec.Build.Error, rec.Build.FinishedAt = status, msg, &now
	rec.Build.CancelRequested = false
	if t == nil {
		return
	}
	rec.Build.SizeBytes = t.SizeBytes
	ready := rec.Spec
	rec.Ready = &ready
	rec.Versions = slices.DeleteFunc(rec.Versions, func(v api.TemplateVersion) bool { return v.Hash == t.Hash })
	rec.Versions = append([]api.TemplateVersion{{Hash: t.Hash, BuildID: rec.Build.BuildID, SizeBytes: t.SizeBytes, BuiltAt: t.BuiltAt.UTC()}}, rec.Versions...)
	if len(rec.Versions) > maxVersions {
		rec.Versions = rec.Versions[:maxVersions]
	}
}

// Submit defines (or redefines) a tenant's template by spec and builds
// it. queued says whether a build was started; otherwise the spec was
// built already and the template is ready at once.
func (r *Registry) Submit(ctx context.Context, tenant string, spec template.Spec) (api.Template, bool, error) {
	if err := spec.Validate(); err != nil {
		return api.Template{}, false, err
	}
	if _, ok := template.Builtin(spec.Name); ok {
		return api.Template{}, false, fmt.Errorf("template %q is a built-in: choose another name: %w", spec.Name, errdefs.ErrAlreadyExists)
	}
	if err := r.checkResources(spec); err != nil {
		return api.Template{}, false, err
	}
	if _, err := r.cfg.Templates.Named(spec.Name); err == nil {
		return api.Template{}, false, fmt.Errorf("template %q is the server's: choose another name: %w", spec.Name, errdefs.ErrAlreadyExists)
	}
	spec.Owner = tenant
	hash := spec.HashWithShift(r.cfg.Templates.UIDShift)
	for {
		var d *store.Document
		rec, _, err := r.get(ctx, tenant, spec.Name)
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			if err := r.checkCount(ctx, tenant); err != nil {
				return api.Template{}, false, err
			}
			rec, d = &record{}, &store.Document{Kind: Kind, Tenant: tenant, Key: spec.Name}
		case err != nil:
			return api.Template{}, false, err
		default:
			rec = r.settle(ctx, tenant, spec.Name, rec)
			if rec.Build.Hash == hash && (rec.Build.running() || rec.Build.Status == api.TemplateReady) && reflect.DeepEqual(rec.Spec, spec) {
				return r.view(rec), rec.Build.running(), nil // posted again: nothing to do
			}
			// Re-read: settle may have written.
			if rec, d, err = r.get(ctx, tenant, spec.Name); err != nil {
				return api.Template{}, false, err
			}
		}
		previous := rec.Build
		now := time.Now().UTC()
		rec.Spec = spec
		rec.Build = build{TemplateBuild: api.TemplateBuild{BuildID: newID(), Hash: hash, Status: api.TemplateQueued, QueuedAt: now}, Replica: r.cfg.Replica}
		t, built := r.cfg.Templates.Lookup(spec)
		if built {
			rec.Build.StartedAt = &now
			r.finish(rec, api.TemplateReady, "", t)
		} else if err := r.checkDisk(ctx, tenant, spec.Name); err != nil {
			return api.Template{}, false, err
		}
		var j *job
		if !built {
			j = r.newJob(tenant, spec, rec.Build.BuildID)
		}
		err = r.put(ctx, d, rec)
		if err != nil {
			r.drop(j)
			if errors.Is(err, errdefs.ErrConflict) || errors.Is(err, errdefs.ErrAlreadyExists) {
				continue // another post came between: decide again
			}
			return api.Template{}, false, err
		}
		if previous.running() {
			r.cancelLocal(previous.BuildID, errSuperseded)
		}
		if j != nil {
			r.start(j)
		} else {
			r.prune(ctx, tenant, spec.Name)
		}
		return r.view(rec), !built, nil
	}
}

var (
	errSuperseded = errors.New("a newer spec was posted")
	errCancelled  = errors.New("cancelled")
	errDeleted    = errors.New("the template was deleted")
)

// checkCount refuses a tenant's template past MaxTemplates.
func (r *Registry) checkCount(ctx context.Context, tenant string) error {
	docs, err := r.cfg.Store.ListDocuments(ctx, Kind, tenant, "", "", r.cfg.MaxTemplates)
	if err != nil {
		return err
	}
	if len(docs) >= r.cfg.MaxTemplates {
		return fmt.Errorf("the tenant has %d templates, the most it may have: delete one first: %w", len(docs), errdefs.ErrResourceExhausted)
	}
	return nil
}

// Cancel cancels a tenant's build in progress. Nothing of it is left.
func (r *Registry) Cancel(ctx context.Context, tenant, name, buildID string) (api.Template, error) {
	rec, err := r.update(ctx, tenant, name, func(rec *record) (bool, error) {
		if rec.Build.BuildID != buildID {
			if slices.ContainsFunc(rec.Versions, func(v api.TemplateVersion) bool { return v.BuildID == buildID }) {
				return false, fmt.Errorf("template %q: build %s has ended: %w", name, buildID, errdefs.ErrFailedPrecondition)
			}
			return false, fmt.Errorf("template %q: build %s: %w", name, buildID, errdefs.ErrNotFound)
		}
		if !rec.Build.running() {
			return false, fmt.Errorf("template %q: build %s has ended (%s): %w", name, buildID, rec.Build.Status, errdefs.ErrFailedPrecondition)
		}
		rec.Build.CancelRequested = true
		return true, nil
	})
	if err != nil {
		return api.Template{}, err
	}
	r.cancelLocal(buildID, errCancelled)
	return r.view(rec), nil
}

// Delete deletes a tenant's template. Sessions of the tenant that use it
// and have not ended refuse the delete unless force, and with force keep
// the build they run on this server until they end.
func (r *Registry) Delete(ctx context.Context, tenant, name string, force bool) error {
	if _, ok := template.Builtin(name); ok {
		return fmt.Errorf("template %q is a built-in: %w", name, errdefs.ErrFailedPrecondition)
	}
	rec, d, err := r.get(ctx, tenant, name)
	if err != nil {
		if _, nerr := r.cfg.Templates.Named(name); errors.Is(err, errdefs.ErrNotFound) && nerr == nil {
			return fmt.Errorf("template %q is the server's (sbx template rm): %w", name, errdefs.ErrFailedPrecondition)
		}
		return err
	}
	pinned, used, err := r.sessionBuilds(ctx, tenant, name)
	if err != nil {
		return err
	}
	if used && !force {
		return fmt.Errorf("template %q: sessions use it; end them first, or delete with force=true: %w", name, errdefs.ErrConflict)
	}
	if err := r.cfg.Store.DeleteDocument(ctx, Kind, tenant, name, d.Revision); err != nil {
		return err
	}
	if rec.Build.running() {
		r.cancelLocal(rec.Build.BuildID, errDeleted)
	}
	// The builds are the tenant's (Spec.Owner): none of them serves
	// another template of another tenant. One of its other templates may
	// have the same rootfs, and sessions may still run on them.
	keep := pinned
	others, err := r.cfg.Store.ListDocuments(ctx, Kind, tenant, "", "", 1000)
	if err != nil {
		return nil // deleted; the builds stay, which is safe
	}
	for _, o := range others {
		var orec record
		if json.Unmarshal(o.Value, &orec) == nil {
			keep[orec.Build.Hash] = true
			for _, v := range orec.Versions {
				keep[v.Hash] = true
			}
		}
	}
	for _, v := range rec.Versions {
		if keep[v.Hash] {
			continue
		}
		if err := r.cfg.Templates.Remove(ctx, v.Hash); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			r.log.Warn("removing a deleted template's build", "tenant", tenant, "template", name, "hash", v.Hash, "err", err)
		}
		os.Remove(r.logPath(v.BuildID))
	}
	os.Remove(r.logPath(rec.Build.BuildID))
	return nil
}

func (r *Registry) local(id string) *job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.jobs[id]
}

func (r *Registry) cancelLocal(id string, cause error) {
	if j := r.local(id); j != nil {
		j.cancel(cause)
	}
}

func (r *Registry) logPath(buildID string) string {
	return filepath.Join(r.cfg.LogDir, buildID+".log")
}

func newID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "bld_" + hex.EncodeToString(b)
}

func runtimeName(rt string) string {
	if rt == "" {
		return "runc"
	}
	return rt
}

func release(spec template.Spec) string {
	if spec.Release == "" {
		return template.DefaultRelease
	}
	return spec.Release
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// Limits on a tenant's template's default resources that no server
// setting lifts: processes and /tmp bound what a sandbox can take of the
// host beyond its memory and CPU (a fork bomb's reach, kernel memory).
const (
	MaxPIDs  = 4096
	MaxTmpMB = 4096
)

// checkResources refuses a tenant's spec whose defaults a session could
// not ask for: operator templates are trusted, tenants' are not.
func (r *Registry) checkResources(spec template.Spec) error {
	res, caps := spec.Resources, r.cfg.MaxResources
	bad := func(what string, got, max any) error {
		return fmt.Errorf("template %q: resources.%s %v is more than a template may have (%v): %w", spec.Name, what, got, max, errdefs.ErrInvalidArgument)
	}
	switch {
	case res.PIDs > MaxPIDs:
		return bad("pids", res.PIDs, MaxPIDs)
	case res.TmpMB > MaxTmpMB:
		return bad("tmp_mb", res.TmpMB, MaxTmpMB)
	case caps.CPU > 0 && res.CPU > caps.CPU:
		return bad("cpu", res.CPU, caps.CPU)
	case caps.Memory > 0 && res.MemoryMB > caps.Memory:
		return bad("memory_mb", res.MemoryMB, caps.Memory)
	case caps.Disk > 0 && res.DiskMB > caps.Disk:
		return bad("disk_mb", res.DiskMB, caps.Disk)
	}
	return nil
}
