package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

const buildSteps = 5

// dpkgExcludes keeps documentation, manuals and translations out of every
// package installed into a template: nobody reads them in a sandbox, and
// they are a tenth of a rootfs. Copyright files stay (licences ask for
// them), and so do English messages.
const dpkgExcludes = `# Written by the sbx template builder: no documentation in sandboxes.
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/lintian/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
path-include=/usr/share/locale/en*
`

// cleanScript removes what a rootfs does not need at run time: apt's
// package lists and caches (the sandbox has no network to use them), logs,
// and what debootstrap installed before dpkgExcludes existed. debconf's
// cache stays: it is dpkg's record of configuration answers.
const cleanScript = `set -e
apt-get clean
rm -rf /var/lib/apt/lists/*
find /var/cache -mindepth 1 -maxdepth 1 ! -name debconf -exec rm -rf {} +
find /var/log -mindepth 1 ! -type d -delete
find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
rm -rf /usr/share/man/* /usr/share/info/* /usr/share/lintian/*
find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'en*' ! -name locale.alias -exec rm -rf {} +
rm -f /etc/hostname /etc/resolv.conf /usr/sbin/policy-rc.d
`

// configureScript gives every template what the sandboxes expect: the
// unprivileged user code runs as, and the mount points (a read-only root
// cannot create them at run time). /home/user is the workspace by another
// name, where code written for E2B sandboxes keeps its files.
const configureScript = `set -e
groupadd --gid 1000 user
useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home --shell /bin/bash user
mkdir -p /workspace /tmp /run/sbx /opt/sbx /proc /sys /dev /home
chmod 1777 /tmp
chmod 0755 /workspace /run/sbx /opt/sbx
ln -sfn /workspace /home/user
`

// stubScript builds and installs a placeholder package from the control
// file on standard input (see Spec.Stubs).
const stubScript = `set -e
d=$(mktemp -d /tmp/sbx-stub.XXXXXX)
mkdir "$d/DEBIAN"
cat > "$d/DEBIAN/control"
dpkg-deb --root-owner-group --build "$d" "$d.deb"
dpkg -i "$d.deb"
rm -rf "$d" "$d.deb"
`

// policyRCD stops maintainer scripts from starting services in the build.
const policyRCD = "#!/bin/sh\nexit 101\n"

// aptGet runs apt-get without a terminal or prompts; conffile questions
// take the default answer. Its package lists are kept as downloaded,
// compressed, and without translations, and its binary caches are built in
// memory only: bookworm's lists unpacked and the two caches take some 100
// MB of the build's area (and as many writes) for nothing the rootfs keeps.
var aptGet = []string{
	"apt-get", "-o", "Dpkg::Use-Pty=0", "-o", "Acquire::Retries=3", "-o", "Acquire::http::Timeout=30", "-o", "Acquire::https::Timeout=30",
	"-o", "Acquire::GzipIndexes=true", "-o", "Acquire::Languages=none", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
	"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold",
}

