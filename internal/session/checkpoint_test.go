package session_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// checkpointed is a workspace store whose workspaces, as a Pod's do, live
// with their sandboxes (workspace.Checkpointer): it counts checkpoints,
// and its Open answers only while a sandbox runs over the workspace.
type checkpointed struct {
	workspace.Store
	rt *runtimetest.InProcess

	mu     sync.Mutex
	points map[string]int
}

func (c *checkpointed) Checkpoint(ctx context.Context, name, sandbox string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sandbox == "" {
		return errors.New("a checkpoint of no sandbox")
	}
	c.points[name]++
	return nil
}

func (c *checkpointed) OpenIn(ctx context.Context, name, sandbox string) (workspace.Workspace, error) {
	if sandbox == "" {
		return nil, errors.New("opened in no sandbox")
	}
	// As a Pod's: only a running sandbox holds the workspace.
	if info, err := c.rt.Inspect(ctx, sandbox); err != nil || info.State != runtime.StateRunning {
		return nil, fmt.Errorf("sandbox %s does not hold %s: %w", sandbox, name, errdefs.ErrUnavailable)
	}
	return c.Open(ctx, name)
}

func (c *checkpointed) SaveFrom(ctx context.Context, name, sandbox, key string, prev *snapshot.Manifest) (*snapshot.Manifest, snapshot.Stats, error) {
	return c.Save(ctx, name, key, prev)
}

func (c *checkpointed) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.points[name]
}

// TestCheckpointedWorkspaces: where workspaces live with their sandboxes,
// a file call starts the session's sandbox (it has none yet), and every
// completed write and execution is checkpointed before it is answered;
// reads are not.
func TestCheckpointedWorkspaces(t *testing.T) {
	s := newServer(t)
	dirs := workspace.NewDirs(workspace.DirsConfig{Root: s.wsDir, Saved: s.snapshots,
		Owners: workspace.Owners{Root: workspace.Owner{UID: 0, GID: 0}, User: workspace.Owner{UID: runtimetest.SandboxUID, GID: runtimetest.SandboxUID}}})
	ws := &checkpointed{Store: dirs, rt: s.rt, points: map[string]int{}}
	m := session.New(session.Options{
		Store: s.st, Templates: s.templates, Workspaces: ws,
		Runtime:   func(string) (runtime.Runtime, error) { return s.rt, nil },
		Snapshots: s.snapshots,
	})
	t.Cleanup(m.Close)
	ctx := context.Background()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	createSession(t, m, "s")
	vol := workspace.SessionVolume("t", "s")

	call, err := m.OpenFiles(ctx, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if l := sandboxes(t, s.rt); len(l) != 1 {
		t.Errorf("a file call where workspaces live with sandboxes: %d sandboxes, want the session's one", len(l))
	}
	if _, err := call.Workspace.Stat(ctx, "."); err != nil {
		t.Fatal(err)
	}
	if n := ws.count(vol); n != 0 {
		t.Errorf("a read checkpointed (%d)", n)
	}
	if _, err := call.Workspace.Save(ctx, "in.txt", strings.NewReader("x"), 1<<20); err != nil {
		t.Fatal(err)
	}
	if n := ws.count(vol); n != 1 {
		t.Errorf("after a write: %d checkpoints, want 1", n)
	}
	if err := call.Workspace.MakeDir(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if n := ws.count(vol); n != 2 {
		t.Errorf("after a mkdir: %d checkpoints, want 2", n)
	}
	call.Close()

	run(t, m, "s", "open('out.txt','w').write(open('in.txt').read())")
	if n := ws.count(vol); n != 3 {
		t.Errorf("after an execution: %d checkpoints, want 3", n)
	}
	// A run that changes nothing is released without a checkpoint, on
	// its executor's word.
	ctx2, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	lease, err := m.Acquire(ctx2, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	res, err := lease.Client.Run(ctx2, wire.RunRequest{Language: wire.LanguagePython, Code: "print(open('out.txt').read())"}, nil)
	if err != nil || !res.WorkspaceUnchanged {
		t.Fatalf("a read-only run: %+v, %v; want workspace_unchanged", res, err)
	}
	lease.ReleaseUnchanged()
	if n := ws.count(vol); n != 3 {
		t.Errorf("after an unchanged run: %d checkpoints, want 3", n)
	}
	if got := readFile(t, m, "s", "out.txt"); got != "x" {
		t.Errorf("out.txt: %q", got)
	}
	if n := ws.count(vol); n != 3 {
		t.Errorf("after a read: %d checkpoints, want 3", n)
	}

	// The sandbox gone from under the session (a Pod deleted): the next
	// file call lets it go and starts a new one, rather than fail for as
	// long as no execution notices.
	l := sandboxes(t, s.rt)
	if len(l) != 1 {
		t.Fatalf("sandboxes: %+v", l)
	}
	if err := s.rt.Stop(ctx, l[0].ID); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, m, "s", "out.txt"); got != "x" {
		t.Errorf("out.txt after the sandbox went: %q", got)
	}
	if l2 := sandboxes(t, s.rt); len(l2) != 1 || l2[0].ID == l[0].ID {
		t.Errorf("sandboxes after: %+v, want one new one", l2)
	}
}
