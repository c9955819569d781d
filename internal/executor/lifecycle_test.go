package executor

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

func marker(t testing.TB) string {
	b := make([]byte, 6)
	rand.Read(b)
	return "sbxmark" + hex.EncodeToString(b)
}

// TestTimeoutKillsTree: a timeout kills everything the execution started,
// daemons that left its session and double-forked orphans included.
func TestTimeoutKillsTree(t *testing.T) {
	env := sharedEnv(t)
	tests := []struct {
		name string
		req  func(m string) wire.RunRequest
	}{
		{"bash setsid nohup daemon", func(m string) wire.RunRequest {
			return sh(fmt.Sprintf("setsid nohup sleep 1000 %s >/dev/null 2>&1 &\nexec -a %s-fg sleep 1000", m, m))
		}},
		{"python double fork", func(m string) wire.RunRequest {
			return py(fmt.Sprintf(`import os, subprocess, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv('/bin/sleep', ['sleep', '1000', %[1]q])
    os._exit(0)
subprocess.Popen(['/bin/sleep', '1000', '%[1]s-popen'], start_new_session=True)
print('started', flush=True)
time.sleep(1000)`, m))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := marker(t)
			req := tc.req(m)
			req.TimeoutMs = 1500
			res := env.run(t, req)
			if res.Status != wire.StatusTimeout || res.Error == nil || res.Error.Type != wire.ErrTypeTimeout {
				t.Fatalf("status %s error %+v, want timeout", res.Status, res.Error)
			}
			if res.ExitCode != 128+9 {
				t.Errorf("exit code %d, want 137", res.ExitCode)
			}
			if left := processesWith(m); len(left) > 0 {
				t.Errorf("processes survived the timeout: %v", left)
			}
		})
	}
}

// TestLeftoverProcessesDie: a run that ends normally leaves nothing
// behind either.
func TestLeftoverProcessesDie(t *testing.T) {
	env := sharedEnv(t)
	m := marker(t)
	res := env.run(t, sh(fmt.Sprintf("setsid nohup sleep 1000 %s >/dev/null 2>&1 &\necho ok", m)))
	if res.Status != wire.StatusCompleted || res.Stdout != "ok\n" {
		t.Fatalf("%s %q %+v", res.Status, res.Stdout, res.Error)
	}
	if left := processesWith(m); len(left) > 0 {
		t.Errorf("daemon outlived its execution: %v", left)
	}
}

func TestCancel(t *testing.T) {
	env := sharedEnv(t)
	t.Run("by id", func(t *testing.T) {
		m := marker(t)
		req := sh(fmt.Sprintf("echo started; exec -a %s sleep 1000", m))
		req.ID = "cancel-" + m
		got := make(chan *wire.Result, 1)
		started := make(chan struct{})
		var once sync.Once
		go func() {
			res, err := env.client.Run(context.Background(), req, func(_, _ string) { once.Do(func() { close(started) }) })
			if err != nil {
				t.Errorf("run: %v", err)
			}
			got <- res
		}()
		<-started
		ok, err := env.client.Cancel(context.Background(), req.ID)
		if err != nil || !ok {
			t.Fatalf("cancel: %v %v", ok, err)
		}
		res := <-got
		if res == nil || res.Status != wire.StatusCancelled || res.Error == nil || res.Error.Type != wire.ErrTypeCancelled {
			t.Fatalf("result %+v", res)
		}
		if left := processesWith(m); len(left) > 0 {
			t.Errorf("survived cancel: %v", left)
		}
		if ok, err := env.client.Cancel(context.Background(), req.ID); ok || err != nil {
			t.Errorf("cancel of a finished run: %v %v", ok, err)
		}
	})
	t.Run("client disconnects", func(t *testing.T) {
		m := marker(t)
		req := sh(fmt.Sprintf("echo started; exec -a %s sleep 1000", m))
		ctx, cancel := context.WithCancel(context.Background())
		_, err := env.client.Run(ctx, req, func(_, _ string) { cancel() })
		if !errors.Is(err, context.Canceled) {
			t.Errorf("run after disconnect: %v", err)
		}
		waitFor(t, "the execution to be killed", func() bool { return len(processesWith(m)) == 0 })
		waitFor(t, "no execution to be running", func() bool {
			st, err := env.client.Stats(context.Background())
			return err == nil && st.RunningExecutions == 0
		})
	})
}

