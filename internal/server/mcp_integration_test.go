//go:build integration

package server_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// TestMCPNode runs tests/mcp: the official MCP TypeScript SDK (pinned in
// its package-lock.json) lists the tools and calls them against a real
// server with runc sandboxes, over streamable HTTP at /mcp and over stdio
// through `sbx mcp`. The server checks API keys and is wrapped in the
// contract checker.
func TestMCPNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("no node (scripts/setup.sh installs nodejs and npm)")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "tests", "mcp"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := func(name string, cmd *exec.Cmd) string { return runCommand(t, name, cmd) }
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		run("npm ci", cmd)
	}
	bin := filepath.Join(t.TempDir(), "sbx")
	run("go build", exec.CommandContext(ctx, "go", "build", "-o", bin, "../../cmd/sbx"))

	testenv.New(t).Rootfs(t, "python")
	const key = "mcp-node-key-1"
	rs := startReal(t, t.TempDir(), func(cfg *app.Config) {
		keys, err := server.ParseKeys([]string{key + ":mcp"})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Keys = keys
	})

	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=tap", "mcp.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SBX_URL="+rs.URL, "SBX_API_KEY="+key, "SBX_BIN="+bin, "SBX_RUN="+filepath.Base(t.TempDir()))
	out := run("node tests", cmd)
	t.Logf("node tests:\n%s", out)
	// Every test ran and passed: a skip would be a client that never met
	// the server.
	for _, want := range []string{`(?m)^# pass 3$`, `(?m)^# fail 0$`, `(?m)^# skipped 0$`, `(?m)^# todo 0$`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("node tests: no %q in the report", want)
		}
	}
}
