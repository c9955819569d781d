package template

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// requiresBuild skips tests that build real templates where they cannot.
func requiresBuild(t testing.TB) {
	t.Helper()
	requiresRoot(t)
	if os.Getenv("SBX_SKIP_BUILD_TESTS") == "1" {
		t.Skip("SBX_SKIP_BUILD_TESTS=1")
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		t.Skip("needs debootstrap (apt-get install debootstrap)")
	}
}

// testStore is shared between test runs (and with sbx itself), so that
// only the first run pays for debootstrap and the python build.
func testStore(t testing.TB) *Store {
	dir := os.Getenv("SBX_TEST_TEMPLATE_DIR")
	if dir == "" {
		dir = DefaultDir
	}
	s := NewStore(dir)
	s.Jobs = oci.NewJobRunner(oci.Config{StateDir: testStateDir})
	return s
}

// testStateDir holds the runtime state of the tests' build jobs.
const testStateDir = "/run/sbx-test-template"

// uniqueSpec is a cheap spec (python3 only) that no earlier run has built:
// for tests that need a build to happen.
func uniqueSpec(name string) Spec {
	b := make([]byte, 8)
	rand.Read(b)
	return Spec{Name: name, Files: map[string]string{"/etc/sbx-test-nonce": hex.EncodeToString(b)}}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// runInRootfs runs args in rootfs as the sandbox user would be seen from
// the host (uid 101000), with a private /proc and /tmp, so that nothing it
// does can change the template.
func runInRootfs(t testing.TB, rootfs string, env []string, args ...string) string {
	t.Helper()
	script := `mount -t proc proc "$1/proc" && mount -t tmpfs tmpfs "$1/tmp" && r=$1 && shift && exec chroot --userspec=101000:101000 "$r" "$@"`
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, "sh", rootfs}, args...)...)
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v in %s: %v\n%s", args, rootfs, err, out)
	}
	return string(out)
}

