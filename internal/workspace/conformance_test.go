package workspace_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/workspace"
	"github.com/sbx-sandbox/sbx/internal/workspace/workspacetest"
)

// TestLocalConformance runs the conformance suite on Local, with a shell
// as the sandbox user standing in for code in the sandbox.
func TestLocalConformance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the workspace's files belong to the sandbox's ids")
	}
	owners := workspace.Owners{Root: workspace.Owner{UID: 100000, GID: 100000}, User: workspace.Owner{UID: 101000, GID: 101000}}
	workspacetest.Run(t, func(t *testing.T) workspacetest.Subject {
		base := t.TempDir()
		// The sandbox user must reach its workspace, as it does through
		// its mount.
		for d := base; d != filepath.Dir(d) && d != os.TempDir(); d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o711); err != nil {
				t.Fatal(err)
			}
		}
		dir := filepath.Join(base, "ws")
		w, err := workspace.Create(dir, owners)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return workspacetest.Subject{W: w, Sandbox: func(ctx context.Context, script string) (string, error) {
			cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
			cmd.Dir = dir
			cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(owners.User.UID), Gid: uint32(owners.User.GID)}}
			out, err := cmd.CombinedOutput()
			return string(out), err
		}}
	})
}