// build makes the rootfs of spec and renames it into builds/<hash>. The
// caller holds the build's lock. Every command runs in a job of the box
// (exec.go); the rootfs grows in a tmpfs of at most Store.MaxBuildBytes,
// so a build stops at its limit, not after, and what the host writes into
// it (apt's sources, the spec's files) it writes through os.Root, executing
// nothing of the rootfs. On any failure, cancellation or panic the
// temporary directory is removed.
func (s *Store) build(ctx context.Context, spec Spec, hash string, p *progress) (_ *Template, err error) {
	start := time.Now()
	ctx, cancel := context.WithTimeoutCause(ctx, s.maxBuildTime(), fmt.Errorf("the build took longer than %s, the most a build may take: %w", s.maxBuildTime(), errdefs.ErrResourceExhausted))
	defer cancel()
	release := spec.release()
	mirror, sources, err := s.aptConfig(release)
	if err != nil {
		return nil, err
	}
	bx, err := newBox(s.Jobs, p, append([]string{mirror}, sourceURIs(sources)...), s.jobMemoryMB())
	if err != nil {
		return nil, err
	}
	defer bx.close()
	base, err := s.ensureBase(ctx, bx, release, mirror)
	if err != nil {
		return nil, err
	}

	done := p.step(2, "copy the base layer")
	tmp := s.path("tmp", tmpName(hash))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, err
	}
	committed := false
	defer func() {
		if !committed {
			if rerr := removeTree(tmp); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	area, err := s.makeArea(tmp)
	if err != nil {
		return nil, err
	}
	rootfs := filepath.Join(area, "rootfs")
	if err := copyTree(ctx, filepath.Join(base, "rootfs"), rootfs); err != nil {
		return nil, s.areaError(area, "copy the base layer", err)
	}
	done()

	pkgs := spec.packages()
	done = p.step(3, "apt-get install %d packages: %s", len(pkgs), strings.Join(pkgs, " "))
	if err := s.install(ctx, bx, rootfs, sources, spec); err != nil {
		return nil, s.areaError(area, "install", err)
	}
	done()

	done = p.step(4, "configure: user 1000, mount points, %d files, clean up", len(spec.Files))
	if err := bx.inRoot(ctx, "configure", rootfs, nil, "/bin/sh", "-c", configureScript); err != nil {
		return nil, s.areaError(area, "configure", err)
	}
	installed, err := bx.inRootOutput(ctx, "list packages", rootfs, "dpkg-query", "-W", "-f", "${Package} ${Version}\n")
	if err != nil {
		return nil, err
	}
	if err := bx.inRoot(ctx, "clean up", rootfs, nil, "/bin/sh", "-c", cleanScript); err != nil {
		return nil, err
	}
	// The spec's files last, so that cleaning up cannot remove them (a
	// template may well want its own /etc/resolv.conf), and from here: no
	// command of the rootfs runs after them, or with them.
	for _, path := range slices.Sorted(maps.Keys(spec.Files)) {
		content, mode := spec.Files[path], os.FileMode(0o644)
		if strings.HasPrefix(content, "#!") {
			mode = 0o755
		}
		if err := s.writeInRoot(rootfs, path, []byte(content), mode); err != nil {
			return nil, s.areaError(area, "write "+path, err)
		}
	}
	done()

	done = p.step(5, "check ownership, drop setuid bits and file capabilities, commit")
	size, err := finishTree(ctx, rootfs, s.shift())
	if err != nil {
		return nil, err
	}
	if err := copyTree(ctx, rootfs, filepath.Join(tmp, "rootfs")); err != nil {
		return nil, err
	}
	if err := removeArea(tmp); err != nil {
		return nil, err
	}
	t := &Template{
		Spec: spec, Hash: hash, Rootfs: s.path("builds", hash, "rootfs"),
		SizeBytes: size, BuiltAt: time.Now().UTC(), BuildDuration: time.Since(start),
	}
	rec := buildRecord{
		Hash: hash, SizeBytes: size, BuiltAt: t.BuiltAt, BuildDuration: t.BuildDuration,
		Builder: BuilderVersion, Mirror: mirror, Base: filepath.Base(base),
	}
	// spec.json holds the tenant's env values: for root's eyes only.
	if err := writeJSON(filepath.Join(tmp, "spec.json"), spec); err != nil {
		return nil, err
	}
	if err := writeJSON(filepath.Join(tmp, "build.json"), rec); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "packages.txt"), []byte(installed), 0o600); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, s.path("builds", hash)); err != nil {
		return nil, err
	}
	committed = true
	done()
	p.printf("template %s: built %s, %d MB, in %s\n", spec.Name, ShortHash(hash), size>>20, t.BuildDuration.Round(time.Second))
	return t, nil
}

