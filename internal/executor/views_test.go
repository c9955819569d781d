package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// ViewSandbox is an executor the conversation-view checks run against: one
// served in this process (TestConversationViews) or one in a real sandbox
// (views_integration_test.go, under runc and runsc).
type ViewSandbox struct {
	Client *client.Client
	// HostWorkspace is the workspace as the test sees it; Workspace is
	// where code in the sandbox finds it.
	HostWorkspace, Workspace string
	// RootUID and UserUID are the host uids of the sandbox's root and of
	// the user code runs as.
	RootUID, UserUID int
}

// TestConversationViews runs the checks against an executor on this host.
func TestConversationViews(t *testing.T) {
	env := startServer(t, testConfig(t))
	defer env.stop()
	RunConversationViews(t, ViewSandbox{Client: env.client, HostWorkspace: env.ws, Workspace: env.ws, RootUID: 0, UserUID: 1000})
}

// RunConversationViews checks what runs of a conversation see of the
// workspace's uploads (the conversation temp area, docs/REQUIREMENTS.md,
// "Terms"): their own temp area, read-only, and by no path another
// conversation's.
func RunConversationViews(t *testing.T, v ViewSandbox) {
	v.plantUploads(t)
	t.Run("own view", v.testOwnView)
	t.Run("no conversation sees all", v.testNoConversation)
	t.Run("concurrent conversations", v.testConcurrent)
	t.Run("empty temp area", v.testEmpty)
	t.Run("refused sources", v.testRefused)
	t.Run("uploads replaced", v.testUploadsReplaced)
	t.Run("bash", v.testBash)
	t.Run("contexts", v.testContexts)
}

func secret(conv string) string { return "secret of " + conv + "\n" }

// plantUploads lays out uploads the way the control plane does (root's,
// 0755/0644), plus the malformed cases testRefused needs.
func (v *ViewSandbox) plantUploads(t *testing.T) {
	t.Helper()
	up := filepath.Join(v.HostWorkspace, "uploads")
	dir := func(p string, uid int, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, p string) {
		t.Helper()
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, v.RootUID, v.RootUID); err != nil {
			t.Fatal(err)
		}
	}
	dir(up, v.RootUID, 0o755)
	for _, c := range []string{"c1", "c2"} {
		dir(filepath.Join(up, c), v.RootUID, 0o755)
		dir(filepath.Join(up, c, "temparea"), v.RootUID, 0o755)
		f := filepath.Join(up, c, "temparea", "secret.txt")
		if err := os.WriteFile(f, []byte(secret(c)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(f, v.RootUID, v.RootUID); err != nil {
			t.Fatal(err)
		}
	}
	dir(filepath.Join(up, "c4"), v.RootUID, 0o755) // no temparea yet
	link("c2", filepath.Join(up, "c5"))            // a conversation that is a symlink
	dir(filepath.Join(up, "c6"), v.RootUID, 0o755) // a temparea that is a symlink
	link("../c2/temparea", filepath.Join(up, "c6", "temparea"))
	dir(filepath.Join(up, "c7", "temparea"), v.RootUID, 0o755) // a conversation the user owns
	dir(filepath.Join(up, "c7"), v.UserUID, 0o755)
	dir(filepath.Join(up, "c8", "temparea"), v.RootUID, 0o755) // one anybody may change
	dir(filepath.Join(up, "c8"), v.RootUID, 0o777)
}

func (v *ViewSandbox) run(t *testing.T, req wire.RunRequest) *wire.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if req.TimeoutMs == 0 {
		req.TimeoutMs = 60_000
	}
	res, err := v.Client.Run(ctx, req, nil)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return res
}

// value runs req, which must complete, and decodes its return value.
func (v *ViewSandbox) value(t *testing.T, req wire.RunRequest, out any) {
	t.Helper()
	res := v.run(t, req)
	if res.Status != wire.StatusCompleted {
		t.Fatalf("%s: %+v\nstdout: %s\nstderr: %s", res.Status, res.Error, res.Stdout, res.Stderr)
	}
	if err := json.Unmarshal(res.ReturnValue, out); err != nil {
		t.Fatalf("return value %s: %v", res.ReturnValue, err)
	}
}

func (v *ViewSandbox) inConversation(conv, code string) wire.RunRequest {
	req := py(fmt.Sprintf("W = %q\n", v.Workspace) + code)
	req.ConversationID = conv
	return req
}

