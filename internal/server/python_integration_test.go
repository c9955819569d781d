//go:build integration

package server_test

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// TestPythonClient installs the Python client (clients/python) with pip
// from its path, the way its README says, and runs its unit tests and its
// integration tests (the two workloads of docs/REQUIREMENTS.md, driven as
// an agent drives them)
// against a real server with runc sandboxes. The server is wrapped in the
// contract checker, so every request the Python client makes is checked
// against api/openapi.yaml too.
func TestPythonClient(t *testing.T) {
	py := pythonWithPip(t)
	env := testenv.New(t)
	// Build the templates the tests use first (minutes, once per machine),
	// so a cold cache shows up as a build here, not as a Python timeout.
	env.Rootfs(t, "python")
	env.Rootfs(t, "python-datascience")
	rs := startReal(t, t.TempDir())

	src, err := filepath.Abs(filepath.Join("..", "..", "clients", "python"))
	if err != nil {
		t.Fatal(err)
	}
	// pip builds in the source tree (build/, *.egg-info): build a copy, so
	// the checkout stays clean and concurrent runs do not meet.
	work := t.TempDir()
	pkg := filepath.Join(work, "src")
	copyTree(t, src, pkg)
	site := filepath.Join(work, "site")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	run := func(name string, extraEnv []string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, py, args...)
		cmd.Dir = work // not the package's directory: the tests must import the installed package
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PIP_NO_INPUT=1", "PIP_DISABLE_PIP_VERSION_CHECK=1")
		cmd.Env = append(cmd.Env, extraEnv...)
		return runCommand(t, name, cmd)
	}

	run("pip install", nil, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "--target", site, pkg)
	pyEnv := []string{"PYTHONPATH=" + site}
	where := strings.TrimSpace(run("import", pyEnv, "-c", "import sbx_client; print(sbx_client.__file__)"))
	if !strings.HasPrefix(where, site+string(filepath.Separator)) {
		t.Fatalf("sbx_client imported from %s, not from the installed copy in %s", where, site)
	}

	tests := filepath.Join(pkg, "tests")
	out := run("python tests", append(pyEnv, "SBX_URL="+rs.URL, "SBX_API_KEY="),
		"-m", "unittest", "discover", "-v", "-s", tests, "-t", tests)
	// Every test must have run: a skip here would be an integration test
	// that did not see the server.
	if strings.Contains(out, "skipped") {
		t.Fatalf("python tests skipped some tests with SBX_URL set:\n%s", out)
	}
	if !strings.Contains(out, "test_a_data_analysis") || !strings.Contains(out, "test_b_question_answering") {
		t.Fatalf("the workload tests did not run:\n%s", out)
	}
	t.Logf("python tests:\n%s", out)
}

// pythonWithPip returns a python3 that can install the client: Debian's
// /usr/bin/python3 when there is one (what CI has; a pyenv or venv python
// first in PATH may lack setuptools), else python3 from PATH. It skips
// when there is none, or it lacks pip, setuptools or wheel (scripts/setup.sh
// installs them).
func pythonWithPip(t *testing.T) string {
	t.Helper()
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		if py, err = exec.LookPath("python3"); err != nil {
			t.Skip("no python3 (scripts/setup.sh installs python3, python3-pip, python3-setuptools, python3-wheel)")
		}
	}
	for _, args := range [][]string{{"-c", "import setuptools, wheel"}, {"-m", "pip", "--version"}} {
		if out, err := exec.Command(py, args...).CombinedOutput(); err != nil {
			t.Skipf("%s cannot build the client (%s): %v: %s (scripts/setup.sh installs python3-pip, python3-setuptools, python3-wheel)",
				py, strings.Join(args, " "), err, out)
		}
	}
	return py
}

// copyTree copies the files of the Python package, leaving out what a
// local build or test run leaves behind.
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && (name == "build" || name == "__pycache__" || strings.HasSuffix(name, ".egg-info")) {
			return filepath.SkipDir
		}
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
