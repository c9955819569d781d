// Package template describes sandbox templates and builds their root
// filesystems. A template is a Debian release plus packages, files and
// defaults; a build is content-addressed by the hash of its spec, so two
// specs that say the same thing share one rootfs.
package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// Spec is what a template is made of. It is the unit users write (JSON) and
// the input of the content hash.
type Spec struct {
	// Name is how users refer to the template: [a-z0-9-], at most 63 chars.
	Name string `json:"name"`
	// Release is the Debian release to debootstrap. Default: bookworm.
	Release string `json:"release,omitempty"`
	// Packages are Debian packages installed with --no-install-recommends.
	// python3 is always added: the executor's zygote needs it.
	Packages []string `json:"packages,omitempty"`
	// Stubs are packages that other packages depend on but that the
	// template leaves out: an empty placeholder package that Provides them
	// is installed first. Only for dependencies needed to build things, not
	// to run them (python3-scipy's dependency on the pythran compiler, which
	// drags in g++ and the boost headers, is the case this exists for).
	Stubs []string `json:"stubs,omitempty"`
	// Env is set for every execution in sandboxes of this template.
	Env map[string]string `json:"env,omitempty"`
	// Files are written into the rootfs (absolute path -> content), owned
	// by root, mode 0644, or 0755 when the content starts with "#!".
	Files map[string]string `json:"files,omitempty"`
	// Resources are the default limits of this template's sandboxes.
	Resources runtime.Resources `json:"resources,omitempty"`
	// Timeout is the default execution timeout. Default: 30s.
	Timeout Duration `json:"timeout,omitempty"`
	// Runtime is the OCI runtime binary: runc (default), crun or runsc.
	Runtime string `json:"runtime,omitempty"`
	// Preload lists Python modules the zygote imports before the first
	// execution.
	Preload []string `json:"preload,omitempty"`

	// Owner is the tenant a template defined over the API belongs to, ""
	// for built-ins and the operator's (sbx template build). It is part
	// of the hash, so that tenants never share a build: a build that is
	// already there answers at once, and that would tell one tenant what
	// another has built. It is not part of the JSON users write.
	Owner string `json:"-"`
}

// Duration is a time.Duration that reads and writes JSON as "30s".
type Duration time.Duration

// MarshalText writes d as time.Duration.String does ("1m30s").
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads what time.ParseDuration reads ("90s", "1m30s").
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

const (
	// DefaultRelease is the Debian release of a spec that names none.
	DefaultRelease = "bookworm"
	// DefaultUIDShift is the host uid (and gid) that container uid 0 maps
	// to; template files are owned by uid+shift so that they look right
	// from inside the sandboxes' user namespace.
	DefaultUIDShift uint32 = 100000

	// BuilderVersion goes into every hash. Change it whenever the build
	// recipe changes what ends up in a rootfs, so that old builds are not
	// mistaken for new ones.
	BuilderVersion = "sbx-template-builder/3"

	// Limits on what a spec may ask for: specs come from API users, and a
	// spec is kept whole in memory, on disk and in every hash.
	maxPackages   = 500
	maxFiles      = 256
	maxFilesBytes = 16 << 20
	maxEnv        = 256
	maxEnvBytes   = 1 << 20
	maxPreload    = 64
	maxPathLen    = 1024
	maxTimeout    = 24 * time.Hour
)

// releases are the Debian releases a template may be built from.
var releases = []string{"bookworm", "trixie"}

// runtimes are the OCI runtimes a template may ask for ("" is the default).
var runtimes = []string{"", "runc", "crun", "runsc"}

// reservedDirs are mounted over by the runtime (or are kernel filesystems):
// a file written there would be hidden at run time, or worse.
var reservedDirs = []string{"/proc", "/sys", "/dev", "/workspace", "/run/sbx", "/opt/sbx", "/tmp"}

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	envKeyRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	moduleRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
)

