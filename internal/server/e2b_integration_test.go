//go:build integration

package server_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/testenv"
	"github.com/sbx-sandbox/sbx/internal/testenv/kubetest"
)

// TestE2BCompat runs compat/e2b, the E2B compatibility suite: Node scripts
// that use the unmodified npm e2b and @e2b/code-interpreter SDKs (the
// versions pinned in its package-lock.json), configured only by the three
// environment variables docs/e2b.md names, against a real server with
// runc sandboxes and an E2B-style API key. Every test must pass and none
// may be skipped.
func TestE2BCompat(t *testing.T) {
	node, npm := nodeAndNpm(t)
	env := testenv.New(t)
	env.Rootfs(t, "python")
	env.Rootfs(t, "python-datascience")
	runE2BCompat(t, node, npm)
}

// TestE2BCompatKubernetes is the same suite against a server whose
// sandboxes are Pods of the test cluster (internal/runtime/kube).
func TestE2BCompatKubernetes(t *testing.T) {
	node, npm := nodeAndNpm(t)
	c := kubetest.New(t)
	kubetest.Image(t, "python")
	kubetest.Image(t, "python-datascience")
	runE2BCompat(t, node, npm, func(cfg *app.Config) {
		cfg.Kubernetes = &app.Kubernetes{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace}
	})
}

func runE2BCompat(t *testing.T, node, npm string, configure ...func(*app.Config)) {
	b := make([]byte, 20)
	rand.Read(b)
	key := "e2b_" + hex.EncodeToString(b)
	url := startE2BServer(t, key+":e2b-tenant", configure...)

	suite, err := filepath.Abs(filepath.Join("..", "..", "compat", "e2b"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	run := func(name string, extraEnv []string, bin string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = suite
		cmd.Env = append(os.Environ(), "npm_config_yes=true", "npm_config_update_notifier=false", "npm_config_fund=false", "npm_config_audit=false")
		cmd.Env = append(cmd.Env, extraEnv...)
		return runCommand(t, name, cmd)
	}
	if _, err := os.Stat(filepath.Join(suite, "node_modules", "e2b")); err != nil {
		// npm ci installs exactly the lockfile's versions.
		run("npm ci", nil, npm, "ci", "--no-audit", "--no-fund")
	}

	e2bEnv := []string{"E2B_API_URL=" + url, "E2B_SANDBOX_URL=" + url, "E2B_API_KEY=" + key, "E2B_DOMAIN=", "E2B_DEBUG="}
	out := run("node --test", e2bEnv, node, "--test", "--test-concurrency=1", "--test-reporter=tap",
		"tests/commands.test.mjs", "tests/files.test.mjs", "tests/interpreter.test.mjs")
	t.Logf("compat/e2b:\n%s", out)
	for _, want := range []string{"# fail 0", "# skipped 0", "# todo 0", "# cancelled 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("compat/e2b: want %q in the summary", want)
		}
	}
	if m := regexp.MustCompile(`# pass (\d+)`).FindStringSubmatch(out); m == nil || m[1] == "0" {
		t.Errorf("compat/e2b: no test passed")
	}

	// A key the server does not know is refused, as E2B refuses one.
	req, _ := http.NewRequest("POST", url+"/sandboxes", strings.NewReader(`{"templateID":"base"}`))
	req.Header.Set("X-API-KEY", "e2b_"+strings.Repeat("0", 40))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("create with an unknown key: %d, want 401", resp.StatusCode)
	}
}

// startE2BServer starts a real server with the given API key (KEY:TENANT)
// and returns its URL.
func startE2BServer(t *testing.T, keySpec string, configure ...func(*app.Config)) string {
	t.Helper()
	keys, err := server.ParseKeys([]string{keySpec})
	if err != nil {
		t.Fatal(err)
	}
	// The SDKs' suite runs under a cap on open streams, as a server
	// with the default --limits does.
	configure = append([]func(*app.Config){func(c *app.Config) { c.Keys, c.Limits.Streams = keys, 16 }}, configure...)
	return startE2B(t, t.TempDir(), configure...).URL
}

