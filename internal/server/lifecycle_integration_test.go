//go:build integration

package server_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/quota/quotatest"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// fingerprintCode describes every entry of the workspace (but the uploads
// area the control plane owns): type, mode, owner, mtime, a file's
// SHA-256, a link's target. Two equal fingerprints are the same tree, byte
// for byte.
const fingerprintCode = `
import hashlib, os, stat
out = []
for root, dirs, files in os.walk("/workspace"):
    dirs.sort()
    for name in sorted(dirs + files):
        p = os.path.join(root, name)
        st = os.lstat(p)
        e = [p, stat.filemode(st.st_mode), st.st_uid, st.st_gid]
        if stat.S_ISLNK(st.st_mode):
            e.append("-> " + os.readlink(p))
        elif stat.S_ISREG(st.st_mode):
            e += [st.st_mtime_ns, hashlib.sha256(open(p, "rb").read()).hexdigest()]
        elif stat.S_ISDIR(st.st_mode):
            e.append(st.st_mtime_ns)
        out.append(e)
return out
`

// plantTree writes a workspace with what hibernation must keep: nested and
// empty directories, modes, links inside and out, a large random file.
const plantTree = `
cd /workspace
mkdir -p deep/er/est empty/inner
echo hello > deep/er/est/a.txt
printf 'x' > one
: > zero
head -c 3000000 /dev/urandom > big.bin
chmod 600 one; chmod 755 deep; chmod 1777 empty
ln -s deep/er/est/a.txt inside
ln -s /etc/passwd outside
ln -s nowhere dangling
`

func fingerprint(t *testing.T, c *client.Client, sid string) string {
	t.Helper()
	return string(execOK(t, c, sid, api.ExecuteRequest{Code: fingerprintCode}).ReturnValue)
}

// waitStatus polls the session until it has the status, or fails.
func waitStatus(t *testing.T, c *client.Client, sid, status string, within time.Duration) *api.Session {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s, err := c.GetSession(context.Background(), sid)
		if err != nil {
			t.Fatal(err)
		}
		if s.Status == status {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s is %s (sandbox %s) after %v, want %s", sid, s.Status, s.SandboxState, within, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Lazy sandboxes: none until code runs, unless warm_up asks.
func TestLazyAndWarmUp(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	s := newSession(t, c, api.CreateSessionRequest{SessionID: "lazy", TemplateID: "python"})
	if s.SandboxState != api.SandboxNone || rs.sandboxesOf(t, "lazy") != 0 {
		t.Errorf("a new session has sandbox %s, %d in the runtime; want none", s.SandboxState, rs.sandboxesOf(t, "lazy"))
	}
	// Files work without a sandbox.
	if _, err := c.Upload(ctx, "lazy", client.UploadOptions{}, client.UploadFile{Name: "in.txt", Reader: strings.NewReader("data")}); err != nil {
		t.Fatal(err)
	}
	res := execOK(t, c, "lazy", api.ExecuteRequest{Code: "return open('/workspace/in.txt').read()"})
	if string(res.ReturnValue) != `"data"` {
		t.Errorf("first execution read %s", res.ReturnValue)
	}
	if s, _ := c.GetSession(ctx, "lazy"); s.SandboxState != api.SandboxRunning || rs.sandboxesOf(t, "lazy") != 1 {
		t.Errorf("after the first execution: sandbox %s, %d in the runtime; want running, 1", s.SandboxState, rs.sandboxesOf(t, "lazy"))
	}

	testenv.New(t).Rootfs(t, "python")
	w, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "warm", TemplateID: "python", WarmUp: true})
	if err != nil || w.Status != api.StatusPending || w.SandboxState != api.SandboxStarting {
		t.Fatalf("warm-up create: %+v %v", w, err)
	}
	w = waitStatus(t, c, "warm", api.StatusRunning, time.Minute)
	if w.SandboxState != api.SandboxRunning || rs.sandboxesOf(t, "warm") != 1 {
		t.Errorf("warmed-up session: sandbox %s, %d in the runtime", w.SandboxState, rs.sandboxesOf(t, "warm"))
	}
}