// Validate reports the first thing wrong with s, wrapped in
// errdefs.ErrInvalidArgument.
func (s Spec) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("template %q: %s: %w", s.Name, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
	}
	if !nameRE.MatchString(s.Name) {
		return bad("name must match %s", nameRE)
	}
	if s.Release != "" && !slices.Contains(releases, s.Release) {
		return bad("release %q is not one of %s", s.Release, strings.Join(releases, ", "))
	}
	if len(s.Packages)+len(s.Stubs) > maxPackages {
		return bad("more than %d packages", maxPackages)
	}
	for _, p := range s.Packages {
		if !packageRE.MatchString(p) || len(p) > 128 {
			return bad("package %q is not a Debian package name", p)
		}
	}
	for _, p := range s.Stubs {
		if !packageRE.MatchString(p) || len(p) > 128 {
			return bad("stub %q is not a Debian package name", p)
		}
		if p == "python3" || slices.Contains(s.Packages, p) {
			return bad("package %q cannot be both installed and stubbed", p)
		}
	}
	if len(s.Files) > maxFiles {
		return bad("more than %d files", maxFiles)
	}
	size := 0
	for p, content := range s.Files {
		if err := checkFilePath(p); err != nil {
			return bad("file %q: %v", p, err)
		}
		size += len(content)
	}
	if size > maxFilesBytes {
		return bad("files hold more than %d bytes", maxFilesBytes)
	}
	if len(s.Env) > maxEnv {
		return bad("more than %d env variables", maxEnv)
	}
	size = 0
	for k, v := range s.Env {
		if !envKeyRE.MatchString(k) {
			return bad("env key %q must match %s", k, envKeyRE)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return bad("env %s: value holds a NUL byte", k)
		}
		size += len(k) + len(v)
	}
	if size > maxEnvBytes {
		return bad("env holds more than %d bytes", maxEnvBytes)
	}
	r := s.Resources
	if r.CPU < 0 || r.MemoryMB < 0 || r.PIDs < 0 || r.TmpMB < 0 || r.DiskMB < 0 {
		return bad("resources must not be negative")
	}
	if t := time.Duration(s.Timeout); t < 0 || t > maxTimeout {
		return bad("timeout %s is not between 0 and %s", t, maxTimeout)
	}
	if !slices.Contains(runtimes, s.Runtime) {
		return bad("runtime %q is not one of runc, crun, runsc", s.Runtime)
	}
	if len(s.Preload) > maxPreload {
		return bad("more than %d preload modules", maxPreload)
	}
	for _, m := range s.Preload {
		if !moduleRE.MatchString(m) || len(m) > 256 {
			return bad("preload %q is not a Python module name", m)
		}
	}
	return nil
}

// checkFilePath accepts absolute, clean paths outside reservedDirs.
func checkFilePath(p string) error {
	switch {
	case len(p) > maxPathLen:
		return fmt.Errorf("longer than %d bytes", maxPathLen)
	case strings.IndexByte(p, 0) >= 0 || !utf8.ValidString(p):
		return fmt.Errorf("holds a NUL byte or invalid UTF-8")
	case !path.IsAbs(p) || path.Clean(p) != p:
		return fmt.Errorf("not an absolute, clean path")
	case p == "/":
		return fmt.Errorf("is the root directory")
	}
	for _, d := range reservedDirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return fmt.Errorf("under %s, which is mounted over at run time", d)
		}
	}
	return nil
}

// release returns s.Release or the default.
func (s Spec) release() string {
	if s.Release == "" {
		return DefaultRelease
	}
	return s.Release
}

// packages returns the packages to install: sorted, without duplicates,
// python3 included.
func (s Spec) packages() []string { return sortedSet(append([]string{"python3"}, s.Packages...)) }

// stubs returns the stubbed packages, sorted, without duplicates.
func (s Spec) stubs() []string { return sortedSet(s.Stubs) }

func sortedSet(in []string) []string {
	out := slices.Clone(in)
	sort.Strings(out)
	return slices.Compact(out)
}

// hashInput is the canonical form of what determines a rootfs. Field order
// and names are part of every hash: change them only together with
// BuilderVersion.
type hashInput struct {
	Builder  string     `json:"builder"`
	Release  string     `json:"release"`
	Packages []string   `json:"packages"`
	Stubs    []string   `json:"stubs"`
	Files    [][]string `json:"files"`
	UIDShift uint32     `json:"uid_shift"`
	Owner    string     `json:"owner,omitempty"`
}

// Hash is the hex sha256 of what determines s's rootfs, for the default
// uid shift. Name, env, resources, timeout, runtime and preload are left
// out: they are applied at run time, so changing them must not rebuild.
func (s Spec) Hash() string { return s.HashWithShift(DefaultUIDShift) }

// HashWithShift is Hash for a store whose files are shifted by shift.
func (s Spec) HashWithShift(shift uint32) string {
	in := hashInput{
		Builder:  BuilderVersion,
		Release:  s.release(),
		Packages: s.packages(),
		Stubs:    s.stubs(),
		Files:    [][]string{},
		UIDShift: shift,
		Owner:    s.Owner,
	}
	for _, p := range slices.Sorted(maps.Keys(s.Files)) {
		// The content's own hash, not the content: JSON would turn invalid
		// UTF-8 into U+FFFD and so make different files hash the same.
		sum := sha256.Sum256([]byte(s.Files[p]))
		in.Files = append(in.Files, []string{p, hex.EncodeToString(sum[:])})
	}
	b, err := json.Marshal(in)
	if err != nil {
		panic(err) // strings and numbers always marshal
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ShortHash is the first 12 characters of a hash, as listings show it.
func ShortHash(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}
