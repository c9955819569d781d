// Package testenv gives integration tests what real sandboxes need: root,
// a freshly built static executor, a built template and short state paths.
// Tests that cannot have them skip with the reason.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/template"
)

// RequiresRoot skips the test unless it runs as root.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (sandboxes need namespaces, cgroups and the OCI runtime)")
	}
}

// Env is one test process's sandbox environment.
type Env struct {
	// Executor is the static sbx-executor binary built for this process.
	Executor string
	// StateRoot is a short directory for runtime state (unix socket paths
	// must stay under 108 bytes).
	StateRoot string
	// WorkspaceRoot is where tests make workspaces; every sandbox uid can
	// traverse it.
	WorkspaceRoot string
}

var (
	once    sync.Once
	shared  *Env
	initErr error
)

// New returns the process-wide environment, building the executor on first
// use. It lives until the process exits.
func New(t testing.TB) *Env {
	t.Helper()
	RequiresRoot(t)
	once.Do(func() { shared, initErr = setup() })
	if initErr != nil {
		t.Fatalf("test environment: %v", initErr)
	}
	return shared
}

func setup() (*Env, error) {
	root, err := os.MkdirTemp("", "sbxt-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(root, 0o711); err != nil {
		return nil, err
	}
	e := &Env{StateRoot: filepath.Join(root, "s"), WorkspaceRoot: filepath.Join(root, "w")}
	for _, d := range []string{e.StateRoot, e.WorkspaceRoot} {
		if err := os.Mkdir(d, 0o711); err != nil {
			return nil, err
		}
	}
	e.Executor = filepath.Join(root, "sbx-executor")
	if err := BuildExecutor(e.Executor); err != nil {
		return nil, err
	}
	return e, nil
}

// BuildExecutor builds cmd/sbx-executor as a static binary at out.
func BuildExecutor(out string) error { return build("./cmd/sbx-executor", out) }

var (
	sbxOnce sync.Once
	sbxErr  error
)

// Sbx builds cmd/sbx once per process, beside the executor, and returns
// its path: for tests that run the server as a process of its own (to kill
// it with SIGKILL, say).
func (e *Env) Sbx(t testing.TB) string {
	t.Helper()
	path := filepath.Join(filepath.Dir(e.Executor), "sbx")
	sbxOnce.Do(func() { sbxErr = build("./cmd/sbx", path) })
	if sbxErr != nil {
		t.Fatalf("test environment: %v", sbxErr)
	}
	return path
}

func build(pkg, out string) error {
	mod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(mod)))
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return &buildError{out: string(b), err: err}
	}
	return nil
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return "go build: " + e.err.Error() + ": " + e.out }

// TemplateDir is where tests keep built templates: SBX_TEST_TEMPLATE_DIR,
// else the default store, so that builds are shared with `sbx` and cached
// between runs.
func TemplateDir() string {
	if d := os.Getenv("SBX_TEST_TEMPLATE_DIR"); d != "" {
		return d
	}
	return "/var/lib/sbx/templates"
}

// Rootfs returns the rootfs of a built-in template, building it if needed
// (minutes, once per machine). SBX_SKIP_BUILD_TESTS=1 skips instead.
func (e *Env) Rootfs(t testing.TB, name string) string {
	t.Helper()
	spec, ok := template.Builtin(name)
	if !ok {
		t.Fatalf("no built-in template %q", name)
	}
	store := template.NewStore(TemplateDir())
	if tmpl, ok := store.Lookup(spec); ok {
		return tmpl.Rootfs
	}
	if os.Getenv("SBX_SKIP_BUILD_TESTS") == "1" {
		t.Skipf("template %s is not built and SBX_SKIP_BUILD_TESTS=1", name)
	}
	t.Logf("building template %s into %s (once per machine)", name, store.Dir)
	// Through the CLI, whose builds run in containers of the OCI driver
	// (which this package cannot import: the driver's own tests use it).
	if filepath.Base(store.Dir) != "templates" {
		t.Fatalf("SBX_TEST_TEMPLATE_DIR %q must end in /templates (sbx template build --data-dir DIR builds into DIR/templates)", store.Dir)
	}
	cmd := exec.Command(e.Sbx(t), "template", "build", name, "--data-dir", filepath.Dir(store.Dir))
	cmd.Env = append(os.Environ(), "SBX_STATE_DIR="+filepath.Join(e.StateRoot, "build"))
	cmd.Stdout, cmd.Stderr = testWriter{t}, testWriter{t}
	if err := cmd.Run(); err != nil {
		t.Fatalf("build template %s: %v", name, err)
	}
	tmpl, ok := store.Lookup(spec)
	if !ok {
		t.Fatalf("build template %s: built, but not found in %s", name, store.Dir)
	}
	return tmpl.Rootfs
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// M is what TestMain receives (and goleak.VerifyTestMain takes).
type M interface{ Run() int }

// WithCleanup wraps a TestMain's m so that the process-wide environment
// (state dirs, executor binary) is removed after the tests:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testenv.WithCleanup(m)) }
func WithCleanup(m M) M { return cleanupM{m} }

type cleanupM struct{ m M }

func (c cleanupM) Run() int {
	code := c.m.Run()
	if shared != nil {
		os.RemoveAll(filepath.Dir(shared.StateRoot))
	}
	return code
}