// The reaper pauses an idle sandbox, hibernates a session idle for longer
// and terminates one past its TTL; every call in between resumes the
// session transparently with its files.
func TestIdlePauseHibernateExpire(t *testing.T) {
	rs := startReal(t, t.TempDir(), func(c *app.Config) { c.ReapInterval = 100 * time.Millisecond })
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "idle", TemplateID: "python", IdleTimeout: 1, HibernateTimeout: 3, Timeout: 30})
	execOK(t, c, "idle", api.ExecuteRequest{Language: "bash", Code: plantTree})
	before := fingerprint(t, c, "idle")

	s := waitStatus(t, c, "idle", api.StatusPaused, 10*time.Second)
	if s.SandboxState != api.SandboxPaused || rs.sandboxState(t, "idle") != runtime.StatePaused {
		t.Errorf("idle session: sandbox %s, runtime %s; want both paused", s.SandboxState, rs.sandboxState(t, "idle"))
	}
	// A call thaws it, and the session is running again.
	if after := fingerprint(t, c, "idle"); after != before {
		t.Errorf("workspace changed across a pause:\n%s\n%s", before, after)
	}
	if s, _ := c.GetSession(ctx, "idle"); s.Status != api.StatusRunning {
		t.Errorf("after an execution on a paused session: %s", s.Status)
	}

	s = waitStatus(t, c, "idle", api.StatusHibernated, 15*time.Second)
	if s.SandboxState != api.SandboxNone || rs.sandboxesOf(t, "idle") != 0 {
		t.Errorf("hibernated: sandbox %s, %d in the runtime", s.SandboxState, rs.sandboxesOf(t, "idle"))
	}
	// The record says hibernated a moment before the workspace is moved
	// to the trash, under the session's lock.
	gone := func() bool {
		_, err := os.Stat(filepath.Join(rs.dir, "workspaces", "default", "idle"))
		return errors.Is(err, os.ErrNotExist)
	}
	for deadline := time.Now().Add(30 * time.Second); !gone() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if !gone() {
		t.Errorf("a hibernated session's workspace is still on the host")
	}
	// A file call restores it.
	var buf bytes.Buffer
	if _, err := c.Download(ctx, "idle", "deep/er/est/a.txt", &buf); err != nil || buf.String() != "hello\n" {
		t.Errorf("download from a hibernated session: %q %v", buf.String(), err)
	}
	if s, _ := c.GetSession(ctx, "idle"); s.Status != api.StatusRunning {
		t.Errorf("after a file call on a hibernated session: %s", s.Status)
	}
	if after := fingerprint(t, c, "idle"); after != before {
		t.Errorf("workspace changed across hibernation:\n%s\n%s", before, after)
	}

	// Keepalive moves the end; without it the session expires.
	if _, err := c.Keepalive(ctx, "idle", 2); err != nil {
		t.Fatal(err)
	}
	s = waitStatus(t, c, "idle", api.StatusTerminated, 10*time.Second)
	if !strings.Contains(s.Error, "expired") || rs.sandboxesOf(t, "idle") != 0 {
		t.Errorf("expired session: %+v, %d sandboxes", s, rs.sandboxesOf(t, "idle"))
	}
	if _, err := c.Execute(ctx, "idle", api.ExecuteRequest{Code: "1"}); err == nil {
		t.Error("execute on an expired session worked")
	}
}