// startE2B is startReal without the contract checker: the E2B routes are
// not sbx's API and are not in api/openapi.yaml.
func startE2B(t *testing.T, dir string, configure ...func(*app.Config)) *realServer {
	t.Helper()
	return openReal(t, dir, func(h http.Handler) http.Handler { return h }, configure...)
}

// TestE2BContextAcrossRestart: a code context made before a restart (or,
// the same thing, on another replica) still runs cells, with its
// interpreter's state when the sandbox was adopted and where its previous
// cell left it (the context's cwd at first), as a kernel does.
func TestE2BContextAcrossRestart(t *testing.T) {
	testenv.New(t).Rootfs(t, "python")
	dir := t.TempDir()
	rs := startE2B(t, dir)
	call := func(url, method, path, sandbox, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if sandbox != "" {
			req.Header.Set("E2b-Sandbox-Id", sandbox)
			req.Header.Set("E2b-Sandbox-Port", "49999")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var sb struct{ SandboxID string }
	code, body := call(rs.URL, "POST", "/sandboxes", "", `{"templateID":"base"}`)
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &sb) != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	var c struct{ ID, Cwd string }
	code, body = call(rs.URL, "POST", "/contexts", sb.SandboxID, `{"language":"python","cwd":"/tmp"}`)
	if code != http.StatusOK || json.Unmarshal([]byte(body), &c) != nil || c.Cwd != "/tmp" {
		t.Fatalf("create context: %d %s", code, body)
	}
	cell := func(url, src string) string {
		t.Helper()
		q, _ := json.Marshal(map[string]string{"code": src, "context_id": c.ID})
		code, body := call(url, "POST", "/execute", sb.SandboxID, string(q))
		if code != http.StatusOK || !strings.Contains(body, `"end_of_execution"`) {
			t.Fatalf("cell %q: %d %s", src, code, body)
		}
		return body
	}
	if out := cell(rs.URL, "import os\nx = 41\nos.getcwd()"); !strings.Contains(out, `"text":"'/tmp'"`) {
		t.Errorf("first cell, in the context's cwd: %s", out)
	}
	cell(rs.URL, "os.chdir('/opt')") // as in a kernel, the next cell starts there
	rs.stop()

	rs2 := startE2B(t, dir)
	if out := cell(rs2.URL, "(x + 1, os.getcwd())"); !strings.Contains(out, `(42, '/opt')`) {
		t.Errorf("cell after the restart: %s", out)
	}
	if code, body := call(rs2.URL, "GET", "/contexts", sb.SandboxID, ""); code != http.StatusOK || !strings.Contains(body, c.ID) {
		t.Errorf("contexts after the restart: %d %s", code, body)
	}
	if code, body := call(rs2.URL, "DELETE", "/contexts/"+c.ID, sb.SandboxID, ""); code != http.StatusNoContent {
		t.Errorf("delete: %d %s", code, body)
	}
	if _, body := call(rs2.URL, "GET", "/contexts", sb.SandboxID, ""); strings.Contains(body, c.ID) {
		t.Errorf("deleted context still listed: %s", body)
	}
	if code, _ := call(rs2.URL, "DELETE", "/contexts/nonsense", sb.SandboxID, ""); code != http.StatusNotFound {
		t.Errorf("delete of a malformed context id: %d, want 404", code)
	}
}

// nodeAndNpm finds node (20 or later) and npm, or skips: scripts/setup.sh
// installs them.
func nodeAndNpm(t *testing.T) (string, string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node (scripts/setup.sh installs nodejs and npm)")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("no npm (scripts/setup.sh installs nodejs and npm)")
	}
	out, err := exec.Command(node, "-p", "process.versions.node.split('.')[0]").Output()
	if err != nil {
		t.Skipf("node does not run: %v", err)
	}
	if v := strings.TrimSpace(string(out)); len(v) < 2 || v < "20" {
		t.Skipf("node %s is older than 20, which the E2B SDKs need", v)
	}
	return node, npm
}