// install points apt at sources, installs stubs, then the packages, and
// applies pending updates to what the base layer has.
func (s *Store) install(ctx context.Context, bx *box, rootfs, sources string, spec Spec) error {
	for _, f := range []struct {
		path string
		data string
		perm os.FileMode
	}{
		{"/etc/apt/sources.list", sources, 0o644},
		{"/usr/sbin/policy-rc.d", policyRCD, 0o755},
	} {
		if err := s.writeInRoot(rootfs, f.path, []byte(f.data), f.perm); err != nil {
			return err
		}
	}
	if err := bx.inRoot(ctx, "apt-get update", rootfs, nil, append(aptGet, "update")...); err != nil {
		return err
	}
	if stubs := spec.stubs(); len(stubs) > 0 {
		control, err := stubControl(ctx, bx, rootfs, stubs)
		if err != nil {
			return err
		}
		if err := bx.inRoot(ctx, "install stubs "+strings.Join(stubs, " "), rootfs, strings.NewReader(control), "/bin/sh", "-c", stubScript); err != nil {
			return err
		}
	}
	args := append(slices.Clone(aptGet), "install", "-y", "--no-install-recommends")
	if err := bx.inRoot(ctx, "apt-get install "+strings.Join(spec.packages(), " "), rootfs, nil, append(args, spec.packages()...)...); err != nil {
		return err
	}
	return bx.inRoot(ctx, "apt-get upgrade", rootfs, nil, append(aptGet, "upgrade", "-y", "--no-install-recommends")...)
}

// stubControl writes the control file of one placeholder package that
// Provides every stubbed package at its candidate version (so that
// versioned dependencies are met too) and Conflicts with the real ones (so
// that apt can never install them beside it).
func stubControl(ctx context.Context, bx *box, rootfs string, stubs []string) (string, error) {
	var provides []string
	for _, pkg := range stubs {
		out, err := bx.inRootOutput(ctx, "apt-cache show "+pkg, rootfs, "apt-cache", "show", "--no-all-versions", pkg)
		if err != nil {
			return "", fmt.Errorf("stub %s: %w", pkg, err)
		}
		version := ""
		for _, line := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(line, "Version: "); ok {
				version = strings.TrimSpace(v)
				break
			}
		}
		if version == "" {
			return "", fmt.Errorf("stub %s: the archive has no such package", pkg)
		}
		provides = append(provides, fmt.Sprintf("%s (= %s)", pkg, version))
	}
	return fmt.Sprintf(`Package: sbx-template-stubs
Version: 1
Architecture: all
Maintainer: sbx template builder <root@localhost>
Priority: optional
Section: misc
Provides: %s
Conflicts: %s
Description: placeholders for packages an sbx template leaves out
 Satisfies dependencies on: %s.
 These are needed only to build software, never to run it.
`, strings.Join(provides, ", "), strings.Join(stubs, ", "), strings.Join(stubs, ", ")), nil
}

// aptConfig returns the mirror to debootstrap from and the sources.list to
// install packages from.
func (s *Store) aptConfig(release string) (mirror, sources string, err error) {
	if s.Mirror != "" {
		return s.Mirror, chrootSources(nil, release, s.Mirror, true), nil
	}
	srcs, err := readAptSources("/")
	if err != nil {
		return "", "", err
	}
	if mirror, err = mirrorFor(srcs, release); err != nil {
		return "", "", err
	}
	return mirror, chrootSources(srcs, release, mirror, false), nil
}