// TestOutputCap prints 100 MB: the result keeps the cap and a marker, the
// executor's memory does not follow the output.
func TestOutputCap(t *testing.T) {
	env := sharedEnv(t)
	req := py("import sys\nline = 'x' * 99 + '\\n'\nfor _ in range(1_000_000):\n    sys.stdout.write(line)\nprint('to stderr', file=sys.stderr)")
	req.OutputLimitBytes = 1 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var streamed strings.Builder
	res, err := env.client.Run(context.Background(), req, func(stream, data string) {
		if stream == "stdout" {
			streamed.WriteString(data)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if res.Status != wire.StatusCompleted || !res.StdoutTruncated || res.StderrTruncated {
		t.Fatalf("status %s truncated %v/%v error %+v", res.Status, res.StdoutTruncated, res.StderrTruncated, res.Error)
	}
	wantMarker := fmt.Sprintf("[sbx: output truncated, %d bytes omitted]\n", 100_000_000-(1<<20))
	if !strings.HasSuffix(res.Stdout, "\n"+wantMarker) || len(res.Stdout) != 1<<20+1+len(wantMarker) {
		t.Errorf("stdout is %d bytes ending %q", len(res.Stdout), tail(res.Stdout, 80))
	}
	if streamed.String() != res.Stdout {
		t.Errorf("streamed stdout (%d bytes) differs from the result's (%d)", streamed.Len(), len(res.Stdout))
	}
	if res.Stderr != "to stderr\n" {
		t.Errorf("stderr %q", res.Stderr)
	}
	// The whole test process (client included) allocated far less than
	// the 100 MB that went through the pipe.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 40<<20 {
		t.Errorf("allocated %d MB while 100 MB of output went by", alloc>>20)
	}
}

// TestStreaming: output arrives while the code still runs. The code waits
// for a file the test writes only after it saw the first line, so the test
// hangs (and fails) rather than races if streaming does not work.
func TestStreaming(t *testing.T) {
	env := sharedEnv(t)
	gate := filepath.Join(env.ws, "gate-"+marker(t))
	code := fmt.Sprintf("import os, time, sys\nprint('first')\nprint('err', file=sys.stderr)\nwhile not os.path.exists(%q):\n    time.sleep(0.01)\nprint('second')\nreturn 'done'", gate)
	var events []string
	res, err := env.client.Run(context.Background(), py(code), func(stream, data string) {
		events = append(events, stream+":"+data)
		if data == "first\n" {
			os.WriteFile(gate, nil, 0o644)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != wire.StatusCompleted || string(res.ReturnValue) != `"done"` {
		t.Fatalf("%s %s %+v", res.Status, res.ReturnValue, res.Error)
	}
	// Two pipes have no order between them: only each stream's own order
	// is kept.
	var stdout []string
	for _, e := range events {
		if s, ok := strings.CutPrefix(e, "stdout:"); ok {
			stdout = append(stdout, s)
		}
	}
	if strings.Join(stdout, "") != "first\nsecond\n" || len(events) != 3 {
		t.Errorf("events %q", events)
	}
}

// TestStreamingUTF8: multi-byte characters written a byte at a time are
// never split across events.
func TestStreamingUTF8(t *testing.T) {
	env := sharedEnv(t)
	code := "import os, time\ns = ('héllo wörld €😀' * 50).encode()\nfor i in range(0, len(s), 7):\n    os.write(1, s[i:i+7])\n    time.sleep(0.0005)"
	var got strings.Builder
	res, err := env.client.Run(context.Background(), py(code), func(stream, data string) {
		if strings.ContainsRune(data, '\uFFFD') {
			t.Errorf("event with a replacement character: %q", data)
		}
		got.WriteString(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Repeat("héllo wörld €😀", 50)
	if got.String() != want || res.Stdout != want {
		t.Errorf("streamed %q\nresult %q", got.String(), res.Stdout)
	}
}

func TestArtifacts(t *testing.T) {
	env := sharedEnv(t)
	dir := filepath.Join(env.ws, "art-"+marker(t))
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"untouched.txt", "modified.txt"} {
		os.WriteFile(filepath.Join(dir, f), []byte("old"), 0o644)
	}
	os.WriteFile(filepath.Join(dir, "replaced.txt"), []byte("old"), 0o644)
	if err := chownSandboxUser(dir); err != nil {
		t.Fatal(err)
	}
	os.Symlink("/etc", filepath.Join(dir, "etc-link"))
	rel, _ := filepath.Rel(env.ws, dir)
	code := fmt.Sprintf(`import os
os.chdir(%q)
open('new.csv', 'w').write('a,b\n')
open('sub/deep.png', 'wb').write(b'png')
open('modified.txt', 'a').write('more')
open('replaced.tmp', 'w').write('new')
os.replace('replaced.tmp', 'replaced.txt')
os.symlink('new.csv', 'link.csv')
os.mkdir('emptydir')`, dir)
	res := env.run(t, py(code))
	if res.Status != wire.StatusCompleted {
		t.Fatalf("%s %+v", res.Status, res.Error)
	}
	var want []string
	for _, f := range []string{"modified.txt", "new.csv", "replaced.txt", "sub/deep.png"} {
		want = append(want, rel+"/"+f)
	}
	if strings.Join(res.Artifacts, ",") != strings.Join(want, ",") || res.ArtifactsTruncated {
		t.Errorf("artifacts %v (truncated %v), want %v", res.Artifacts, res.ArtifactsTruncated, want)
	}
	// A run that writes nothing lists nothing.
	if res := env.run(t, py("x = 1")); len(res.Artifacts) != 0 {
		t.Errorf("artifacts of a run that wrote nothing: %v", res.Artifacts)
	}
}

// chownSandboxUser gives the tree to the sandbox user.
func chownSandboxUser(dir string) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 1000, 1000)
	})
}

func TestContexts(t *testing.T) {
	env := sharedEnv(t)
	id := "ctx-" + marker(t)
	run := func(code string, timeout int64) *wire.Result {
		req := py(code)
		req.ContextID, req.TimeoutMs = id, timeout
		return env.run(t, req)
	}
	if res := run("counter = 41\nimport os\nreturn os.getpid()", 0); res.Status != wire.StatusCompleted || string(res.ReturnValue) != "1" {
		t.Fatalf("first run: %s %s %+v", res.Status, res.ReturnValue, res.Error)
	}
	if res := run("counter += 1\nreturn counter", 0); string(res.ReturnValue) != "42" {
		t.Fatalf("state not kept: %s %+v", res.ReturnValue, res.Error)
	}
	// Output of separate runs stays separate, handler is called only when
	// the run defines it.
	if res := run("def handler(event):\n    return 'h'\nprint('one')", 0); res.Stdout != "one\n" || string(res.ReturnValue) != `"h"` {
		t.Errorf("handler run: %q %s", res.Stdout, res.ReturnValue)
	}
	if res := run("print('two')", 0); res.Stdout != "two\n" || res.ReturnValue != nil {
		t.Errorf("second run: %q %s", res.Stdout, res.ReturnValue)
	}
	// Exceptions and sys.exit do not end the context.
	if res := run("raise KeyError('k')", 0); res.Status != wire.StatusFailed || res.Error.Type != "KeyError" {
		t.Errorf("exception: %s %+v", res.Status, res.Error)
	}
	if res := run("import sys\nsys.exit(2)", 0); res.Status != wire.StatusFailed || res.ExitCode != 2 {
		t.Errorf("sys.exit: %s %d", res.Status, res.ExitCode)
	}
	if res := run("return counter", 0); string(res.ReturnValue) != "42" {
		t.Fatalf("state lost after errors: %s %+v", res.ReturnValue, res.Error)
	}
	// A timeout kills the context; the next run starts afresh.
	res := run("import time\ntime.sleep(1000)", 500)
	if res.Status != wire.StatusTimeout || !strings.Contains(res.Error.Message, "state") {
		t.Fatalf("timeout: %s %+v", res.Status, res.Error)
	}
	if res := run("return 'counter' in globals()", 0); res.Status != wire.StatusCompleted || string(res.ReturnValue) != "false" {
		t.Fatalf("after timeout: %s %s %+v", res.Status, res.ReturnValue, res.Error)
	}
	// Runs in one context are serialized.
	var wg sync.WaitGroup
	results := make([]*wire.Result, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = run("import time\nn = globals().get('n', 0)\ntime.sleep(0.02)\nn = n + 1\nreturn n", 0)
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, r := range results {
		seen[string(r.ReturnValue)] = true
	}
	if len(seen) != 4 {
		t.Errorf("concurrent runs in one context interleaved: %v", seen)
	}
	if st, _ := env.client.Stats(context.Background()); st == nil || st.Contexts < 1 {
		t.Errorf("stats: %+v", st)
	}
	// Delete.
	if err := env.client.DeleteContext(context.Background(), "", id); err != nil {
		t.Fatal(err)
	}
	if err := env.client.DeleteContext(context.Background(), "", id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if res := run("return 'counter' in globals()", 0); string(res.ReturnValue) != "false" {
		t.Errorf("state survived delete: %s", res.ReturnValue)
	}
	env.client.DeleteContext(context.Background(), "", id)
}

func TestContextLimit(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxContexts = 2
	env := startServer(t, cfg)
	defer env.stop()
	for i := range 2 {
		req := py("x = 1")
		req.ContextID = fmt.Sprint("c", i)
		if res := env.run(t, req); res.Status != wire.StatusCompleted {
			t.Fatalf("context %d: %+v", i, res.Error)
		}
	}
	req := py("x = 1")
	req.ContextID = "c3"
	_, err := env.client.Run(context.Background(), req, nil)
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("third context: %v", err)
	}
	// Deleting a context while it runs cancels the run.
	req = py("import time\nprint('go', flush=True)\ntime.sleep(1000)")
	req.ContextID = "c0"
	got := make(chan *wire.Result, 1)
	go func() {
		res, _ := env.client.Run(context.Background(), req, func(_, _ string) {
			env.client.DeleteContext(context.Background(), "", "c0")
		})
		got <- res
	}()
	if res := <-got; res == nil || res.Status != wire.StatusCancelled {
		t.Errorf("run of a deleted context: %+v", res)
	}
}

// TestConcurrent runs 8 executions that are all alive at once (each waits
// until all have started), each PID 1 of its own namespace.
func TestConcurrent(t *testing.T) {
	env := sharedEnv(t)
	const n = 8
	dir := filepath.Join(env.ws, "barrier-"+marker(t))
	os.Mkdir(dir, 0o777)
	os.Chmod(dir, 0o777)
	code := fmt.Sprintf(`import os, time
open(os.path.join(%[1]q, str(EVENT)), 'w').close()
while len(os.listdir(%[1]q)) < %[2]d:
    time.sleep(0.01)
return [os.getpid(), os.readlink('/proc/self/ns/pid')]`, dir, n)
	var wg sync.WaitGroup
	results := make([]*wire.Result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = env.run(t, py(strings.Replace(code, "EVENT", fmt.Sprint(i), 1)))
		}()
	}
	wg.Wait()
	namespaces := map[string]bool{}
	for i, r := range results {
		var v []any
		if r.Status != wire.StatusCompleted || json.Unmarshal(r.ReturnValue, &v) != nil || len(v) != 2 {
			t.Fatalf("run %d: %s %s %+v", i, r.Status, r.ReturnValue, r.Error)
		}
		if v[0] != float64(1) {
			t.Errorf("run %d is pid %v in its namespace, want 1", i, v[0])
		}
		namespaces[v[1].(string)] = true
	}
	if len(namespaces) != n {
		t.Errorf("%d runs alive at once shared PID namespaces: %v", n, namespaces)
	}
}

// TestPrivileges: user code runs as uid/gid 1000 without groups or any
// capability, with no_new_privs and the inner seccomp filter, which stops
// it from making namespaces.
func TestPrivileges(t *testing.T) {
	env := sharedEnv(t)
	res := env.run(t, py(`import ctypes, os
status = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
keys = ['Uid', 'Gid', 'Groups', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp']
libc = ctypes.CDLL(None, use_errno=True)
out = {k: status.get(k, '').split() for k in keys}
out['unshare_user'] = libc.unshare(0x10000000) == 0 or os.strerror(ctypes.get_errno())
out['unshare_mount'] = libc.unshare(0x00020000) == 0 or os.strerror(ctypes.get_errno())
out['oom_score_adj'] = open('/proc/self/oom_score_adj').read().strip()
out['groups'] = os.getgroups()
return out`))
	if res.Status != wire.StatusCompleted {
		t.Fatalf("%s %+v", res.Status, res.Error)
	}
	var got map[string]any
	json.Unmarshal(res.ReturnValue, &got)
	want := map[string]any{
		"Uid": []any{"1000", "1000", "1000", "1000"}, "Gid": []any{"1000", "1000", "1000", "1000"},
		"Groups": []any{}, "CapInh": []any{"0000000000000000"}, "CapPrm": []any{"0000000000000000"},
		"CapEff": []any{"0000000000000000"}, "CapBnd": []any{"0000000000000000"}, "CapAmb": []any{"0000000000000000"},
		"NoNewPrivs": []any{"1"}, "Seccomp": []any{"2"},
		"unshare_user": "Operation not permitted", "unshare_mount": "Operation not permitted",
		"oom_score_adj": "1000", "groups": []any{},
	}
	for k, w := range want {
		if fmt.Sprint(got[k]) != fmt.Sprint(w) {
			t.Errorf("%s = %v, want %v", k, got[k], w)
		}
	}
	// bash too, and the tools agents reach for.
	res = env.run(t, sh("id -u; id -g; id -G; unshare -U true 2>&1; echo rc=$?"))
	if !strings.HasPrefix(res.Stdout, "1000\n1000\n1000\n") || !strings.Contains(res.Stdout, "rc=1") {
		t.Errorf("bash: %q", res.Stdout)
	}
	// The control directory is root's: user code sees the zygote's
	// read-only copy of the scripts in its place, never the socket.
	res = env.run(t, py(fmt.Sprintf(`import os
d = %q
names = sorted(os.listdir(d))
try:
    open(os.path.join(d, 'planted'), 'w').close()
    wrote = 'wrote'
except OSError as e:
    wrote = e.strerror
return [names, wrote]`, filepath.Dir(env.sock))))
	if got := string(res.ReturnValue); strings.Contains(got, "executor.sock") || strings.Contains(got, "wrote") || res.Status != wire.StatusCompleted {
		t.Errorf("control dir as user code sees it: %s %+v", got, res.Error)
	}
}

// TestZygoteCrash: a dead zygote fails the executions it had with a clear
// error, and is restarted.
func TestZygoteCrash(t *testing.T) {
	env := startServer(t, testConfig(t))
	defer env.stop()
	m := marker(t)
	got := make(chan *wire.Result, 1)
	var once sync.Once
	go func() {
		res, err := env.client.Run(context.Background(), py(fmt.Sprintf("import subprocess, time\nsubprocess.Popen(['sleep', '1000', %q])\nprint('up', flush=True)\ntime.sleep(1000)", m)), func(_, _ string) {
			once.Do(func() {
				env.srv.mu.Lock()
				z := env.srv.zyg
				env.srv.mu.Unlock()
				z.kill()
			})
		})
		if err != nil {
			t.Error(err)
		}
		got <- res
	}()
	res := <-got
	if res == nil || res.Status != wire.StatusFailed || res.Error.Type != wire.ErrTypeExecutor || !strings.Contains(res.Error.Message, "zygote died") {
		t.Fatalf("result %+v", res)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := env.client.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if res := env.run(t, py("return 'again'")); string(res.ReturnValue) != `"again"` {
		t.Errorf("after restart: %s %+v", res.Status, res.Error)
	}
	waitFor(t, "the killed run's processes to go", func() bool { return len(processesWith(m)) == 0 })
}

// TestSlowClient: a client that stops reading does not stop the process:
// the executor keeps draining its pipes, and the client later gets
// everything up to the cap.
func TestSlowClient(t *testing.T) {
	env := sharedEnv(t)
	conn, err := net.Dial("unix", env.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	id := "slow-" + marker(t)
	body := `{"id":"` + id + `","language":"python","code":"import sys\nfor i in range(200000):\n    sys.stdout.write('%099d\\n' % i)\nreturn 'finished'","output_limit_bytes":4194304}`
	fmt.Fprintf(conn, "POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Not reading: 20 MB are written while the socket's buffers hold far
	// less. The run still finishes.
	waitFor(t, "the run to finish while its client is not reading", func() bool {
		for _, line := range strings.Split(env.logs.String(), "\n") {
			if strings.Contains(line, `"msg":"execution finished","id":"`+id+`"`) {
				return strings.Contains(line, `"status":"completed"`)
			}
		}
		return false
	})
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	var streamed int
	for {
		var ev wire.Event
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("stream ended: %v", err)
		}
		if ev.Type == "result" {
			if ev.Result.Status != wire.StatusCompleted || string(ev.Result.ReturnValue) != `"finished"` || !ev.Result.StdoutTruncated {
				t.Errorf("result %s %s truncated %v", ev.Result.Status, ev.Result.ReturnValue, ev.Result.StdoutTruncated)
			}
			if streamed != len(ev.Result.Stdout) {
				t.Errorf("streamed %d bytes, result has %d", streamed, len(ev.Result.Stdout))
			}
			return
		}
		streamed += len(ev.Data)
	}
}

// TestWithoutWarmWorkers covers the path where every run waits for its
// own fork, one at a time and several at once.
func TestWithoutWarmWorkers(t *testing.T) {
	cfg := testConfig(t)
	cfg.WarmWorkers = -1
	env := startServer(t, cfg)
	defer env.stop()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := env.run(t, py(fmt.Sprintf("import os\nreturn [os.getpid(), %d]", i)))
			if string(res.ReturnValue) != fmt.Sprintf("[1,%d]", i) {
				t.Errorf("run %d: %s %+v", i, res.ReturnValue, res.Error)
			}
		}()
	}
	wg.Wait()
	if res := env.run(t, sh("echo $$")); res.Stdout != "1\n" {
		t.Errorf("bash: %q %+v", res.Stdout, res.Error)
	}
}

// TestZygoteStartFailureSaysWhy: when the shim cannot start the zygote,
// /health says why (the shim's words, not the zygote's), and the executor
// keeps trying.
func TestZygoteStartFailureSaysWhy(t *testing.T) {
	cfg := testConfig(t)
	cfg.Python = "/nonexistent/python3"
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ctx) }()
	defer func() {
		cancel()
		<-errc
		os.RemoveAll(cfg.Workspace)
		os.RemoveAll(filepath.Dir(cfg.SocketPath))
	}()
	client := client.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", cfg.SocketPath)
	})
	defer client.Close()
	var h *wire.Health
	waitFor(t, "health to say why the zygote is not there", func() bool {
		h, err = client.Health(ctx)
		return err == nil && h.PreloadError != ""
	})
	if h.Ready || !strings.Contains(h.PreloadError, "/nonexistent/python3") || !strings.Contains(h.PreloadError, "no such file") {
		t.Errorf("health %+v", h)
	}
}
