package executor

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// idlePids lists the pre-forked workers the executor holds.
func (e *testEnv) idlePids() []int {
	e.srv.mu.Lock()
	z := e.srv.zyg
	e.srv.mu.Unlock()
	if z == nil {
		return nil
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	var pids []int
	for _, w := range z.idle {
		pids = append(pids, w.c.pid)
	}
	return pids
}

// TestPythonLeftoverProcessesDie is TestLeftoverProcessesDie for Python,
// whose result ends with the NUL that lets the executor take the worker's
// pidfd for the end of the run: nothing the run started may be alive when
// the result is back (no waitFor here, on purpose).
func TestPythonLeftoverProcessesDie(t *testing.T) {
	env := sharedEnv(t)
	for _, code := range []string{
		// A daemon in its own session, and a forked child that ignores
		// the signals a session's end sends.
		"import subprocess\nsubprocess.Popen(['sleep', '1000', %[1]q], start_new_session=True)\nreturn 'ok'",
		"import os, signal, time\nif os.fork() == 0:\n    signal.signal(signal.SIGHUP, signal.SIG_IGN)\n    os.execvp('sleep', ['sleep', '1000', %[1]q])\ntime.sleep(0.05)\nreturn 'ok'",
	} {
		m := marker(t)
		res := env.run(t, py(fmt.Sprintf(code, m)))
		if res.Status != wire.StatusCompleted || string(res.ReturnValue) != `"ok"` {
			t.Fatalf("%s %s %+v", res.Status, res.ReturnValue, res.Error)
		}
		if left := processesWith(m); len(left) > 0 {
			t.Errorf("a process outlived its execution: %v", left)
		}
	}
}

// TestEndAfterResult: what happens between the result and the exit (threads,
// atexit) still decides the outcome the way it did before the executor took
// pidfd exits as the end of a run: a crash there is reported from the wait
// status, and an os._exit there leaves the result's own exit code.
func TestEndAfterResult(t *testing.T) {
	env := sharedEnv(t)
	for _, tc := range []struct {
		name, code string
		status     wire.Status
		errType    string
		exit       int
	}{
		{name: "clean", code: "print('x')\nreturn 1", status: wire.StatusCompleted, exit: 0},
		{name: "exit code", code: "import sys\nsys.exit(3)", status: wire.StatusFailed, errType: "SystemExit", exit: 3},
		{name: "os._exit in atexit", code: "import atexit, os\natexit.register(os._exit, 3)\nreturn 1", status: wire.StatusCompleted, exit: 0},
		{name: "crash in atexit", code: "import atexit, ctypes\natexit.register(ctypes.string_at, 0)\nreturn 1", status: wire.StatusFailed, errType: wire.ErrTypeSignal, exit: 128 + 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := env.run(t, py(tc.code))
			errType := ""
			if res.Error != nil {
				errType = res.Error.Type
			}
			if res.Status != tc.status || errType != tc.errType || res.ExitCode != tc.exit {
				t.Errorf("got %s %q exit %d, want %s %q exit %d (%+v)", res.Status, errType, res.ExitCode, tc.status, tc.errType, tc.exit, res.Error)
			}
		})
	}
}