func TestBuildPython(t *testing.T) {
	requiresBuild(t)
	s := testStore(t)
	spec, _ := Builtin("python")
	tmpl, err := s.Ensure(context.Background(), spec, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("python: %s, %d MB, built %s in %s", ShortHash(tmpl.Hash), tmpl.SizeBytes>>20, tmpl.BuiltAt, tmpl.BuildDuration)
	if tmpl.Hash != spec.Hash() || tmpl.Rootfs != filepath.Join(s.Dir, "builds", spec.Hash(), "rootfs") {
		t.Errorf("template %+v", tmpl)
	}
	root := tmpl.Rootfs

	out, err := exec.Command("chroot", root, "/usr/bin/python3", "-B", "-c", "print(1)").CombinedOutput()
	if err != nil || string(out) != "1\n" {
		t.Errorf("python3 in the rootfs: %v: %q", err, out)
	}
	if got := runInRootfs(t, root, nil, "/usr/bin/python3", "-I", "-c", "import os, json; print(os.getuid(), os.path.expanduser('~'))"); got != "101000 /tmp\n" {
		t.Errorf("as the sandbox user: %q", got)
	}
	for dir, mode := range map[string]os.FileMode{
		"workspace": 0o755, "tmp": 0o1777 | os.ModeSticky, "run/sbx": 0o755, "opt/sbx": 0o755,
		"proc": 0, "sys": 0, "dev": 0,
	} {
		fi, err := os.Stat(filepath.Join(root, dir))
		if err != nil || !fi.IsDir() {
			t.Errorf("mount point /%s: %v", dir, err)
			continue
		}
		if mode != 0 && fi.Mode()&(os.ModePerm|os.ModeSticky) != mode&(os.ModePerm|os.ModeSticky) {
			t.Errorf("/%s: mode %v", dir, fi.Mode())
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "\nuser:x:1000:1000::/tmp:/bin/bash\n") {
		t.Errorf("no user 1000 in /etc/passwd:\n%s", passwd)
	}
	for _, dir := range []string{"var/lib/apt/lists", "var/cache/apt", "usr/share/man"} {
		if entries, _ := os.ReadDir(filepath.Join(root, dir)); len(entries) > 0 {
			t.Errorf("/%s is not empty: %d entries", dir, len(entries))
		}
	}
	for _, f := range []string{"etc/resolv.conf", "etc/hostname", "usr/sbin/policy-rc.d"} {
		if _, err := os.Lstat(filepath.Join(root, f)); err == nil {
			t.Errorf("/%s is left in the rootfs", f)
		}
	}
	for _, f := range []string{"", "etc/passwd", "usr/bin/python3", "usr/lib", "tmp"} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(root, f), &st); err != nil || st.Uid != 100000 || st.Gid != 100000 {
			t.Errorf("/%s: owner %d:%d (%v), want 100000:100000", f, st.Uid, st.Gid, err)
		}
	}
	// Setuid files would do nothing in a sandbox (nosuid, no_new_privs)
	// and are a way into every template for whoever runs them on the host.
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(root, "usr/bin/passwd"), &st); err != nil || st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
		t.Errorf("passwd: mode %o (%v), want no setuid bit", st.Mode, err)
	}
	for _, f := range []string{"spec.json", "build.json", "packages.txt"} {
		if fi, err := os.Stat(filepath.Join(filepath.Dir(root), f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v (%v), want 0600: spec.json holds the tenant's env values", f, fi.Mode(), err)
		}
	}

	// Known now: Lookup, Named, List, and a second Ensure that builds nothing.
	if got, ok := s.Lookup(spec); !ok || got.Hash != tmpl.Hash {
		t.Error("Lookup does not find the build")
	}
	renamed := spec.clone()
	renamed.Name, renamed.Timeout = "python-renamed-test", Duration(1)
	if got, ok := s.Lookup(renamed); !ok || got.Spec.Name != renamed.Name {
		t.Error("a renamed spec with another timeout does not find the build")
	}
	var again bytes.Buffer
	if got, err := s.Ensure(context.Background(), spec, &again); err != nil || got.Rootfs != root || again.Len() > 0 {
		t.Errorf("second Ensure: %v, output %q", err, again.String())
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range list {
		if l.Hash == tmpl.Hash {
			found = strings.Contains(strings.Join(l.Names, ","), "python")
		}
	}
	if !found {
		t.Errorf("List has no build named python: %+v", list)
	}
	if named, err := s.Named("python"); err != nil || named.Hash() != spec.Hash() {
		t.Errorf("Named(python): %v", err)
	}
}

func TestEnsureConcurrent(t *testing.T) {
	requiresBuild(t)
	s := testStore(t)
	spec := uniqueSpec("sbx-test-concurrent")
	const goroutines = 4
	outs := make([]*syncBuffer, goroutines)
	results := make([]*Template, goroutines)
	errs := make([]error, goroutines)

	// One more caller in another process: the file lock, not just the
	// in-process map, must make it wait.
	specJSON, _ := json.Marshal(spec)
	helper := exec.Command(os.Args[0], "-test.run=^TestEnsureHelperProcess$", "-test.v")
	helper.Env = append(os.Environ(), "SBX_TEMPLATE_TEST_HELPER="+string(specJSON), "SBX_TEST_TEMPLATE_DIR="+s.Dir)
	var helperOut syncBuffer
	helper.Stdout, helper.Stderr = &helperOut, &helperOut
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	for i := range goroutines {
		outs[i] = &syncBuffer{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = s.Ensure(context.Background(), spec, outs[i])
		}()
	}
	wg.Wait()
	if err := helper.Wait(); err != nil {
		t.Errorf("helper process: %v\n%s", err, helperOut.String())
	}
	builds := strings.Count(helperOut.String(), "[3/5] apt-get install")
	for i := range goroutines {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if results[i].Hash != results[0].Hash || results[i].Rootfs != results[0].Rootfs {
			t.Errorf("caller %d got another build: %+v", i, results[i])
		}
		builds += strings.Count(outs[i].String(), "[3/5] apt-get install")
	}
	if builds != 1 {
		t.Errorf("%d builds for 5 concurrent callers, want 1", builds)
	}
	waits := strings.Count(helperOut.String(), "waiting")
	for i := range goroutines {
		waits += strings.Count(outs[i].String(), "waiting")
	}
	t.Logf("1 build, %d callers waited for it (the others found it built)", waits)
	if !strings.Contains(helperOut.String(), "HASH "+results[0].Hash) {
		t.Errorf("helper process got another build:\n%s", helperOut.String())
	}
	nonce, err := os.ReadFile(filepath.Join(results[0].Rootfs, "etc/sbx-test-nonce"))
	if err != nil || string(nonce) != spec.Files["/etc/sbx-test-nonce"] {
		t.Errorf("spec file in the rootfs: %q, %v", nonce, err)
	}

	if err := s.Remove(context.Background(), ShortHash(results[0].Hash)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Lookup(spec); ok {
		t.Error("Lookup finds a removed build")
	}
	if _, err := s.Named(spec.Name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the name of a removed build: %v", err)
	}
	if err := s.Remove(context.Background(), results[0].Hash); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("removing twice: %v", err)
	}
	assertNothingLeft(t, s, results[0].Hash)
}

// TestEnsureHelperProcess is TestEnsureConcurrent's other process.
func TestEnsureHelperProcess(t *testing.T) {
	in := os.Getenv("SBX_TEMPLATE_TEST_HELPER")
	if in == "" {
		t.Skip("only run by TestEnsureConcurrent")
	}
	var spec Spec
	if err := json.Unmarshal([]byte(in), &spec); err != nil {
		t.Fatal(err)
	}
	tmpl, err := testStore(t).Ensure(context.Background(), spec, os.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("HASH " + tmpl.Hash + "\n")
}

func TestBuildFailureLeavesNothing(t *testing.T) {
	requiresBuild(t)
	s := testStore(t)
	spec := uniqueSpec("sbx-test-fails")
	spec.Packages = []string{"sbx-test-no-such-package"}
	// What a build of the same spec that crashed would have left: the
	// next build must clean it up.
	stale := filepath.Join(s.Dir, "tmp", spec.Hash()+".999999999.deadbeef")
	if err := os.MkdirAll(filepath.Join(stale, "rootfs/etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := s.Ensure(context.Background(), spec, testWriter{t})
	if err == nil {
		t.Fatal("a build of a package that does not exist succeeded")
	}
	if !strings.Contains(err.Error(), "sbx-test-no-such-package") {
		t.Errorf("the error does not say what failed: %v", err)
	}
	t.Logf("error (as expected): %v", err)
	assertNothingLeft(t, s, spec.Hash())
}

func TestBuildCancelLeavesNothing(t *testing.T) {
	requiresBuild(t)
	s := testStore(t)
	spec := uniqueSpec("sbx-test-cancel")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &cancelOn{w: testWriter{t}, marker: "Setting up ", cancel: cancel}
	_, err := s.Ensure(ctx, spec, w)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Ensure after cancel: %v", err)
	}
	assertNothingLeft(t, s, spec.Hash())
}

// cancelOn cancels once marker shows up in the output: in the middle of
// apt-get install, with dpkg running inside the chroot.
type cancelOn struct {
	w      testWriter
	marker string
	cancel func()
}

func (c *cancelOn) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(c.marker)) {
		c.cancel()
	}
	return c.w.Write(p)
}

// assertNothingLeft checks that no build, temporary directory or mount of
// hash remains.
func assertNothingLeft(t *testing.T, s *Store, hash string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(s.Dir, "builds", hash)); !os.IsNotExist(err) {
		t.Errorf("builds/%s exists (%v)", ShortHash(hash), err)
	}
	entries, _ := os.ReadDir(filepath.Join(s.Dir, "tmp"))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), hash) {
			t.Errorf("tmp/%s is left behind", e.Name())
		}
	}
	if mps, err := mountsUnder(s.Dir); err != nil || len(mps) > 0 {
		t.Errorf("mounts left under %s: %v (%v)", s.Dir, mps, err)
	}
	if jobs, _ := os.ReadDir(filepath.Join(testStateDir, "jobs")); len(jobs) > 0 {
		t.Errorf("build jobs left in %s: %d", testStateDir, len(jobs))
	}
	if mps, err := mountsUnder(testStateDir); err != nil || len(mps) > 0 {
		t.Errorf("mounts left under %s: %v (%v)", testStateDir, mps, err)
	}
}

