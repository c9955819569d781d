//go:build integration

package executor_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	"github.com/sbx-sandbox/sbx/internal/executor"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// The conversation views in real sandboxes: the executor as PID 1 of a
// container in a user namespace, its mounts made by a worker as the
// container's root, on Linux (runc) and on gVisor's kernel (runsc).

func TestConversationViewsRunc(t *testing.T) { viewsIn(t, "runc") }
func TestConversationViewsRunsc(t *testing.T) {
	// Known bug, open: under runsc the views work but the sandbox then
	// does not stop in time for `runsc delete` ("waiting sandbox stop:
	// context deadline exceeded"), so the test leaked a gVisor sandbox.
	// Skipped until that is understood; runc (the default) is covered.
	t.Skip("runsc: sandbox does not stop after conversation views (open bug)")
	viewsIn(t, "runsc")
}

// uidShift is the host uid of a sandbox's root, set explicitly so that the
// test knows whose files are root's inside.
const uidShift = 100000

func viewsIn(t *testing.T, name string) {
	testenv.RequiresRoot(t)
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s is not installed", name)
	}
	env := testenv.New(t)
	rootfs := env.Rootfs(t, "python")
	ws, err := os.MkdirTemp(env.WorkspaceRoot, "ws-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(ws)
	dirs := &oci.Dirs{}
	dirs.Add("python", rootfs)
	dirs.Add("ws", ws)
	rt, err := oci.New(oci.Config{Runtime: name, StateDir: filepath.Join(env.StateRoot, name), ExecutorPath: env.Executor,
		CgroupParent: "sbx-test", UIDShift: uidShift, Images: dirs, Volumes: dirs})
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("views-%s-%d", name, os.Getpid())
	ctx := context.Background()
	if _, err := rt.Create(ctx, runtime.Spec{ID: id, Image: "python", Volume: "ws"}); err != nil {
		t.Fatalf("create: %v", err)
	}
	defer func() {
		if err := rt.Destroy(ctx, id); err != nil {
			t.Errorf("destroy %s: %v", id, err)
		}
	}()
	client := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
	defer client.Close()
	executor.RunConversationViews(t, executor.ViewSandbox{
		Client: client, HostWorkspace: ws, Workspace: "/workspace",
		RootUID: uidShift, UserUID: uidShift + 1000,
	})
}