// Hibernation keeps every byte, mode, owner, time and link, and nothing of
// the processes.
func TestHibernateRestoreKeepsEveryByte(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "hib", TemplateID: "python"})
	execOK(t, c, "hib", api.ExecuteRequest{Language: "bash", Code: plantTree})
	if _, err := c.Upload(ctx, "hib", client.UploadOptions{ConversationID: "c1", Subdir: "temparea"},
		client.UploadFile{Name: "q.txt", Reader: strings.NewReader("for c1")}); err != nil {
		t.Fatal(err)
	}
	before := fingerprint(t, c, "hib")
	s, err := c.HibernateSession(ctx, "hib")
	if err != nil || s.Status != api.StatusHibernated {
		t.Fatalf("hibernate: %+v %v", s, err)
	}
	if _, err := c.PauseSession(ctx, "hib"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("pausing a hibernated session: %v, want failed precondition", err)
	}
	if after := fingerprint(t, c, "hib"); after != before {
		t.Errorf("workspace changed across hibernation:\n%s\n%s", before, after)
	}
	// Hibernating again, with nothing changed, stores nothing new; the
	// second restore is as good as the first.
	if _, err := c.HibernateSession(ctx, "hib"); err != nil {
		t.Fatal(err)
	}
	if s, err := c.ResumeSession(ctx, "hib"); err != nil || s.Status != api.StatusRunning {
		t.Fatalf("resume a hibernated session: %+v %v", s, err)
	}
	if after := fingerprint(t, c, "hib"); after != before {
		t.Errorf("workspace changed across a second hibernation")
	}
	// The conversation's temp area came back as it was: its view works,
	// and it is still read-only to code.
	res := execOK(t, c, "hib", api.ExecuteRequest{ConversationID: "c1", Code: "return open('/workspace/uploads/temparea/q.txt').read()"})
	if string(res.ReturnValue) != `"for c1"` {
		t.Errorf("conversation upload after hibernation: %s", res.ReturnValue)
	}
	if res, _ := c.Execute(ctx, "hib", api.ExecuteRequest{ConversationID: "c1", Code: "open('/workspace/uploads/temparea/x','w')"}); res == nil || res.Status != api.ExecFailed {
		t.Errorf("the temp area became writable across hibernation: %+v", res)
	}
}

func TestSnapshots(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "snap", TemplateID: "python"})
	execOK(t, c, "snap", api.ExecuteRequest{Language: "bash", Code: plantTree})
	before := fingerprint(t, c, "snap")
	s1, err := c.CreateSnapshot(ctx, "snap")
	if err != nil {
		t.Fatal(err)
	}
	if s1.Files != 4 || s1.Symlinks != 3 || s1.Bytes < 3_000_000 || s1.NewBytes == nil || *s1.NewBytes < 3_000_000 {
		t.Errorf("first snapshot: %+v", s1)
	}
	// Unchanged content is not stored twice.
	execOK(t, c, "snap", api.ExecuteRequest{Language: "bash", Code: "echo changed > /workspace/one; rm -r /workspace/empty"})
	s2, err := c.CreateSnapshot(ctx, "snap")
	if err != nil {
		t.Fatal(err)
	}
	if s2.NewBytes == nil || *s2.NewBytes > 100 {
		t.Errorf("second snapshot after a small change stored %v bytes", s2.NewBytes)
	}
	list, err := c.ListSnapshots(ctx, "snap")
	if err != nil || len(list) != 2 || list[0].SnapshotID != s1.SnapshotID || list[1].SnapshotID != s2.SnapshotID {
		t.Fatalf("list: %+v %v", list, err)
	}
	// Restore replaces the workspace, and the sandbox with it.
	if s, err := c.RestoreSnapshot(ctx, "snap", s1.SnapshotID); err != nil || s.Status != api.StatusRunning || s.SandboxState != api.SandboxNone {
		t.Fatalf("restore: %+v %v", s, err)
	}
	if after := fingerprint(t, c, "snap"); after != before {
		t.Errorf("restored workspace differs from the snapshot's:\n%s\n%s", before, after)
	}
	if err := c.DeleteSnapshot(ctx, "snap", s2.SnapshotID); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{s2.SnapshotID, "snap-nope", "../hibernated"} {
		if _, err := c.GetSnapshot(ctx, "snap", id); !client.IsNotFound(err) {
			t.Errorf("get snapshot %q: %v, want not found", id, err)
		}
		if _, err := c.RestoreSnapshot(ctx, "snap", id); !client.IsNotFound(err) {
			t.Errorf("restore snapshot %q: %v, want not found", id, err)
		}
	}
	// Another session cannot restore this one's snapshot.
	newSession(t, c, api.CreateSessionRequest{SessionID: "other", TemplateID: "python"})
	if _, err := c.RestoreSnapshot(ctx, "other", s1.SnapshotID); !client.IsNotFound(err) {
		t.Errorf("restoring another session's snapshot: %v, want not found", err)
	}
}

