package executor_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/executor"
	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/workspace"
	"github.com/sbx-sandbox/sbx/internal/workspace/workspacetest"
)

// TestFilesConformance runs the workspace conformance suite on the
// client's Workspace, talking over a unix socket to the executor's file
// handler on a host directory: the whole path of a file call but the
// sandbox around it (the integration test has that). A shell as the
// sandbox user stands in for code in the sandbox.
func TestFilesConformance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the workspace's files belong to the sandbox's ids")
	}
	owners := workspace.Owners{Root: workspace.Owner{UID: 100000, GID: 100000}, User: workspace.Owner{UID: 101000, GID: 101000}}
	workspacetest.Run(t, func(t *testing.T) workspacetest.Subject {
		dir, ws := filesWorkspace(t, owners)
		return workspacetest.Subject{
			W: execclient.NewWorkspace(serveFiles(t, ws), 1<<30),
			Sandbox: func(ctx context.Context, script string) (string, error) {
				cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
				cmd.Dir = dir
				cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(owners.User.UID), Gid: uint32(owners.User.GID)}}
				out, err := cmd.CombinedOutput()
				return string(out), err
			},
		}
	})
}

// filesWorkspace makes a workspace as workspace.Create does, in a
// directory the sandbox user can reach.
func filesWorkspace(t *testing.T, owners workspace.Owners) (string, *workspace.Local) {
	t.Helper()
	base := t.TempDir()
	for d := base; d != filepath.Dir(d) && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(base, "ws")
	ws, err := workspace.Create(dir, owners)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return dir, ws
}

// serveFiles serves the file handler of ws on a unix socket, as the
// executor does, and returns a client of it.
func serveFiles(t *testing.T, ws *workspace.Local) *execclient.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "files.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: executor.FilesHandler(ws)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(l)
	}()
	c := execclient.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(func() {
		c.Close()
		srv.Close()
		<-done
	})
	return c
}