// TestPreforkedWorkers: runs go to the pre-forked worker the executor
// holds, the pool refills after each, a worker that died while idle is
// skipped, and a long run lets the zygote fork its successor meanwhile.
func TestPreforkedWorkers(t *testing.T) {
	env := startServer(t, testConfig(t)) // one warm worker by default
	defer env.stop()
	waitFor(t, "a pre-forked worker", func() bool { return len(env.idlePids()) == 1 })

	for i := range 3 {
		before := env.idlePids()
		res := env.run(t, py("import os\nreturn os.getpid()"))
		if res.Status != wire.StatusCompleted || string(res.ReturnValue) != "1" {
			t.Fatalf("run %d: %s %s %+v", i, res.Status, res.ReturnValue, res.Error)
		}
		waitFor(t, "the pool to refill", func() bool {
			p := env.idlePids()
			return len(p) == 1 && p[0] != before[0]
		})
	}

	// A worker that died while idle leaves the pool, and the run goes to
	// its successor or a fresh fork. (One that dies at the very moment a
	// run is sent to it takes the run along, as one dying at any moment
	// during a run would: the OOM killer's choice.)
	dead := env.idlePids()[0]
	// Its pid is the zygote's PID namespace's: signal it by its pidfd.
	env.srv.mu.Lock()
	z := env.srv.zyg
	env.srv.mu.Unlock()
	z.mu.Lock()
	victim := z.idle[0].c
	z.mu.Unlock()
	victim.kill()
	waitFor(t, "the dead worker to leave the pool", func() bool {
		p := env.idlePids()
		return len(p) == 0 || p[0] != dead
	})
	if res := env.run(t, py("return 2")); res.Status != wire.StatusCompleted || string(res.ReturnValue) != "2" {
		t.Fatalf("after an idle worker died: %s %s %+v", res.Status, res.ReturnValue, res.Error)
	}

	// A long run: its worker's successor is forked while it runs.
	waitFor(t, "a pre-forked worker", func() bool { return len(env.idlePids()) == 1 })
	taken := env.idlePids()[0]
	done := make(chan *wire.Result, 1)
	go func() {
		res, _ := env.client.Run(context.Background(), wire.RunRequest{ID: "long", Language: wire.LanguagePython, Code: "import time\ntime.sleep(60)"}, nil)
		done <- res
	}()
	waitFor(t, "a successor during the long run", func() bool {
		p := env.idlePids()
		return len(p) == 1 && p[0] != taken
	})
	select {
	case res := <-done:
		t.Fatalf("the long run ended early: %+v", res)
	default:
	}
	if ok, err := env.client.Cancel(context.Background(), "long"); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	if res := <-done; res == nil || res.Status != wire.StatusCancelled {
		t.Fatalf("long run: %+v", res)
	}
}

// TestRunBeforeReady: a run sent while the zygote is still starting waits
// in its queue and is the first thing it forks for.
func TestRunBeforeReady(t *testing.T) {
	cfg := testConfig(t)
	// A slow interpreter start, so that the run surely comes first.
	// Outside the control directory, which the zygote's mount namespace
	// covers with its own copy; readable by the sandbox user.
	dir, err := os.MkdirTemp("", "sbx-slow-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	slow := filepath.Join(dir, "slow-python")
	if err := os.WriteFile(slow, []byte("#!/bin/sh\nsleep 1\nexec "+testPython+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.Python = slow
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
	waitFor(t, "the socket", func() bool {
		c, err := net.Dial("unix", cfg.SocketPath)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	h, err := client.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.Ready {
		t.Fatal("ready before the slow interpreter started")
	}
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	res, err := client.Run(rctx, py("return 7"), nil)
	if err != nil || res.Status != wire.StatusCompleted || string(res.ReturnValue) != "7" {
		t.Fatalf("%v %+v", err, res)
	}
	if res.Error != nil && strings.Contains(res.Error.Message, "zygote") {
		t.Fatalf("%+v", res.Error)
	}
}

// TestZygoteKillLeavesNoGoroutine: kill of a zygote whose death no reaper
// reports (a shim that failed to start it, say) leaves nothing running
// to wait for it: the escalation to SIGKILL is a timer.
func TestZygoteKillLeavesNoGoroutine(t *testing.T) {
	cmd := exec.Command("sh", "-c", "trap '' TERM; sleep 30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	before := goleak.IgnoreCurrent()
	z := &zygote{proc: cmd.Process, dead: make(chan struct{})}
	z.kill()
	z.kill() // twice: one SIGKILL to come
	if err := goleak.Find(before); err != nil {
		t.Fatalf("kill left a goroutine: %v", err)
	}
	if t0 := z.hardKill.Load(); t0 == nil || !t0.Stop() {
		t.Fatal("no SIGKILL to come")
	}
}
