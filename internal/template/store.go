package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// ErrNotBuilt marks a tenant's template that has no build to start a
// sandbox on. Such a template is built only by the registry's queue,
// within its limits, never by a sandbox's start; the error that carries
// this says why (building, failed, cancelled) and carries the errdefs
// category too.
var ErrNotBuilt = errors.New("the template is not built")

// DefaultDir is where a store keeps its templates unless told otherwise.
const DefaultDir = "/var/lib/sbx/templates"

// Store builds templates and keeps the builds. On disk, under Dir:
//
//	base/<hash>/rootfs     debootstrap base layers, one per release, mirror and builder version
//	builds/<hash>/rootfs   a template's root filesystem, owned by uid/gid + UIDShift
//	builds/<hash>/spec.json, build.json, packages.txt
//	names/<name>           {"hash", "spec"}: the build a name points at, and that name's spec
//	locks/<key>.lock       flock(2) locks, one per build or base layer
//	tmp/<key>.<pid>.<rnd>  builds in progress, renamed into base/ or builds/ when done
//
// A Store is safe for concurrent use, and several processes may share Dir.
type Store struct {
	// Dir is the store's directory. Default: DefaultDir.
	Dir string
	// Mirror is the Debian mirror URI. Default: SBX_DEBIAN_MIRROR, else
	// the host's apt configuration.
	Mirror string
	// UIDShift is the host uid (and gid) of container uid 0; 0 means
	// DefaultUIDShift. It is part of every build's hash.
	UIDShift uint32
	// Log receives one record per build. Default: discard.
	Log *slog.Logger
	// Jobs runs the build's commands, each in a container (the OCI
	// driver's RunJob). Without it the store builds nothing.
	Jobs JobRunner
	// MaxBuildBytes is the most a build's rootfs may take (its area, see
	// area.go). Default: DefaultMaxBuildBytes.
	MaxBuildBytes int64
	// MaxBuildTime is the longest a build may take. Default:
	// DefaultMaxBuildTime.
	MaxBuildTime time.Duration

	mu    sync.Mutex
	calls map[string]*call // builds in progress in this process, by hash
}

// call is one build that concurrent Ensure calls share.
type call struct {
	done chan struct{}
	t    *Template
	err  error
}

// Template is a built template.
type Template struct {
	// Spec is the spec it was asked for by (Ensure, Lookup) or, from Get
	// and List, the spec it was first built from.
	Spec Spec `json:"spec"`
	// Hash is Spec.HashWithShift(Store.UIDShift); ShortHash(Hash) is its
	// short id.
	Hash string `json:"hash"`
	// Rootfs is the root filesystem's directory.
	Rootfs string `json:"rootfs"`
	// SizeBytes is the disk space the rootfs uses.
	SizeBytes     int64         `json:"size_bytes"`
	BuiltAt       time.Time     `json:"built_at"`
	BuildDuration time.Duration `json:"build_duration"`
	// Names are the names that point at this build (List only).
	Names []string `json:"names,omitempty"`
}

// buildRecord is build.json.
type buildRecord struct {
	Hash          string        `json:"hash"`
	SizeBytes     int64         `json:"size_bytes"`
	BuiltAt       time.Time     `json:"built_at"`
	BuildDuration time.Duration `json:"build_duration_ns"`
	Builder       string        `json:"builder"`
	Mirror        string        `json:"mirror"`
	Base          string        `json:"base"`
}

// nameRecord is names/<name>.
type nameRecord struct {
	Hash string `json:"hash"`
	Spec Spec   `json:"spec"`
}

// NewStore returns a store in dir (DefaultDir if empty) with the defaults
// filled in.
func NewStore(dir string) *Store {
	if dir == "" {
		dir = DefaultDir
	}
	return &Store{
		Dir:      dir,
		Mirror:   os.Getenv("SBX_DEBIAN_MIRROR"),
		UIDShift: DefaultUIDShift,
		Log:      slog.New(slog.DiscardHandler),
	}
}

func (s *Store) dir() string {
	if s.Dir == "" {
		return DefaultDir
	}
	return s.Dir
}

func (s *Store) shift() uint32 {
	if s.UIDShift == 0 {
		return DefaultUIDShift
	}
	return s.UIDShift
}

func (s *Store) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.dir()}, elem...)...)
}