// escapeCode tries every way to c2's files it can think of from a run of
// c1, and to change c1's.
const escapeCode = `import ctypes, os
out = {}
out['uploads'] = sorted(os.listdir(W + '/uploads'))
out['temparea'] = sorted(os.listdir(W + '/uploads/temparea'))
out['own'] = open(W + '/uploads/temparea/secret.txt').read()
# Symlinks planted in the workspace, which is the user's.
for name, target in (('lnk-rel', 'uploads/c2/temparea'), ('lnk-abs', W + '/uploads/c2/temparea'), ('lnk-up', 'uploads')):
    p = os.path.join(W, name)
    if os.path.lexists(p):
        os.unlink(p)
    os.symlink(target, p)
leaks = []
for p in [W + '/uploads/c2/temparea/secret.txt',
          '/proc/self/root' + W + '/uploads/c2/temparea/secret.txt',
          '/proc/1/root' + W + '/uploads/c2/temparea/secret.txt',
          '/proc/self/cwd/uploads/c2/temparea/secret.txt',
          W + '/uploads/temparea/../c2/temparea/secret.txt',
          W + '/uploads/temparea/../../uploads/c2/temparea/secret.txt',
          W + '/lnk-rel/secret.txt', W + '/lnk-abs/secret.txt', W + '/lnk-up/c2/temparea/secret.txt']:
    try:
        open(p).read()
        leaks.append(p)
    except OSError:
        pass
fd = os.open(W, os.O_RDONLY | os.O_DIRECTORY)
for p in ('uploads/c2/temparea/secret.txt', 'lnk-rel/secret.txt'):
    try:
        os.close(os.open(p, os.O_RDONLY, dir_fd=fd))
        leaks.append('openat ' + p)
    except OSError:
        pass
os.close(fd)
# A descriptor left over from making the view would lead past it.
for d in os.listdir('/proc/self/fd'):
    for p in ('c2/temparea/secret.txt', 'uploads/c2/temparea/secret.txt', '../c2/temparea/secret.txt'):
        try:
            os.close(os.open(p, os.O_RDONLY, dir_fd=int(d)))
            leaks.append('fd %s: %s' % (d, p))
        except (OSError, ValueError):
            pass
for root, dirs, files in os.walk(W):
    for f in files:
        try:
            with open(os.path.join(root, f), errors='replace') as fh:
                if 'secret of c2' in fh.read(1 << 16):
                    leaks.append(os.path.join(root, f))
        except OSError:
            pass
out['leaks'] = leaks
writes = []
for p in (W + '/uploads/temparea/new.txt', W + '/uploads/new.txt', W + '/uploads/temparea/secret.txt'):
    try:
        with open(p, 'a') as f:
            f.write('x')
        writes.append(p)
    except OSError:
        pass
for p in (W + '/uploads/temparea/d', W + '/uploads/d'):
    try:
        os.mkdir(p)
        writes.append(p)
    except OSError:
        pass
for a, b in ((W + '/uploads/temparea', W + '/uploads/t2'), (W + '/uploads', W + '/uploads-moved')):
    try:
        os.rename(a, b)
        writes.append('rename ' + a)
    except OSError:
        pass
out['writes'] = writes
# Read-only mounts, whatever the files' modes.
out['ro'] = [bool(os.statvfs(p).f_flag & os.ST_RDONLY) for p in (W + '/uploads', W + '/uploads/temparea')]
libc = ctypes.CDLL(None, use_errno=True)
out['umount'] = libc.umount2((W + '/uploads').encode(), 2)
# The rest of the workspace stays writable, and shared.
with open(W + '/from-c1.txt', 'w') as f:
    f.write('hello from c1')
return out
`

func (v *ViewSandbox) testOwnView(t *testing.T) {
	var got struct {
		Uploads, Temparea, Leaks, Writes []string
		Own                              string
		Umount                           int
		RO                               []bool
	}
	v.value(t, v.inConversation("c1", escapeCode), &got)
	if !reflect.DeepEqual(got.Uploads, []string{"temparea"}) {
		t.Errorf("uploads lists %q, want only temparea", got.Uploads)
	}
	if !reflect.DeepEqual(got.Temparea, []string{"secret.txt"}) || got.Own != secret("c1") {
		t.Errorf("temparea lists %q and holds %q, want c1's file", got.Temparea, got.Own)
	}
	if len(got.Leaks) > 0 {
		t.Errorf("c1 reached c2's files through %q", got.Leaks)
	}
	if len(got.Writes) > 0 {
		t.Errorf("c1 changed its read-only view: %q", got.Writes)
	}
	if !reflect.DeepEqual(got.RO, []bool{true, true}) {
		t.Errorf("uploads and uploads/temparea read-only: %v, want both", got.RO)
	}
	if got.Umount != -1 {
		t.Errorf("umount2 of the view returned %d", got.Umount)
	}
	b, err := os.ReadFile(filepath.Join(v.HostWorkspace, "uploads", "c1", "temparea", "secret.txt"))
	if err != nil || string(b) != secret("c1") {
		t.Errorf("c1's file is now %q (%v)", b, err)
	}
}

