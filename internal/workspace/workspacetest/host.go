package workspacetest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// HostOwners are the sandbox's ids the host-side suites give their
// workspaces: root and user of a uid shift of 100000.
var HostOwners = workspace.Owners{Root: workspace.Owner{UID: 100000, GID: 100000}, User: workspace.Owner{UID: 101000, GID: 101000}}

// HostWorkspace makes a workspace as workspace.Create does, as
// HostOwners', in a temporary directory the sandbox user can reach (as it
// reaches its own through its mount), and returns its directory and it.
// It needs root: the files belong to the sandbox's ids.
func HostWorkspace(t *testing.T) (string, *workspace.Local) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the workspace's files belong to the sandbox's ids")
	}
	base := t.TempDir()
	for d := base; d != filepath.Dir(d) && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(base, "ws")
	ws, err := workspace.Create(dir, HostOwners)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return dir, ws
}

// HostShell is a Subject.Sandbox for a workspace at dir on this host: a
// shell as HostOwners' user stands in for code in the sandbox.
func HostShell(dir string) func(ctx context.Context, script string) (string, error) {
	return func(ctx context.Context, script string) (string, error) {
		cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
		u := HostOwners.User
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
}