// Ensure returns the build of spec, building it first if there is none.
// Concurrent calls for one spec, in this process or in others, build it
// once and all get the result. progress receives a readable build log (it
// may be io.Discard); a build that fails or is cancelled leaves nothing
// behind. The name index is updated to point spec.Name at the build.
func (s *Store) Ensure(ctx context.Context, spec Spec, progress io.Writer) (*Template, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if b, ok := Builtin(spec.Name); ok && b.HashWithShift(s.shift()) != spec.HashWithShift(s.shift()) {
		return nil, fmt.Errorf("template %q: the name is a built-in's and the spec builds something else: %w", spec.Name, errdefs.ErrAlreadyExists)
	}
	hash := spec.HashWithShift(s.shift())
	for {
		if t, ok := s.lookup(spec, hash); ok {
			return t, s.setName(spec, hash)
		}
		c, leader := s.join(hash)
		if leader {
			return s.lead(ctx, c, spec, hash, progress)
		}
		fmt.Fprintf(orDiscard(progress), "template %s: waiting for the build in progress (%s)\n", spec.Name, ShortHash(hash))
		select {
		case <-c.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if c.err == nil {
			return s.withSpec(c.t, spec)
		}
		// A leader whose caller gave up does not fail the others: the
		// next round makes one of them the leader.
		if !errors.Is(c.err, context.Canceled) && !errors.Is(c.err, context.DeadlineExceeded) {
			return nil, c.err
		}
	}
}

// join returns the in-process call for hash, creating it (leader) if there
// is none.
func (s *Store) join(hash string) (c *call, leader bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.calls[hash]; ok {
		return c, false
	}
	if s.calls == nil {
		s.calls = map[string]*call{}
	}
	c = &call{done: make(chan struct{})}
	s.calls[hash] = c
	return c, true
}

// lead builds for every caller waiting on c, and always releases them,
// even if the build panics.
func (s *Store) lead(ctx context.Context, c *call, spec Spec, hash string, progress io.Writer) (*Template, error) {
	defer func() {
		if r := recover(); r != nil {
			c.err = fmt.Errorf("template %s: build panicked: %v", spec.Name, r)
			s.finish(hash, c)
			panic(r)
		}
		s.finish(hash, c)
	}()
	c.t, c.err = s.buildOnce(ctx, spec, hash, progress)
	if c.err != nil {
		return nil, c.err
	}
	return c.t, s.setName(spec, hash)
}

func (s *Store) finish(hash string, c *call) {
	s.mu.Lock()
	delete(s.calls, hash)
	s.mu.Unlock()
	close(c.done)
}

// buildOnce builds spec under the build's lock, unless another process
// built it while we waited for the lock.
func (s *Store) buildOnce(ctx context.Context, spec Spec, hash string, progress io.Writer) (*Template, error) {
	if err := s.mkdirs("base", "builds", "names", "locks", "tmp"); err != nil {
		return nil, err
	}
	lockPath := s.path("locks", hash+".lock")
	lock, ok, err := tryLockFile(lockPath)
	if err == nil && !ok {
		fmt.Fprintf(orDiscard(progress), "template %s: another process is building it (%s); waiting\n", spec.Name, ShortHash(hash))
		lock, err = lockFile(ctx, lockPath)
	}
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	defer unlockFile(lock)
	if t, ok := s.lookup(spec, hash); ok {
		return t, nil
	}
	if err := removeStale(s.path("tmp"), hash); err != nil {
		return nil, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	if err := sweepTmp(s.path("tmp"), s.path("locks")); err != nil {
		s.log().Warn("removing what failed builds left", "err", err)
	}
	start := time.Now()
	s.log().Info("building template", "name", spec.Name, "hash", hash)
	t, err := s.build(ctx, spec, hash, newProgress(progress, buildSteps))
	if err != nil {
		s.log().Warn("template build failed", "name", spec.Name, "hash", hash, "err", err)
		return nil, fmt.Errorf("template %s: %w", spec.Name, err)
	}
	s.log().Info("built template", "name", spec.Name, "hash", hash, "size", t.SizeBytes, "duration", time.Since(start))
	return t, nil
}

// Lookup returns the build of spec if there is one. It never builds.
func (s *Store) Lookup(spec Spec) (*Template, bool) {
	return s.lookup(spec, spec.HashWithShift(s.shift()))
}

func (s *Store) lookup(spec Spec, hash string) (*Template, bool) {
	t, err := s.Get(hash)
	if err != nil || t.Hash != hash {
		return nil, false
	}
	t.Spec = spec
	return t, true
}

// withSpec returns a copy of t as seen by the caller that asked for spec.
func (s *Store) withSpec(t *Template, spec Spec) (*Template, error) {
	c := *t
	c.Spec = spec
	return &c, s.setName(spec, t.Hash)
}

// Get returns the build with the given hash, or the only build whose hash
// starts with it (at least 4 characters); errdefs.ErrNotFound if none.
func (s *Store) Get(hash string) (*Template, error) {
	full, err := s.resolveHash(hash)
	if err != nil {
		return nil, err
	}
	dir := s.path("builds", full)
	var rec buildRecord
	if err := readJSON(filepath.Join(dir, "build.json"), &rec); err != nil {
		return nil, err
	}
	var spec Spec
	if err := readJSON(filepath.Join(dir, "spec.json"), &spec); err != nil {
		return nil, err
	}
	return &Template{
		Spec: spec, Hash: full, Rootfs: filepath.Join(dir, "rootfs"),
		SizeBytes: rec.SizeBytes, BuiltAt: rec.BuiltAt, BuildDuration: rec.BuildDuration,
	}, nil
}

func (s *Store) resolveHash(hash string) (string, error) {
	notFound := fmt.Errorf("template build %q: %w", hash, errdefs.ErrNotFound)
	if len(hash) < 4 || strings.ContainsAny(hash, "/.") {
		return "", notFound
	}
	if len(hash) == 64 {
		if _, err := os.Stat(s.path("builds", hash)); err != nil {
			return "", notFound
		}
		return hash, nil
	}
	entries, err := os.ReadDir(s.path("builds"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var found []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), hash) {
			found = append(found, e.Name())
		}
	}
	switch len(found) {
	case 0:
		return "", notFound
	case 1:
		return found[0], nil
	default:
		return "", fmt.Errorf("template build %q is ambiguous (%d builds): %w", hash, len(found), errdefs.ErrInvalidArgument)
	}
}

// Named returns the spec called name: a built-in's, or the spec last
// built under that name. errdefs.ErrNotFound if there is neither.
func (s *Store) Named(name string) (Spec, error) {
	if spec, ok := Builtin(name); ok {
		return spec, nil
	}
	rec, err := s.readName(name)
	if err != nil {
		return Spec{}, err
	}
	return rec.Spec, nil
}

func (s *Store) readName(name string) (*nameRecord, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	var rec nameRecord
	if err := readJSON(s.path("names", name), &rec); err != nil {
		return nil, fmt.Errorf("template %q: %w", name, err)
	}
	return &rec, nil
}

// setName points spec.Name at hash, unless it already does so with the
// same spec.
func (s *Store) setName(spec Spec, hash string) error {
	if spec.Owner != "" {
		return nil // a tenant's names are its own: the registry's, not the store's
	}
	want, err := json.Marshal(nameRecord{Hash: hash, Spec: spec})
	if err != nil {
		return err
	}
	if have, err := os.ReadFile(s.path("names", spec.Name)); err == nil && string(have) == string(want) {
		return nil
	}
	if err := s.mkdirs("names"); err != nil {
		return err
	}
	return writeFileAtomic(s.path("names", spec.Name), want, 0o600)
}

// List returns every build, with the names that point at it, ordered by
// name (unnamed builds last, newest first).
func (s *Store) List() ([]Template, error) {
	entries, err := os.ReadDir(s.path("builds"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	names, err := s.names()
	if err != nil {
		return nil, err
	}
	var out []Template
	for _, e := range entries {
		t, err := s.Get(e.Name())
		if err != nil {
			continue // being removed, or not a build
		}
		t.Names = names[t.Hash]
		out = append(out, *t)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (len(a.Names) == 0) != (len(b.Names) == 0) {
			return len(a.Names) > 0
		}
		if len(a.Names) > 0 && a.Names[0] != b.Names[0] {
			return a.Names[0] < b.Names[0]
		}
		return a.BuiltAt.After(b.BuiltAt)
	})
	return out, nil
}

// names maps each hash to the sorted names that point at it.
func (s *Store) names() (map[string][]string, error) {
	entries, err := os.ReadDir(s.path("names"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	out := map[string][]string{}
	for _, e := range entries {
		rec, err := s.readName(e.Name())
		if err != nil {
			continue // a temporary file of writeFileAtomic
		}
		out[rec.Hash] = append(out[rec.Hash], e.Name())
	}
	for _, v := range out {
		slices.Sort(v)
	}
	return out, nil
}

// Remove deletes a build (by hash or unique hash prefix) and the names
// that point at it. The caller must know that no sandbox uses it: a
// sandbox's rootfs is this directory, and would lose its files.
func (s *Store) Remove(ctx context.Context, hash string) error {
	full, err := s.resolveHash(hash)
	if err != nil {
		return err
	}
	if err := s.mkdirs("locks", "tmp"); err != nil {
		return err
	}
	lock, err := lockFile(ctx, s.path("locks", full+".lock"))
	if err != nil {
		return err
	}
	defer unlockFile(lock)
	names, err := s.names()
	if err != nil {
		return err
	}
	for _, n := range names[full] {
		if err := os.Remove(s.path("names", n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	// Renamed out of builds/ first, so that nobody finds a half-removed
	// build; if we die while removing, the sweep finishes the job.
	tmp := s.path("tmp", tmpName(full))
	if err := os.Rename(s.path("builds", full), tmp); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("template build %q: %w", hash, errdefs.ErrNotFound)
		}
		return err
	}
	return removeTree(tmp)
}

// mkdirs makes the store's directory and the named ones in it, all for
// root's eyes only: specs hold tenants' env values, and nobody but sbx has
// any business in a rootfs on the host (sandboxes reach theirs through
// mounts the host makes). The store's own directory is made 0700 even if
// it was there before.
func (s *Store) mkdirs(names ...string) error {
	if err := os.MkdirAll(s.dir(), 0o700); err != nil {
		return err
	}
	if err := os.Chmod(s.dir(), 0o700); err != nil {
		return err
	}
	for _, d := range names {
		if err := os.MkdirAll(s.path(d), 0o700); err != nil {
			return err
		}
	}
	return nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: %w", path, errdefs.ErrNotFound)
		}
		return err
	}
	return json.Unmarshal(b, v)
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