// TestBuildAllBuiltins builds every built-in (minutes and gigabytes on a
// cold machine) and checks that what it promises works. SBX_BUILD_ALL=1.
func TestBuildAllBuiltins(t *testing.T) {
	if os.Getenv("SBX_BUILD_ALL") != "1" {
		t.Skip("builds every built-in template; set SBX_BUILD_ALL=1")
	}
	requiresBuild(t)
	s := testStore(t)
	checks := map[string][][]string{
		"python-datascience": {{"/usr/bin/python3", "-I", "-c", `
import numpy as np, pandas as pd, matplotlib.pyplot as plt
from scipy import stats, interpolate, optimize
# scipy's pythran-built modules, which run without pythran installed:
print(stats.somersd([1, 2, 3, 4], [1, 3, 2, 4]).statistic > 0)
x = np.linspace(0, 1, 10).reshape(-1, 1)
print(interpolate.RBFInterpolator(x, np.sin(x[:, 0]))(x).shape == (10,))
df = pd.DataFrame({"a": np.arange(5)})
df.plot(); plt.savefig("/tmp/chart.png")
print(plt.get_backend())
`}},
		"file-parser": {
			{"/usr/bin/python3", "-I", "-c", "import pandas, openpyxl, docx, pypdf; print(pypdf.__version__)"},
			{"/usr/bin/pdftotext", "-v"},
			{"/usr/bin/tesseract", "--list-langs"},
		},
	}
	for _, spec := range Builtins() {
		t.Run(spec.Name, func(t *testing.T) {
			tmpl, err := s.Ensure(context.Background(), spec, testWriter{t})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s, %d MB, built in %s", spec.Name, ShortHash(tmpl.Hash), tmpl.SizeBytes>>20, tmpl.BuildDuration)
			env := []string{}
			for k, v := range spec.Env {
				env = append(env, k+"="+v)
			}
			imports := "import " + strings.Join(append([]string{"sys"}, spec.Preload...), ", ")
			runInRootfs(t, tmpl.Rootfs, env, "/usr/bin/python3", "-I", "-c", imports)
			for _, c := range checks[spec.Name] {
				t.Logf("%v: %s", c[:1], runInRootfs(t, tmpl.Rootfs, env, c...))
			}
			for _, compiler := range []string{"usr/bin/g++", "usr/bin/gcc", "usr/bin/cc", "usr/include/boost"} {
				if _, err := os.Lstat(filepath.Join(tmpl.Rootfs, compiler)); err == nil {
					t.Errorf("/%s is in the template", compiler)
				}
			}
		})
	}
}

// TestBuildStopsAtItsLimit: a build grows in an area of MaxBuildBytes and
// fails where it passes it, not after it has written all it wanted; what
// it wrote goes with it.
func TestBuildStopsAtItsLimit(t *testing.T) {
	requiresBuild(t)
	s := testStore(t)
	base, _ := Builtin("python")
	if _, err := s.Ensure(context.Background(), base, testWriter{t}); err != nil {
		t.Fatal(err) // the base layer, which the limited build copies
	}
	// The base layer is ~85 MB and apt's lists (kept compressed) ~10 more;
	// installing python3 takes ~50 more before apt-get clean, so this limit
	// is passed during the install.
	s.MaxBuildBytes = 120 << 20
	spec := uniqueSpec("sbx-test-limit")
	_, err := s.Ensure(context.Background(), spec, testWriter{t})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "120 MiB") {
		t.Fatalf("a build past its limit: %v; want ErrResourceExhausted naming the limit", err)
	}
	t.Logf("error (as expected): %v", err)
	assertNothingLeft(t, s, spec.Hash())
}
