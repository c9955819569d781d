//go:build integration

package executor

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// TestPodModeConversationViews: the conversation views of the unprivileged
// mode (podviews.go), made without mounts: uploads reached through the
// control plane's file routes, read by runs of their conversation at
// uploads/temparea and by nothing else, not even through the /proc files
// of a live process of the conversation.
func TestPodModeConversationViews(t *testing.T) {
	p := startPodSandbox(t)
	ws := client.NewWorkspace(p.c, 1<<20)
	ctx := context.Background()
	for _, c := range []string{"c1", "c2"} {
		for _, rel := range []string{"secret.txt", "sub/deep.txt"} {
			if _, err := ws.SaveUpload(ctx, c, rel, strings.NewReader("secret of "+c+"\n"), 1<<20); err != nil {
				t.Fatalf("upload %s/%s: %v", c, rel, err)
			}
		}
	}
	// On the node: root's, the conversation's group, closed to others.
	gids := map[string]uint32{}
	for _, c := range []string{"c1", "c2"} {
		for rel, want := range map[string]os.FileMode{"": 0o750, "temparea": 0o750, "temparea/sub": 0o750,
			"temparea/secret.txt": 0o640, "temparea/sub/deep.txt": 0o640} {
			fi, err := os.Lstat(filepath.Join(p.workspace, "uploads", c, rel))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid != 0 || fi.Mode().Perm() != want || st.Gid < viewGIDFirst || (gids[c] != 0 && gids[c] != st.Gid) {
				t.Errorf("uploads/%s/%s: uid %d gid %d mode %o", c, rel, st.Uid, st.Gid, fi.Mode().Perm())
			}
			gids[c] = st.Gid
		}
	}
	if gids["c1"] == gids["c2"] {
		t.Errorf("c1 and c2 share group %d", gids["c1"])
	}
	if fi, err := os.Lstat(filepath.Join(p.workspace, "uploads")); err != nil || fi.Mode().Perm() != 0o711 {
		t.Errorf("uploads: %v %v", fi, err)
	}

	value := func(t *testing.T, req wire.RunRequest, out any) {
		t.Helper()
		res := p.run(t, req)
		if res.Status != wire.StatusCompleted {
			t.Fatalf("%s: %+v\nstdout: %s\nstderr: %s", res.Status, res.Error, res.Stdout, res.Stderr)
		}
		if err := json.Unmarshal(res.ReturnValue, out); err != nil {
			t.Fatalf("return value %s: %v", res.ReturnValue, err)
		}
	}

	t.Run("own view", func(t *testing.T) {
		for _, c := range []string{"c1", "c2"} {
			var got map[string]any
			value(t, wire.RunRequest{ConversationID: c, Code: ownViewCode}, &got)
			if got["own"] != "secret of "+c+"\n" || got["deep"] != "secret of "+c+"\n" ||
				got["sub"] != "secret of "+c+"\n" || got["cat"] != "secret of "+c+"\n" {
				t.Errorf("%s: %v", c, got)
			}
			if l, _ := json.Marshal(got["listing"]); string(l) != `["secret.txt","sub"]` {
				t.Errorf("%s: listing %s", c, l)
			}
			if l, _ := json.Marshal(got["leaks"]); string(l) != "[]" {
				t.Errorf("%s leaked: %s", c, l)
			}
			if l, _ := json.Marshal(got["writes"]); string(l) != "[]" {
				t.Errorf("%s wrote: %s", c, l)
			}
		}
	})

	t.Run("bash", func(t *testing.T) {
		res := p.run(t, wire.RunRequest{Language: "bash", ConversationID: "c2",
			Code: "cat /workspace/uploads/temparea/secret.txt; cat /workspace/uploads/c1/temparea/secret.txt 2>/dev/null || echo refused"})
		if res.Stdout != "secret of c2\nrefused\n" {
			t.Errorf("bash in c2: %q %q", res.Stdout, res.Stderr)
		}
	})

	t.Run("no conversation", func(t *testing.T) {
		var got map[string]any
		value(t, wire.RunRequest{Code: noConversationCode}, &got)
		if l, _ := json.Marshal(got["read"]); string(l) != "[]" {
			t.Errorf("a run of no conversation read %s", l)
		}
	})

	t.Run("a live process of another conversation", func(t *testing.T) {
		// A context of c1 sits in its uploads with a file open; runs of
		// c2 go through its /proc files.
		r := p.run(t, wire.RunRequest{ConversationID: "c1", ContextID: "holder",
			Code: "import os\nos.chdir('/workspace/uploads/temparea/sub')\nheld = open('deep.txt')\nprint(held.read(), end='')"})
		if r.Stdout != "secret of c1\n" {
			t.Fatalf("the holder: %s %+v %q", r.Status, r.Error, r.Stderr)
		}
		var got map[string]any
		value(t, wire.RunRequest{ConversationID: "c2", Code: procLeakCode}, &got)
		if got["seen"] == 0.0 {
			t.Fatalf("the c1 context's process was not seen: %v", got)
		}
		if l, _ := json.Marshal(got["leaks"]); string(l) != "[]" {
			t.Errorf("c2 read c1's uploads through /proc: %s", l)
		}
		// The holder reads its own again once it runs again.
		r = p.run(t, wire.RunRequest{ConversationID: "c1", ContextID: "holder", Code: "print(open('/workspace/uploads/temparea/secret.txt').read(), end='')"})
		if r.Stdout != "secret of c1\n" {
			t.Errorf("the holder again: %s %+v %q", r.Status, r.Error, r.Stderr)
		}
	})

	t.Run("conversations take turns", func(t *testing.T) {
		// c1 reads its view, says it runs, waits for c2's run to be
		// asked for, and reads its view again: c2's run waits for c1's.
		started := filepath.Join(p.workspace, "c1-started")
		asked := filepath.Join(p.workspace, "c2-asked")
		done := make(chan *wire.Result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			res, err := p.c.Run(ctx, wire.RunRequest{Language: "python", ConversationID: "c1", Code: turnsCode}, nil)
			if err != nil {
				t.Errorf("c1: %v", err)
			}
			done <- res
		}()
		for i := 0; ; i++ {
			if _, err := os.Stat(started); err == nil {
				break
			}
			if i > 3000 {
				t.Fatal("c1 never started")
			}
			time.Sleep(10 * time.Millisecond)
		}
		c2 := make(chan *wire.Result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			res, err := p.c.Run(ctx, wire.RunRequest{Language: "python", ConversationID: "c2",
				Code: "import os\nassert os.path.exists('/workspace/c1-done')\nprint(open('/workspace/uploads/temparea/secret.txt').read(), end='')"}, nil)
			if err != nil {
				t.Errorf("c2: %v", err)
			}
			c2 <- res
		}()
		// The request is on its way; c1 goes on once we say so. (If c2's
		// run did not wait, its assert fails.)
		time.Sleep(200 * time.Millisecond)
		if err := os.WriteFile(asked, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		r1 := <-done
		if r1 == nil || r1.Stdout != "secret of c1\nsecret of c1\n" {
			t.Fatalf("c1: %+v", r1)
		}
		r2 := <-c2
		if r2 == nil || r2.Status != wire.StatusCompleted || r2.Stdout != "secret of c2\n" {
			t.Fatalf("c2: %+v", r2)
		}
	})

	t.Run("temparea is no conversation", func(t *testing.T) {
		res := p.run(t, wire.RunRequest{ConversationID: "temparea", Code: "print(1)"})
		if res.Status == wire.StatusCompleted || res.Error == nil || !strings.Contains(res.Error.Message, "cannot be a conversation's") {
			t.Errorf("conversation temparea: %s %+v", res.Status, res.Error)
		}
	})

	t.Run("uploads replaced", func(t *testing.T) {
		// The workspace is the user's: code may rename uploads away and
		// make its own. A run of a conversation then fails, and says why.
		p.ok(t, "import os\nos.rename('/workspace/uploads', '/workspace/uploads-old')\nos.makedirs('/workspace/uploads/c3/temparea')")
		res := p.run(t, wire.RunRequest{ConversationID: "c3", Code: "print(1)"})
		if res.Status == wire.StatusCompleted || res.Error == nil || !strings.Contains(res.Error.Message, "replaced") {
			t.Errorf("a run after uploads was replaced: %s %+v", res.Status, res.Error)
		}
		if _, err := os.Lstat(filepath.Join(p.workspace, "uploads", "temparea")); err == nil {
			t.Error("the executor made its link in the sandbox's own uploads")
		}
	})
}

const ownViewCode = `import os, subprocess
W = '/workspace'
out = {}
out['own'] = open(W + '/uploads/temparea/secret.txt').read()
out['deep'] = open(W + '/uploads/temparea/sub/deep.txt').read()
out['listing'] = sorted(os.listdir(W + '/uploads/temparea'))
# A child that closes every descriptor (subprocess's default) still finds it.
out['cat'] = subprocess.run(['cat', W + '/uploads/temparea/secret.txt'], capture_output=True, text=True).stdout
os.chdir(W + '/uploads/temparea')
out['sub'] = open('sub/deep.txt').read()
me = os.path.basename(os.path.dirname(os.path.realpath(W + '/uploads/temparea')))
other = 'c2' if me == 'c1' else 'c1'
leaks = []
for p in [W + '/uploads/%s/temparea/secret.txt' % other, W + '/uploads/%s/temparea/sub/deep.txt' % other,
          W + '/uploads/temparea/../../%s/temparea/secret.txt' % other]:
    try:
        open(p).read()
        leaks.append(p)
    except OSError:
        pass
try:
    os.listdir(W + '/uploads')
    leaks.append('listed uploads')
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
for f in (lambda: os.unlink(W + '/uploads/temparea'), lambda: os.symlink('/', W + '/uploads/x'),
          lambda: os.chmod(W + '/uploads/temparea/secret.txt', 0o666)):
    try:
        f()
        writes.append(str(f))
    except OSError:
        pass
out['writes'] = writes
def handler(event):
    return out
`

const noConversationCode = `import os
read = []
for p in ['/workspace/uploads/temparea/secret.txt', '/workspace/uploads/c1/temparea/secret.txt',
          '/workspace/uploads/c2/temparea/sub/deep.txt']:
    try:
        open(p).read()
        read.append(p)
    except OSError:
        pass
def handler(event):
    return {'read': read}
`

const procLeakCode = `import os
leaks, seen = [], 0
me = os.getpid()
for pid in os.listdir('/proc'):
    if not pid.isdigit() or int(pid) == me:
        continue
    base = '/proc/%s' % pid
    for p in (base + '/cwd/deep.txt', base + '/cwd/../secret.txt', base + '/root/workspace/uploads/c1/temparea/secret.txt'):
        try:
            if 'secret of c1' in open(p).read():
                leaks.append(p)
        except OSError:
            pass
    try:
        fds = os.listdir(base + '/fd')
    except OSError:
        continue
    for fd in fds:
        try:
            t = os.readlink(base + '/fd/' + fd)
        except OSError:
            continue
        if '/uploads/' in t:
            seen += 1
            try:
                if 'secret of c1' in open(base + '/fd/' + fd).read():
                    leaks.append(base + '/fd/' + fd)
            except OSError:
                pass
def handler(event):
    return {'leaks': leaks, 'seen': seen}
`

const turnsCode = `import os, time
first = open('/workspace/uploads/temparea/secret.txt').read()
open('/workspace/c1-started', 'w').close()
while not os.path.exists('/workspace/c2-asked'):
    time.sleep(0.01)
second = open('/workspace/uploads/temparea/secret.txt').read()
open('/workspace/c1-done', 'w').close()
print(first + second, end='')
`