// A sandbox killed from outside loses no file: the next call gets a new
// sandbox over the same workspace.
func TestSandboxKilledFromOutside(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "victim", TemplateID: "python"})
	execOK(t, c, "victim", api.ExecuteRequest{Code: "open('/workspace/kept.txt','w').write('kept')"})
	kill := func() {
		infos, _ := rs.rt.List(ctx)
		for _, info := range infos {
			if info.Labels[sandbox.LabelSession] == "victim" {
				if err := rs.rt.Stop(ctx, info.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	kill()
	res := execOK(t, c, "victim", api.ExecuteRequest{Code: "return open('/workspace/kept.txt').read()"})
	if string(res.ReturnValue) != `"kept"` {
		t.Errorf("after the sandbox was killed: %s", res.ReturnValue)
	}
	if n := rs.sandboxesOf(t, "victim"); n != 1 {
		t.Errorf("%d sandboxes after recovery, want 1", n)
	}
	// Killed in the middle of an execution: that one fails, clearly; the
	// next works.
	sub, err := c.Submit(ctx, "victim", api.ExecuteRequest{Code: "import time\ntime.sleep(30)"})
	if err != nil {
		t.Fatal(err)
	}
	for x, _ := c.GetExecution(ctx, sub.ExecutionID); x == nil || x.Status != api.ExecRunning; x, _ = c.GetExecution(ctx, sub.ExecutionID) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	kill()
	x, err := c.GetResult(ctx, sub.ExecutionID, true, 20*time.Second)
	if err != nil || x.Status != api.ExecFailed || x.Error == nil || !strings.Contains(x.Error.Message, "sandbox died") {
		t.Errorf("execution whose sandbox was killed: %+v %v", x, err)
	}
	execOK(t, c, "victim", api.ExecuteRequest{Code: "return open('/workspace/kept.txt').read()"})
}

// Past --max-sandboxes, executions get a retryable 503 while session and
// file calls go on working.
func TestDegradesWhenSandboxesRunOut(t *testing.T) {
	rs := startReal(t, t.TempDir(), func(c *app.Config) { c.MaxSandboxes = 1 })
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "first", TemplateID: "python"})
	execOK(t, c, "first", api.ExecuteRequest{Code: "1"})
	newSession(t, c, api.CreateSessionRequest{SessionID: "second", TemplateID: "python"})
	if _, err := c.Upload(ctx, "second", client.UploadOptions{}, client.UploadFile{Name: "f.txt", Reader: strings.NewReader("x")}); err != nil {
		t.Errorf("upload with no sandbox to be had: %v", err)
	}
	_, err := c.Execute(ctx, "second", api.ExecuteRequest{Code: "1"})
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || apiErr.RetryAfter <= 0 || !strings.Contains(apiErr.Message, "limit") {
		t.Fatalf("execute past the limit: %v, want 503 with Retry-After", err)
	}
	// Room again: the same call works.
	if _, err := c.DeleteSession(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	execOK(t, c, "second", api.ExecuteRequest{Code: "return open('/workspace/f.txt').read()"})
}

// kill -9 of the server during executions loses no session and no file;
// the executions in flight end as failed, and the sandboxes are adopted by
// the next server.
func TestServerKilled(t *testing.T) {
	env := testenv.New(t)
	testenv.New(t).Rootfs(t, "python")
	sbx := env.Sbx(t)
	dir, state := t.TempDir(), filepath.Join(env.StateRoot, "k9")
	rt, err := oci.New(oci.Config{StateDir: state, ExecutorPath: env.Executor})
	if err != nil {
		t.Fatal(err)
	}
	// sbx serve mounts the workspace image and, as in production, leaves
	// it mounted; the test unmounts it once the servers are killed.
	quotatest.Require(t)
	t.Cleanup(func() {
		if err := quota.Unmount(filepath.Join(dir, "workspaces")); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { destroySandboxes(t, rt) }) // after both servers are killed
	serve := func() (*exec.Cmd, *client.Client) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		cmd := exec.Command(sbx, "serve", "--addr", addr, "--data-dir", dir, "--state-dir", state,
			"--template-dir", testenv.TemplateDir(), "--prebuild", "")
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		ready := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if strings.Contains(sc.Text(), `"msg":"serving"`) {
					close(ready)
				}
				if testing.Verbose() {
					t.Log(sc.Text())
				}
			}
		}()
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			t.Fatal("sbx serve did not come up")
		}
		return cmd, client.New("http://" + addr)
	}
	cmd, c := serve()
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "k9", TemplateID: "python"})
	if _, err := c.Upload(ctx, "k9", client.UploadOptions{}, client.UploadFile{Name: "up.txt", Reader: strings.NewReader("uploaded")}); err != nil {
		t.Fatal(err)
	}
	execOK(t, c, "k9", api.ExecuteRequest{Language: "bash", Code: plantTree})
	before := fingerprint(t, c, "k9")
	var inflight []string
	for range 3 {
		sub, err := c.Submit(ctx, "k9", api.ExecuteRequest{Code: "import time\ntime.sleep(60)"})
		if err != nil {
			t.Fatal(err)
		}
		inflight = append(inflight, sub.ExecutionID)
	}
	time.Sleep(300 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	_, c = serve()
	for _, id := range inflight {
		x, err := c.GetResult(ctx, id, true, 10*time.Second)
		if err != nil || x.Status != api.ExecFailed || x.Error == nil {
			t.Errorf("execution in flight at the kill: %+v %v", x, err)
		}
	}
	if after := fingerprint(t, c, "k9"); after != before {
		t.Errorf("workspace changed across kill -9 of the server:\n%s\n%s", before, after)
	}
	var buf bytes.Buffer
	if _, err := c.Download(ctx, "k9", "up.txt", &buf); err != nil || buf.String() != "uploaded" {
		t.Errorf("upload after the kill: %q %v", buf.String(), err)
	}
	// The sandbox was adopted, not replaced.
	if n := countSandboxes(t, state)["k9"]; n != 1 {
		t.Errorf("%d sandboxes for the session after the restart, want 1", n)
	}
}