// ensureBase returns the directory of the debootstrap base layer for
// release from mirror (step 1), making it if needed. Base layers are
// shared by every template of a release and built once, under their own
// lock, like builds. debootstrap runs in two jobs: the first stage
// (download, check, unpack) with the host's /usr, read-only, as its tools
// and the new rootfs at /target; the second (the base packages' maintainer
// scripts) as root of the new rootfs.
func (s *Store) ensureBase(ctx context.Context, bx *box, release, mirror string) (string, error) {
	sum := sha256.Sum256([]byte(BuilderVersion + "\x00" + release + "\x00" + mirror))
	key := "base-" + hex.EncodeToString(sum[:])
	dir := s.path("base", key)
	if _, err := os.Stat(filepath.Join(dir, "base.json")); err == nil {
		bx.progress.step(1, "debootstrap %s: base layer cached (%s)", release, key[:17])
		return dir, nil
	}
	done := bx.progress.step(1, "debootstrap %s (base layer, cached after first build)", release)
	lock, err := lockFile(ctx, s.path("locks", key+".lock"))
	if err != nil {
		return "", err
	}
	defer unlockFile(lock)
	if _, err := os.Stat(filepath.Join(dir, "base.json")); err == nil {
		done()
		return dir, nil // another process made it while we waited
	}
	if err := removeStale(s.path("tmp"), key); err != nil {
		return "", err
	}
	tmp := s.path("tmp", tmpName(key))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", err
	}
	committed := false
	defer func() {
		if !committed {
			removeTree(tmp)
		}
	}()
	area, err := s.makeArea(tmp)
	if err != nil {
		return "", err
	}
	rootfs := filepath.Join(area, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return "", err
	}
	if err := os.Chown(rootfs, int(s.shift()), int(s.shift())); err != nil {
		return "", err
	}
	tools, binds, err := makeTools(filepath.Join(tmp, "tools"))
	if err != nil {
		return "", err
	}
	job := bx.job(tools, nil, nil, "debootstrap", "--foreign", "--variant=minbase", "--arch="+debianArch(), release, "/target", mirror)
	job.ReadOnlyRoot = true
	job.Binds = append(binds, runtime.Bind{Source: rootfs, Dest: "/target", Storage: true})
	// "lxc" tells debootstrap that it may not make device nodes (no job
	// may), so it leaves /dev to the runtime, which mounts its own.
	job.Env = append(slices.Clone(job.Env), "container=lxc")
	if err := bx.exec(ctx, "debootstrap (first stage)", job); err != nil {
		return "", s.areaError(area, "debootstrap", err)
	}
	if err := s.writeInRoot(rootfs, "/etc/dpkg/dpkg.cfg.d/sbx-nodoc", []byte(dpkgExcludes), 0o644); err != nil {
		return "", err
	}
	job = bx.job(rootfs, nil, nil, "/debootstrap/debootstrap", "--second-stage")
	job.Env = append(slices.Clone(job.Env), "container=lxc")
	if err := bx.exec(ctx, "debootstrap (second stage)", job); err != nil {
		return "", s.areaError(area, "debootstrap", err)
	}
	if err := bx.inRoot(ctx, "clean up the base layer", rootfs, nil, "/bin/sh", "-c", cleanScript); err != nil {
		return "", err
	}
	if _, err := finishTree(ctx, rootfs, s.shift()); err != nil {
		return "", err
	}
	if err := copyTree(ctx, rootfs, filepath.Join(tmp, "rootfs")); err != nil {
		return "", err
	}
	if err := removeArea(tmp); err != nil {
		return "", err
	}
	if err := os.RemoveAll(filepath.Join(tmp, "tools")); err != nil {
		return "", err
	}
	info := map[string]any{"release": release, "mirror": mirror, "builder": BuilderVersion, "built_at": time.Now().UTC()}
	if err := writeJSON(filepath.Join(tmp, "base.json"), info); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	committed = true
	done()
	return dir, nil
}

// debianArch is Debian's name of this machine's architecture.
func debianArch() string {
	if goruntime.GOARCH == "386" {
		return "i386"
	}
	return goruntime.GOARCH // amd64, arm64, ppc64le, s390x, riscv64 are Debian's names too
}

// sourceURIs lists the URIs of a sources.list's deb lines.
func sourceURIs(sources string) []string {
	var out []string
	for _, line := range strings.Split(sources, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "deb" {
			out = append(out, f[1])
		}
	}
	return out
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}
