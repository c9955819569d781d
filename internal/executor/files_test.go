package executor_test

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
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
	workspacetest.Run(t, func(t *testing.T) workspacetest.Subject {
		dir, ws := workspacetest.HostWorkspace(t)
		return workspacetest.Subject{W: execclient.NewWorkspace(serveFiles(t, ws), 1<<30), Sandbox: workspacetest.HostShell(dir)}
	})
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