// countSandboxes counts the sandboxes of a state directory by session.
func countSandboxes(t *testing.T, state string) map[string]int {
	rt, err := oci.New(oci.Config{StateDir: state, ExecutorPath: testenv.New(t).Executor})
	if err != nil {
		t.Fatal(err)
	}
	infos, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, info := range infos {
		out[info.Labels[sandbox.LabelSession]]++
	}
	return out
}

// A warm pool hands a new session a ready sandbox with the
// session's files and variables, is refilled, and never lets one session
// see another's files or processes.
func TestWarmPool(t *testing.T) {
	testenv.New(t).Rootfs(t, "python")
	rs := startReal(t, t.TempDir(), func(c *app.Config) { c.Pools = map[string]int{"python": 1} })
	c := client.New(rs.URL)
	ctx := context.Background()
	waitPool := func() {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for rs.app.Sessions.PoolSizes()["python"] < 1 {
			if time.Now().After(deadline) {
				t.Fatal("the pool was not filled")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	pooledSandboxes := func() map[string]bool {
		out := map[string]bool{}
		infos, _ := rs.rt.List(ctx)
		for _, info := range infos {
			if info.Labels[sandbox.LabelPool] != "" {
				out[info.ID] = true
			}
		}
		return out
	}
	for _, sid := range []string{"p1", "p2"} {
		waitPool()
		ready := pooledSandboxes()
		if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid, TemplateID: "python", EnvVars: map[string]string{"WHO": sid}}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Upload(ctx, sid, client.UploadOptions{}, client.UploadFile{Name: "mine.txt", Reader: strings.NewReader("of " + sid)}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		res := execOK(t, c, sid, api.ExecuteRequest{Language: "bash", Code: `cat /workspace/mine.txt; echo " $WHO"; ls /workspace; touch /tmp/left-by-` + sid})
		t.Logf("%s: first execution from the pool took %v", sid, time.Since(start))
		if want := "of " + sid + " " + sid + "\nmine.txt\nuploads\n"; res.Stdout != want {
			t.Errorf("%s: stdout %q, want %q", sid, res.Stdout, want)
		}
		s, _ := c.GetSession(ctx, sid)
		if s.SandboxState != api.SandboxRunning || rs.sandboxesOf(t, sid) != 0 {
			t.Errorf("%s: %+v", sid, s)
		}
		// Its sandbox is the one that was ready in the pool.
		infos, _ := rs.rt.List(ctx)
		found := false
		for _, info := range infos {
			found = found || ready[info.ID] && info.State == runtime.StateRunning
		}
		if !found {
			t.Errorf("%s did not get the pooled sandbox", sid)
		}
		res = execOK(t, c, sid, api.ExecuteRequest{Language: "bash", Code: "ls /tmp"})
		if strings.Contains(res.Stdout, "left-by-p1") && sid == "p2" {
			t.Errorf("p2 sees what p1 left in /tmp: %q", res.Stdout)
		}
	}
	// A conversation's upload made before the first execution is there,
	// behind its view, in a sandbox from the pool.
	waitPool()
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "p3", TemplateID: "python"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(ctx, "p3", client.UploadOptions{ConversationID: "c9", Subdir: "temparea"},
		client.UploadFile{Name: "doc.txt", Reader: strings.NewReader("conversation file")}); err != nil {
		t.Fatal(err)
	}
	if res := execOK(t, c, "p3", api.ExecuteRequest{ConversationID: "c9", Code: "return open('/workspace/uploads/temparea/doc.txt').read()"}); string(res.ReturnValue) != `"conversation file"` {
		t.Errorf("conversation upload in a pooled sandbox: %s", res.ReturnValue)
	}
	// Uploads after the claim land where the sandbox sees them.
	if _, err := c.Upload(ctx, "p2", client.UploadOptions{}, client.UploadFile{Name: "later.txt", Reader: strings.NewReader("later")}); err != nil {
		t.Fatal(err)
	}
	if res := execOK(t, c, "p2", api.ExecuteRequest{Code: "return open('/workspace/later.txt').read()"}); string(res.ReturnValue) != `"later"` {
		t.Errorf("upload after the claim: %s", res.ReturnValue)
	}
	// A session with resources of its own starts cold.
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "big", TemplateID: "python", Resources: &api.Resources{Memory: 1024}}); err != nil {
		t.Fatal(err)
	}
	waitPool()
	execOK(t, c, "big", api.ExecuteRequest{Code: "1"})
	if rs.sandboxesOf(t, "big") != 1 {
		t.Error("a session with its own resources did not get a sandbox of its own")
	}
	// A restart adopts the pooled sandboxes sessions took.
	dir := rs.dir
	rs.stop()
	rs2 := startReal(t, dir)
	c2 := client.New(rs2.URL)
	if res := execOK(t, c2, "p1", api.ExecuteRequest{Language: "bash", Code: "cat /workspace/mine.txt; echo; ls /tmp"}); res.Stdout != "of p1\nleft-by-p1\n" {
		t.Errorf("p1 after a restart: %q (want its file, and its sandbox's /tmp)", res.Stdout)
	}
}
