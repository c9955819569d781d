package session_test

// Sessions whose sandboxes really run code (runtimetest.InProcess: the
// real executor, in-process, without a container), for what the state
// map of runtimetest.Fake cannot show: a start, code and the file API
// over one workspace, pause and hibernation round trips with the code's
// files, and a restarted server adopting or replacing sandboxes. Only
// the package's exported API is used.

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// server is what a restarted sbx keeps: its store, its data directories
// and the sandboxes on its runtime.
type server struct {
	st        store.Store
	rt        *runtimetest.InProcess
	templates *template.Store
	snapshots *snapshot.Store
	wsDir     string
}

func newServer(t *testing.T) *server {
	t.Helper()
	rt := runtimetest.NewInProcess(t) // skips unless root
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	blobs, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	templates := template.NewStore(filepath.Join(dir, "templates"))
	spec, _ := template.Builtin(session.DefaultTemplate)
	runtimetest.SeedBuild(t, templates, spec)
	wsDir := runtimetest.WorkspaceRoot(t, "t")
	rt.Volumes = workspace.Volumes(wsDir)
	return &server{
		st: st, rt: rt, templates: templates,
		snapshots: snapshot.New(blobs, "snapshots", snapshot.Limits{}),
		wsDir:     wsDir,
	}
}