func (v *ViewSandbox) testNoConversation(t *testing.T) {
	var got struct {
		Uploads []string
		Via     string
		Shared  string
	}
	req := py(fmt.Sprintf(`W = %q
import os
return {'uploads': sorted(os.listdir(W + '/uploads')),
        'via': open(W + '/uploads/c2/temparea/secret.txt').read(),
        'shared': open(W + '/from-c1.txt').read() if os.path.exists(W + '/from-c1.txt') else ''}`, v.Workspace))
	v.value(t, req, &got)
	if !reflect.DeepEqual(got.Uploads, []string{"c1", "c2", "c4", "c5", "c6", "c7", "c8"}) {
		t.Errorf("a run without a conversation lists uploads as %q", got.Uploads)
	}
	if got.Via != secret("c2") {
		t.Errorf("a run without a conversation read %q", got.Via)
	}
	if got.Shared != "hello from c1" {
		t.Errorf("a file c1 wrote in the workspace reads %q", got.Shared)
	}
}

func (v *ViewSandbox) testConcurrent(t *testing.T) {
	barrier := filepath.Join(v.HostWorkspace, "barrier")
	if err := os.Mkdir(barrier, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(barrier, v.UserUID, v.UserUID); err != nil {
		t.Fatal(err)
	}
	// Each waits until both have started, so that their views are made
	// and used while the other's exists.
	code := `import os, time
B = W + '/barrier'
open(os.path.join(B, CONV), 'w').close()
deadline = time.time() + 50
while len(os.listdir(B)) < 2 and time.time() < deadline:
    time.sleep(0.01)
return [len(os.listdir(B)), sorted(os.listdir(W + '/uploads')), open(W + '/uploads/temparea/secret.txt').read(),
        os.path.exists(W + '/uploads/c1') or os.path.exists(W + '/uploads/c2')]`
	var wg sync.WaitGroup
	got := map[string][]any{}
	var mu sync.Mutex
	for _, conv := range []string{"c1", "c2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out []any
			v.value(t, v.inConversation(conv, fmt.Sprintf("CONV = %q\n", conv)+code), &out)
			mu.Lock()
			got[conv] = out
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, conv := range []string{"c1", "c2"} {
		want := []any{2.0, []any{"temparea"}, secret(conv), false}
		if !reflect.DeepEqual(got[conv], want) {
			t.Errorf("%s saw %v, want %v", conv, got[conv], want)
		}
	}
}

func (v *ViewSandbox) testEmpty(t *testing.T) {
	for _, conv := range []string{"c3", "c4"} { // no directory; no temparea
		var got [][]string
		v.value(t, v.inConversation(conv, "import os\nreturn [sorted(os.listdir(W + '/uploads')), os.listdir(W + '/uploads/temparea')]"), &got)
		if !reflect.DeepEqual(got, [][]string{{"temparea"}, {}}) {
			t.Errorf("%s sees %q, want an empty temparea", conv, got)
		}
	}
}

// wantRefused checks that a run failed with an ExecutorError naming why,
// before any of its code ran.
func (v *ViewSandbox) wantRefused(t *testing.T, conv, why string) {
	t.Helper()
	ran := filepath.Join(v.HostWorkspace, "ran-"+conv)
	res := v.run(t, v.inConversation(conv, "open(W + '/ran-"+conv+"', 'w').close()\nprint('ran')"))
	if res.Status != wire.StatusFailed || res.Error == nil || res.Error.Type != wire.ErrTypeExecutor {
		t.Errorf("%s: %s %+v, want an ExecutorError", conv, res.Status, res.Error)
	} else if !strings.Contains(res.Error.Message, why) {
		t.Errorf("%s: message %q does not say %q", conv, res.Error.Message, why)
	}
	if _, err := os.Lstat(ran); err == nil || res.Stdout != "" {
		t.Errorf("%s: the code ran (stdout %q)", conv, res.Stdout)
		os.Remove(ran)
	}
}

func (v *ViewSandbox) testRefused(t *testing.T) {
	v.wantRefused(t, "c5", "symbolic link")
	v.wantRefused(t, "c6", "symbolic link")
	v.wantRefused(t, "c7", "owned by uid 1000")
	v.wantRefused(t, "c8", "writable by others")
}

// testUploadsReplaced: sandboxed code (the workspace is the user's) moves
// the uploads directory away and puts something else in its place.
func (v *ViewSandbox) testUploadsReplaced(t *testing.T) {
	up := filepath.Join(v.HostWorkspace, "uploads")
	real := filepath.Join(v.HostWorkspace, "uploads-real")
	if err := os.Rename(up, real); err != nil {
		t.Fatal(err)
	}
	defer func() {
		os.RemoveAll(up)
		if err := os.Rename(real, up); err != nil {
			t.Fatal(err)
		}
	}()
	for _, tc := range []struct {
		name, why string
		plant     func()
	}{
		{"symlink to another conversation", "symbolic link", func() { v.userSymlink(t, "uploads-real/c2", up) }},
		{"symlink to the real uploads", "symbolic link", func() { v.userSymlink(t, "uploads-real", up) }},
		{"absolute symlink", "symbolic link", func() { v.userSymlink(t, v.Workspace+"/uploads-real/c2", up) }},
		{"missing", "does not exist", func() {}},
		{"the user's own directory", "owned by uid 1000", func() {
			for _, d := range []string{up, up + "/c1", up + "/c1/temparea"} {
				os.Mkdir(d, 0o755)
				os.Lchown(d, v.UserUID, v.UserUID)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.RemoveAll(up)
			tc.plant()
			v.wantRefused(t, "c1", tc.why)
		})
	}
}

func (v *ViewSandbox) userSymlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(p, v.UserUID, v.UserUID); err != nil {
		t.Fatal(err)
	}
}

func (v *ViewSandbox) testBash(t *testing.T) {
	req := sh(fmt.Sprintf(`W=%q
ls -A "$W/uploads"
cat "$W/uploads/temparea/secret.txt"
cat "$W/uploads/c2/temparea/secret.txt" 2>/dev/null && echo LEAK
cat /proc/self/root"$W/uploads/c2/temparea/secret.txt" 2>/dev/null && echo LEAK
touch "$W/uploads/temparea/x" 2>/dev/null && echo WROTE
bash -c 'ls -A "$0/uploads"' "$W"`, v.Workspace))
	req.ConversationID = "c1"
	res := v.run(t, req)
	if want := "temparea\n" + secret("c1") + "temparea\n"; res.Status != wire.StatusCompleted || res.Stdout != want {
		t.Errorf("bash in c1: %s %+v %q, want %q", res.Status, res.Error, res.Stdout, want)
	}
}

func (v *ViewSandbox) testContexts(t *testing.T) {
	ctx := context.Background()
	inContext := func(conv, code string) wire.RunRequest {
		req := v.inConversation(conv, code)
		req.ContextID = "k"
		return req
	}
	read := "x = open(W + '/uploads/temparea/secret.txt').read()\nreturn x"
	for _, conv := range []string{"c1", "c2"} {
		var got string
		if v.value(t, inContext(conv, read), &got); got != secret(conv) {
			t.Errorf("context k of %s read %q", conv, got)
		}
	}
	// The same id in a run without a conversation is a third context.
	var has bool
	if v.value(t, inContext("", "return 'x' in globals()"), &has); has {
		t.Error("context k without a conversation shares a conversation's globals")
	}
	var x string
	if v.value(t, inContext("c1", "return x"), &x); x != secret("c1") {
		t.Errorf("context k of c1 holds %q", x)
	}
	if err := v.Client.DeleteContext(ctx, "c3", "k"); err == nil {
		t.Error("deleted context k of c3, which never existed")
	}
	if err := v.Client.DeleteContext(ctx, "", "k"); err != nil {
		t.Errorf("delete context k: %v", err)
	}
	if n, err := v.Client.DeleteConversation(ctx, "c2"); n != 1 || err != nil {
		t.Errorf("delete conversation c2: %d %v, want 1 context", n, err)
	}
	if v.value(t, inContext("c2", "return 'x' in globals()"), &has); has {
		t.Error("context k of c2 survived its conversation's deletion")
	}
	if v.value(t, inContext("c1", "return 'x' in globals()"), &has); !has {
		t.Error("deleting c2 deleted c1's context")
	}
	for _, conv := range []string{"c1", "c2"} {
		if _, err := v.Client.DeleteConversation(ctx, conv); err != nil {
			t.Errorf("delete conversation %s: %v", conv, err)
		}
	}
	if _, err := v.Client.DeleteConversation(ctx, "../x"); err == nil {
		t.Error("deleted conversation ../x")
	}
	// A context's view is made when it starts: a bad one fails its run.
	res := v.run(t, inContext("c5", "return 1"))
	if res.Status != wire.StatusFailed || res.Error == nil || res.Error.Type != wire.ErrTypeExecutor || !strings.Contains(res.Error.Message, "symbolic link") {
		t.Errorf("context of c5: %s %+v, want an ExecutorError", res.Status, res.Error)
	}
	v.Client.DeleteConversation(ctx, "c5")
}
