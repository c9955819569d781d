//go:build integration

package server_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/testenv"
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

	b := make([]byte, 20)
	rand.Read(b)
	key := "e2b_" + hex.EncodeToString(b)
	url := startE2BServer(t, key+":e2b-tenant")

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
// and returns its URL. Unlike startReal it does not wrap the handler in
// the contract checker: the E2B routes are not sbx's API and are not in
// api/openapi.yaml.
func startE2BServer(t *testing.T, keySpec string) string {
	t.Helper()
	env := testenv.New(t)
	state := filepath.Join(env.StateRoot, "srv")
	rt, err := oci.New(oci.Config{StateDir: state, ExecutorPath: env.Executor})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := server.ParseKeys([]string{keySpec})
	if err != nil {
		t.Fatal(err)
	}
	app, err := server.Open(context.Background(), server.Config{
		DataDir: t.TempDir(), StateDir: state, TemplateDir: testenv.TemplateDir(), ExecutorPath: env.Executor,
		Keys:    keys,
		Runtime: func(string) (runtime.Runtime, error) { return rt, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(app.Server.Handler())
	t.Cleanup(func() {
		ts.Close()
		app.Close()
		destroySandboxes(t, rt)
	})
	return ts.URL
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