// manager starts a Manager of the server, as a server process would.
func (s *server) manager(t *testing.T) *session.Manager {
	t.Helper()
	m := session.New(session.Options{
		Store: s.st, Templates: s.templates,
		Runtime:      func(string) (runtime.Runtime, error) { return s.rt, nil },
		WorkspaceDir: s.wsDir, Snapshots: s.snapshots,
		Owners: workspace.Owners{Root: workspace.Owner{UID: 0, GID: 0}, User: workspace.Owner{UID: runtimetest.SandboxUID, GID: runtimetest.SandboxUID}},
	})
	t.Cleanup(m.Close)
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// run runs python code in the session's sandbox, starting one if need be.
func run(t *testing.T, m *session.Manager, id, code string) (*wire.Result, string) {
	t.Helper()
	return runIn(t, m, id, "", code)
}

// runIn is run in the python context ctxID ("" for none), whose
// variables live on in the sandbox between runs.
func runIn(t *testing.T, m *session.Manager, id, ctxID, code string) (*wire.Result, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a bound on a hang, no timing assertion
	defer cancel()
	lease, err := m.Acquire(ctx, "t", id)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	defer lease.Release()
	res, err := lease.Client.Run(ctx, wire.RunRequest{Language: wire.LanguagePython, Code: code, ContextID: ctxID}, nil)
	if err != nil {
		t.Fatalf("run %q: %v", code, err)
	}
	if res.Status != wire.StatusCompleted {
		t.Fatalf("run %q: %s %+v", code, res.Status, res.Error)
	}
	return res, lease.SandboxID
}

// readFile reads a workspace file through the file API.
func readFile(t *testing.T, m *session.Manager, id, rel string) string {
	t.Helper()
	call, err := m.OpenFiles(context.Background(), "t", id)
	if err != nil {
		t.Fatal(err)
	}
	defer call.Close()
	f, err := call.Workspace.Open(context.Background(), rel)
	if err != nil {
		t.Fatalf("open %s: %v", rel, err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func createSession(t *testing.T, m *session.Manager, id string) {
	t.Helper()
	if _, _, err := m.Create(context.Background(), "t", session.CreateRequest{ID: id}); err != nil {
		t.Fatal(err)
	}
}

func sandboxes(t *testing.T, rt runtime.Runtime) []runtime.Info {
	t.Helper()
	l, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestRunSeesFileAPI: a session's first run starts its sandbox; what code
// writes the file API reads, and what is uploaded code reads, but cannot
// change.
func TestRunSeesFileAPI(t *testing.T) {
	s := newServer(t)
	m := s.manager(t)
	ctx := context.Background()
	createSession(t, m, "s")
	if l := sandboxes(t, s.rt); len(l) != 0 {
		t.Fatalf("a session without a run has sandboxes: %+v", l)
	}
	_, sbID := run(t, m, "s", "open('made-by-code.txt', 'w').write('from code')")
	if got := readFile(t, m, "s", "made-by-code.txt"); got != "from code" {
		t.Errorf("the file API reads %q", got)
	}
	sess, err := m.Get(ctx, "t", "s")
	if err != nil || sess.SandboxID != sbID || sess.Status != api.StatusRunning {
		t.Errorf("session: %+v %v, want running in %s", sess, err, sbID)
	}

	call, err := m.OpenFiles(ctx, "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := call.Workspace.Save(ctx, "data/in.csv", strings.NewReader("a,b\n1,2\n"), 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := call.Workspace.SaveUpload(ctx, "c1", "note.txt", strings.NewReader("conversation upload"), 1<<20); err != nil {
		t.Fatal(err)
	}
	call.Close()
	res, _ := run(t, m, "s", `
import os
rows = open('data/in.csv').read().splitlines()
up = 'uploads/c1/temparea/note.txt'
try:
    open(up, 'a').write('changed')
    changed = 'changed'
except OSError as e:
    changed = type(e).__name__
return [len(rows), open(up).read(), changed]`)
	if got := string(res.ReturnValue); got != `[2,"conversation upload","PermissionError"]` {
		t.Errorf("code reading uploads: %s", got)
	}
	if got := readFile(t, m, "s", "uploads/c1/temparea/note.txt"); got != "conversation upload" {
		t.Errorf("the conversation upload after code tried to change it: %q", got)
	}
	if l := sandboxes(t, s.rt); len(l) != 1 || l[0].ID != sbID {
		t.Errorf("sandboxes: %+v, want %s alone", l, sbID)
	}
}

// TestPauseHibernateRoundTrip: a paused sandbox refuses its executor
// until the next acquire thaws it; a hibernated session loses its
// sandbox and comes back, with the code's files, in a new one.
func TestPauseHibernateRoundTrip(t *testing.T) {
	s := newServer(t)
	m := s.manager(t)
	ctx := context.Background()
	createSession(t, m, "s")
	_, first := run(t, m, "s", "import os\nos.makedirs('deep/dir')\nopen('deep/dir/kept.txt', 'w').write('kept')")

	if sess, err := m.Pause(ctx, "t", "s"); err != nil || sess.Status != api.StatusPaused {
		t.Fatalf("pause: %+v %v", sess, err)
	}
	if info, err := s.rt.Inspect(ctx, first); err != nil || info.State != runtime.StatePaused {
		t.Errorf("the sandbox of a paused session: %+v %v", info, err)
	}
	if _, err := s.rt.Dial(ctx, first); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("dial of a paused sandbox: %v", err)
	}
	if _, again := run(t, m, "s", "return 1"); again != first {
		t.Errorf("after resume the session runs in %s, not its sandbox %s", again, first)
	}

	if sess, err := m.Hibernate(ctx, "t", "s"); err != nil || sess.Status != api.StatusHibernated {
		t.Fatalf("hibernate: %+v %v", sess, err)
	}
	if l := sandboxes(t, s.rt); len(l) != 0 {
		t.Errorf("a hibernated session's sandbox is still there: %+v", l)
	}
	res, second := run(t, m, "s", "return open('deep/dir/kept.txt').read()")
	if string(res.ReturnValue) != `"kept"` {
		t.Errorf("the code's file after hibernation: %s", res.ReturnValue)
	}
	if second == first {
		t.Errorf("a restored session runs in its old sandbox %s", first)
	}
	if sess, err := m.Get(ctx, "t", "s"); err != nil || sess.Status != api.StatusRunning || sess.SandboxID != second {
		t.Errorf("restored session: %+v %v", sess, err)
	}
}

// TestRestartAdoptsOrReplaces: a restarted server adopts a session's
// sandbox that still runs (the code's state in it is still there), and a
// sandbox that died while no server watched is replaced by the next run,
// over the same workspace.
func TestRestartAdoptsOrReplaces(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	first := s.manager(t)
	createSession(t, first, "live")
	createSession(t, first, "dead")
	_, live := runIn(t, first, "live", "c", "x = 41")
	_, dead := run(t, first, "dead", "open('f', 'w').write('dead')")
	first.Close() // sandboxes stay up

	if err := s.rt.Stop(ctx, dead); err != nil {
		t.Fatal(err)
	}
	second := s.manager(t)
	if res, again := runIn(t, second, "live", "c", "return x + 1"); again != live || string(res.ReturnValue) != "42" {
		t.Errorf("the restarted server ran the live session in %s (its sandbox: %s), its context gave %s", again, live, res.ReturnValue)
	}
	sess, err := second.Get(ctx, "t", "dead")
	if err != nil || sess.SandboxID != "" || sess.Status != api.StatusRunning {
		t.Errorf("a session whose sandbox died: %+v %v, want running without a sandbox", sess, err)
	}
	res, again := run(t, second, "dead", "return open('f').read()")
	if again == dead || string(res.ReturnValue) != `"dead"` {
		t.Errorf("the dead session's next run: in %s (was %s), read %s", again, dead, res.ReturnValue)
	}
	if _, err := s.rt.Inspect(ctx, dead); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the dead sandbox was not destroyed: %v", err)
	}
}

// TestDeleteDestroysSandbox: a deleted session's sandbox and workspace go.
func TestDeleteDestroysSandbox(t *testing.T) {
	s := newServer(t)
	m := s.manager(t)
	ctx := context.Background()
	createSession(t, m, "s")
	run(t, m, "s", "open('f', 'w').write('x')")
	if _, err := m.Delete(ctx, "t", "s"); err != nil {
		t.Fatal(err)
	}
	if l := sandboxes(t, s.rt); len(l) != 0 {
		t.Errorf("a deleted session's sandbox is still there: %+v", l)
	}
	if _, err := m.Acquire(ctx, "t", "s"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("acquire of a deleted session: %v, want not found", err)
	}
}
