//go:build integration

package executor_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/testenv"
	"github.com/sbx-sandbox/sbx/internal/workspace"
	"github.com/sbx-sandbox/sbx/internal/workspace/workspacetest"
)

// TestFilesConformanceRunc runs the workspace conformance suite on the
// files of real runc sandboxes, through their executors: the executor
// acts as the sandbox's root in its user namespace, and code in the
// sandbox (bash runs through /run) works against it.
func TestFilesConformanceRunc(t *testing.T) {
	testenv.RequiresRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed")
	}
	env := testenv.New(t)
	dirs := &oci.Dirs{}
	dirs.Add("python", env.Rootfs(t, "python"))
	rt, err := oci.New(oci.Config{Runtime: "runc", StateDir: filepath.Join(env.StateRoot, "files-runc"), ExecutorPath: env.Executor,
		CgroupParent: "sbx-test", UIDShift: uidShift, Images: dirs, Volumes: dirs})
	if err != nil {
		t.Fatal(err)
	}
	owners := workspace.Owners{Root: workspace.Owner{UID: uidShift, GID: uidShift}, User: workspace.Owner{UID: uidShift + 1000, GID: uidShift + 1000}}
	var n atomic.Int64
	workspacetest.Run(t, func(t *testing.T) workspacetest.Subject {
		base, err := os.MkdirTemp(env.WorkspaceRoot, "files-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(base) })
		if err := os.Chmod(base, 0o711); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(base, "ws")
		ws, err := workspace.Create(dir, owners)
		if err != nil {
			t.Fatal(err)
		}
		ws.Close()
		id := fmt.Sprintf("files-%d-%d", os.Getpid(), n.Add(1))
		ctx := context.Background()
		dirs.Add(id, dir)
		t.Cleanup(func() { dirs.Remove(id) })
		if _, err := rt.Create(ctx, runtime.Spec{ID: id, Image: "python", Volume: id}); err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Cleanup(func() {
			if err := rt.Destroy(ctx, id); err != nil {
				t.Errorf("destroy %s: %v", id, err)
			}
		})
		c := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
		t.Cleanup(func() { c.Close() })
		return workspacetest.Subject{
			W: execclient.NewWorkspace(c, 1<<30),
			Sandbox: func(ctx context.Context, script string) (string, error) {
				res, err := c.Run(ctx, wire.RunRequest{Language: wire.LanguageBash, Code: script, TimeoutMs: int64(time.Minute / time.Millisecond)}, nil)
				if err != nil {
					return "", err
				}
				out := res.Stdout + res.Stderr
				if res.Status != wire.StatusCompleted {
					return out, fmt.Errorf("%s: %v", res.Status, res.Error)
				}
				return out, nil
			},
		}
	})
}
