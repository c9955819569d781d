package execution

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// TestSubmitWait: a run's result, as the waiter gets it and as the store
// keeps it, and the session's sandbox started for it.
func TestSubmitWait(t *testing.T) {
	h := newHarness(t)
	h.session(t, "s")
	r := h.submit(t, "s", api.ExecuteRequest{Code: "import os\nprint('hi')\nprint('oops', file=__import__('sys').stderr)\nreturn int(os.environ['N']) + 1", EnvVars: map[string]string{"N": "41"}})
	x := h.wait(t, h.svc, r.ID())
	if x.Status != api.ExecCompleted || x.Stdout != "hi\n" || x.Stderr != "oops\n" || string(x.ReturnValue) != "42" ||
		x.ExitCode == nil || *x.ExitCode != 0 || x.Error != nil || x.StartedAt == nil || x.FinishedAt == nil {
		t.Fatalf("result: %+v", x)
	}
	rec, err := h.st.GetExecution(context.Background(), "t", r.ID())
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != api.ExecCompleted || rec.SessionID != "s" || rec.Owner != "me" || rec.StartedAt.IsZero() || rec.FinishedAt.IsZero() {
		t.Errorf("record: %+v", rec)
	}
	var stored api.Execution
	if err := json.Unmarshal(rec.Result, &stored); err != nil || stored.Stdout != "hi\n" || string(stored.ReturnValue) != "42" {
		t.Errorf("stored result: %+v %v", stored, err)
	}
	var req storedRequest
	if err := json.Unmarshal(rec.Request, &req); err != nil || req.EnvNames[0] != "N" || strings.Contains(string(rec.Request), "41") {
		t.Errorf("stored request: %s %v: want the variable's name, never its value", rec.Request, err)
	}
	// Out of memory, the record answers.
	if h.svc.Live("t", r.ID()) != nil {
		t.Error("a finished execution is still live")
	}
	got, err := h.svc.Get(context.Background(), "t", r.ID(), true)
	if err != nil || got.Stdout != "hi\n" || string(got.ReturnValue) != "42" {
		t.Errorf("get: %+v %v", got, err)
	}
	if _, err := h.svc.Get(context.Background(), "other", r.ID(), true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's get: %v, want not found", err)
	}
	list, _, err := h.svc.List(context.Background(), "t", "s", 10, "")
	if err != nil || len(list) != 1 || list[0].ExecutionID != r.ID() || list[0].Stdout != "" {
		t.Errorf("list: %+v %v", list, err)
	}
	if l := h.sandboxes(t); len(l) != 1 {
		t.Errorf("sandboxes: %+v, want the session's one", l)
	}
}

// TestTimeout: the executor stops code at its timeout and says so, with
// the output it had.
func TestTimeout(t *testing.T) {
	h := newHarness(t)
	h.session(t, "s")
	r := h.submit(t, "s", api.ExecuteRequest{Code: "import time\nprint('before', flush=True)\ntime.sleep(600)", Timeout: 0.5})
	x := h.wait(t, h.svc, r.ID())
	if x.Status != api.ExecTimeout || x.Error == nil || x.Error.Type != wire.ErrTypeTimeout || x.Stdout != "before\n" {
		t.Fatalf("result: %+v %+v", x, x.Error)
	}
	if rec, err := h.st.GetExecution(context.Background(), "t", r.ID()); err != nil || rec.Status != api.ExecTimeout {
		t.Errorf("record: %+v %v", rec, err)
	}
}

// TestCancel: a cancel stops the code, keeps what it printed, and is
// recorded; cancelling it again changes nothing.
func TestCancel(t *testing.T) {
	h := newHarness(t)
	h.session(t, "s")
	r := h.submit(t, "s", api.ExecuteRequest{Code: "import time\nprint('up', flush=True)\ntime.sleep(600)"})
	output(t, r, "up\n")
	x, err := h.svc.Cancel(context.Background(), "t", r.ID())
	if err != nil {
		t.Fatal(err)
	}
	if x.Status != api.ExecCancelled || x.Error == nil || x.Error.Type != wire.ErrTypeCancelled || x.Stdout != "up\n" {
		t.Fatalf("cancelled: %+v %+v", x, x.Error)
	}
	if rec, err := h.st.GetExecution(context.Background(), "t", r.ID()); err != nil || rec.Status != api.ExecCancelled {
		t.Errorf("record: %+v %v", rec, err)
	}
	if x, err := h.svc.Cancel(context.Background(), "t", r.ID()); err != nil || x.Status != api.ExecCancelled {
		t.Errorf("second cancel: %+v %v", x, err)
	}
	// The sandbox is fine: the next run runs in it.
	if x := h.wait(t, h.svc, h.submit(t, "s", api.ExecuteRequest{Code: "return 1"}).ID()); x.Status != api.ExecCompleted {
		t.Errorf("after the cancel: %+v", x)
	}
	if l := h.sandboxes(t); len(l) != 1 {
		t.Errorf("sandboxes: %+v, want one", l)
	}
}

// TestCancelThroughStore: a replica that does not run an execution
// cancels it through the store (a cancel/ID lease), which the replica
// running it watches.
func TestCancelThroughStore(t *testing.T) {
	alive := func(context.Context, string) (bool, error) { return true, nil }
	h := newHarness(t, func(o *Options) { o.Alive = alive })
	other := New(Options{Store: h.st, Sessions: h.m, Owner: "other", Alive: alive})
	defer other.Close()
	h.session(t, "s")
	r := h.submit(t, "s", api.ExecuteRequest{Code: "import time\nprint('up', flush=True)\ntime.sleep(600)"})
	output(t, r, "up\n")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	x, err := other.Cancel(ctx, "t", r.ID())
	if err != nil {
		t.Fatal(err)
	}
	if unfinished(x.Status) {
		// Cancel waits 10 seconds for the other replica: on a loaded
		// machine it may see the end later.
		x = h.wait(t, other, r.ID())
	}
	if x.Status != api.ExecCancelled || x.Error == nil || x.Error.Type != wire.ErrTypeCancelled || x.Stdout != "up\n" {
		t.Fatalf("cancelled through the store: %+v %+v", x, x.Error)
	}
	if mine := h.wait(t, h.svc, r.ID()); mine.Status != api.ExecCancelled {
		t.Errorf("the running replica's result: %+v", mine)
	}
}

// TestOutputOverLimit: output past the executor's limit is cut and said
// to be, in the answer and the record, and the record stays within its
// bound.
func TestOutputOverLimit(t *testing.T) {
	h := newHarness(t)
	h.session(t, "s")
	r := h.submit(t, "s", api.ExecuteRequest{Code: fmt.Sprintf("import sys\nsys.stdout.write('x' * %d)\nsys.stderr.write('e' * %d)", wire.DefaultOutputLimit+4096, 10)})
	x := h.wait(t, h.svc, r.ID())
	if x.Status != api.ExecCompleted || !x.StdoutTruncated || x.StderrTruncated || x.Stderr != strings.Repeat("e", 10) {
		t.Fatalf("result: status %s, stdout %d bytes truncated %v, stderr %q truncated %v", x.Status, len(x.Stdout), x.StdoutTruncated, x.Stderr, x.StderrTruncated)
	}
	if !strings.HasPrefix(x.Stdout, strings.Repeat("x", wire.DefaultOutputLimit)) || len(x.Stdout) > wire.DefaultOutputLimit+1024 {
		t.Errorf("stdout: %d bytes, want the limit's %d and a marker", len(x.Stdout), wire.DefaultOutputLimit)
	}
	rec, err := h.st.GetExecution(context.Background(), "t", r.ID())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Result) + len(rec.Request); n > MaxRecordBytes {
		t.Errorf("record of %d bytes, over %d", n, MaxRecordBytes)
	}
	var stored api.Execution
	if err := json.Unmarshal(rec.Result, &stored); err != nil || !stored.StdoutTruncated {
		t.Errorf("stored: truncated %v, %v", stored.StdoutTruncated, err)
	}
}

// TestBadRequest: every refusal is ErrInvalidArgument (400) before
// anything is recorded or started; an unknown session is ErrNotFound, a
// terminated one ErrFailedPrecondition.
func TestBadRequest(t *testing.T) {
	h := newHarness(t)
	h.session(t, "s")
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  api.ExecuteRequest
	}{
		{"no code", api.ExecuteRequest{}},
		{"negative timeout", api.ExecuteRequest{Code: "1", Timeout: -1}},
		{"NaN timeout", api.ExecuteRequest{Code: "1", Timeout: math.NaN()}},
		{"infinite timeout", api.ExecuteRequest{Code: "1", Timeout: math.Inf(1)}},
		{"timeout past the maximum", api.ExecuteRequest{Code: "1", Timeout: wire.MaxTimeoutMs/1000 + 1}},
		{"conversation id that is a path", api.ExecuteRequest{Code: "1", ConversationID: "../../etc"}},
		{"context id that is a path", api.ExecuteRequest{Code: "1", ContextID: "a/../../b"}},
		{"unknown language", api.ExecuteRequest{Code: "1", Language: "cobol"}},
		{"env name with =", api.ExecuteRequest{Code: "1", EnvVars: map[string]string{"A=B": "c"}}},
		{"env value with NUL", api.ExecuteRequest{Code: "1", EnvVars: map[string]string{"A": "b\x00c"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Check(tc.req); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("check: %v, want invalid argument", err)
			}
			if _, err := h.svc.Submit(ctx, "t", "s", tc.req); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("submit: %v, want invalid argument", err)
			}
		})
	}
	if _, err := h.svc.Submit(ctx, "t", "nosuch", api.ExecuteRequest{Code: "1"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("submit to an unknown session: %v, want not found", err)
	}
	if _, err := h.svc.Submit(ctx, "other", "s", api.ExecuteRequest{Code: "1"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("submit to another tenant's session: %v, want not found", err)
	}
	// The session's variables and the request's together are held to the
	// same bound as either.
	sessionEnv, requestEnv := map[string]string{}, map[string]string{}
	for i := range 600 {
		sessionEnv[fmt.Sprint("S", i)], requestEnv[fmt.Sprint("R", i)] = "v", "v"
	}
	if _, _, err := h.m.Create(ctx, "t", session.CreateRequest{ID: "env", Env: sessionEnv}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Submit(ctx, "t", "env", api.ExecuteRequest{Code: "1", EnvVars: requestEnv}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("submit with the session's and its own variables over the bound: %v, want invalid argument", err)
	}
	if recs, _, err := h.st.ListExecutions(ctx, "t", "s", 0, ""); err != nil || len(recs) != 0 {
		t.Errorf("refused requests were recorded: %+v %v", recs, err)
	}
	if l := h.sandboxes(t); len(l) != 0 {
		t.Errorf("refused requests started sandboxes: %+v", l)
	}
	if _, err := h.m.Delete(ctx, "t", "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Submit(ctx, "t", "s", api.ExecuteRequest{Code: "1"}); !errors.Is(err, errdefs.ErrFailedPrecondition) && !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("submit to a deleted session: %v, want failed precondition or not found", err)
	}
}

// TestExecutorDies: the sandbox killed under a run fails the run at once,
// with what it printed and a type that says so; the session's next run
// gets a new sandbox. So does a sandbox ended as a Pod's deletion ends
// it: its executor shuts down and answers the run cancelled, but no one
// here cancelled it.
func TestExecutorDies(t *testing.T) {
	for name, end := range map[string]func(h *harness, id string) error{
		"killed":     func(h *harness, id string) error { return h.rt.Stop(context.Background(), id) },
		"shuts down": func(h *harness, id string) error { return h.rt.Terminate(context.Background(), id) },
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.session(t, "s")
			r := h.submit(t, "s", api.ExecuteRequest{Code: "import time\nprint('up', flush=True)\ntime.sleep(600)"})
			output(t, r, "up\n")
			l := h.sandboxes(t)
			if len(l) != 1 {
				t.Fatalf("sandboxes: %+v", l)
			}
			if err := end(h, l[0].ID); err != nil {
				t.Fatal(err)
			}
			x := h.wait(t, h.svc, r.ID())
			if x.Status != api.ExecFailed || x.Error == nil || x.Error.Type != ErrTypeSandboxLost || x.Stdout != "up\n" {
				t.Fatalf("result: %+v %+v", x, x.Error)
			}
			if rec, err := h.st.GetExecution(context.Background(), "t", r.ID()); err != nil || rec.Status != api.ExecFailed {
				t.Errorf("record: %+v %v", rec, err)
			}
			next := h.wait(t, h.svc, h.submit(t, "s", api.ExecuteRequest{Code: "return 'again'"}).ID())
			if next.Status != api.ExecCompleted || string(next.ReturnValue) != `"again"` {
				t.Fatalf("the next run: %+v %+v", next, next.Error)
			}
			if l2 := h.sandboxes(t); len(l2) != 1 || l2[0].ID == l[0].ID {
				t.Errorf("sandboxes after: %+v, want one new one (the dead %s destroyed)", l2, l[0].ID)
			}
		})
	}
}

// TestExecutorGoneBeforeRun: a sandbox killed while idle is found dead
// when the next run cannot reach it; that run is not lost but runs once
// more in a new sandbox.
func TestExecutorGoneBeforeRun(t *testing.T) {
	h := newHarness(t)
	h.session(t, "s")
	if x := h.wait(t, h.svc, h.submit(t, "s", api.ExecuteRequest{Code: "return 1"}).ID()); x.Status != api.ExecCompleted {
		t.Fatalf("first run: %+v", x)
	}
	l := h.sandboxes(t)
	if err := h.rt.Stop(context.Background(), l[0].ID); err != nil {
		t.Fatal(err)
	}
	x := h.wait(t, h.svc, h.submit(t, "s", api.ExecuteRequest{Code: "return 2"}).ID())
	if x.Status != api.ExecCompleted || string(x.ReturnValue) != "2" {
		t.Fatalf("a run after the sandbox died idle: %+v %+v", x, x.Error)
	}
}

// TestRecover: a new server over the same store fails the executions a
// gone server left unfinished, keeping the output it had recorded, and
// leaves its own and those of live servers alone.
func TestRecover(t *testing.T) {
	h := newHarness(t, func(o *Options) {
		o.Alive = func(_ context.Context, owner string) (bool, error) { return owner == "live", nil }
	})
	h.session(t, "s")
	ctx := context.Background()
	now := time.Now().UTC()
	partial, _ := json.Marshal(api.Execution{Stdout: "so far\n"})
	for _, rec := range []store.Execution{
		{ID: "exec-gone-pending", Status: api.ExecPending, Owner: "gone"},
		{ID: "exec-gone-running", Status: api.ExecRunning, Owner: "gone", StartedAt: now, Result: partial},
		{ID: "exec-live", Status: api.ExecRunning, Owner: "live", StartedAt: now},
		{ID: "exec-mine", Status: api.ExecRunning, Owner: "me", StartedAt: now},
		{ID: "exec-done", Status: api.ExecCompleted, Owner: "gone", StartedAt: now, FinishedAt: now, Result: json.RawMessage(`{"status":"completed"}`)},
	} {
		rec.Tenant, rec.SessionID, rec.Language, rec.CreatedAt = "t", "s", "python", now
		if err := h.st.CreateExecution(ctx, &rec); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2; i++ { // twice: the second finds nothing more to do
		if err := h.svc.Recover(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for id, want := range map[string]string{
		"exec-gone-pending": api.ExecFailed, "exec-gone-running": api.ExecFailed,
		"exec-live": api.ExecRunning, "exec-mine": api.ExecRunning, "exec-done": api.ExecCompleted,
	} {
		x, err := h.svc.Get(ctx, "t", id, true)
		if err != nil || x.Status != want {
			t.Errorf("%s: %+v %v, want %s", id, x, err, want)
			continue
		}
		if want == api.ExecFailed && (x.Error == nil || x.Error.Type != ErrTypeServerRestart) {
			t.Errorf("%s: error %+v, want %s", id, x.Error, ErrTypeServerRestart)
		}
		if n := len(h.pub.of(id)); n != map[bool]int{true: 1}[want == api.ExecFailed] {
			t.Errorf("%s: %d events published, want one per recovered execution", id, n)
		}
	}
	if x, _ := h.svc.Get(ctx, "t", "exec-gone-running", true); x.Stdout != "so far\n" {
		t.Errorf("the recorded output of a recovered run: %q", x.Stdout)
	}
}

// TestRecoverAfterRestart: a server closed while a run is in flight
// records its cancellation; a new Service over the same store then
// answers it, and runs the next execution in a new sandbox.
func TestRecoverAfterRestart(t *testing.T) {
	h := newHarness(t)
	h.session(t, "s")
	r := h.submit(t, "s", api.ExecuteRequest{Code: "import time\nprint('up', flush=True)\ntime.sleep(600)"})
	output(t, r, "up\n")
	h.svc.Close()
	<-r.Done()
	restarted := New(Options{Store: h.st, Sessions: h.m, Owner: "me-again"})
	defer restarted.Close()
	if err := restarted.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	x := h.wait(t, restarted, r.ID())
	if x.Status != api.ExecCancelled || x.Error == nil || !strings.Contains(x.Error.Message, "shut down") || x.Stdout != "up\n" {
		t.Fatalf("after the restart: %+v %+v", x, x.Error)
	}
	if y := h.wait(t, restarted, mustSubmit(t, restarted, "s", "return 3")); y.Status != api.ExecCompleted || string(y.ReturnValue) != "3" {
		t.Errorf("a run on the restarted service: %+v %+v", y, y.Error)
	}
}

func mustSubmit(t *testing.T, svc *Service, s, code string) string {
	t.Helper()
	r, err := svc.Submit(context.Background(), "t", s, api.ExecuteRequest{Code: code})
	if err != nil {
		t.Fatal(err)
	}
	return r.ID()
}

// TestEventsInOrder: a run's output reaches its followers in the order
// it was printed, and each execution is published started, then
// finished, with what the finish recorded.
func TestEventsInOrder(t *testing.T) {
	h := newHarness(t)
	h.session(t, "s")
	const n = 200
	r := h.submit(t, "s", api.ExecuteRequest{Code: fmt.Sprintf("import sys\nfor i in range(%d):\n    print(i, flush=True)\n    print(-i, file=sys.stderr, flush=True)\nreturn 'done'", n)})
	var out, errOut strings.Builder
	for i := 0; ; {
		evs, more := r.Events(i)
		i += len(evs)
		for _, ev := range evs {
			switch ev.Stream {
			case "stdout":
				out.WriteString(ev.Text)
			case "stderr":
				errOut.WriteString(ev.Text)
			default:
				t.Fatalf("event of stream %q", ev.Stream)
			}
		}
		if len(evs) > 0 {
			continue
		}
		select {
		case <-more:
			continue
		case <-r.Done():
		}
		if evs, _ := r.Events(i); len(evs) == 0 {
			break
		}
	}
	var want, wantErr strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&want, "%d\n", i)
		fmt.Fprintf(&wantErr, "%d\n", -i)
	}
	if out.String() != want.String() || errOut.String() != wantErr.String() {
		t.Errorf("followed output out of order:\n%q\n%q", out.String(), errOut.String())
	}
	x := h.wait(t, h.svc, r.ID())
	if x.Stdout != want.String() {
		t.Errorf("result's stdout differs from what was followed")
	}
	second := h.wait(t, h.svc, mustSubmit(t, h.svc, "s", "raise ValueError('no')"))
	for _, c := range []struct {
		id     string
		status string
		errTyp string
	}{{r.ID(), api.ExecCompleted, ""}, {second.ExecutionID, api.ExecFailed, "ValueError"}} {
		evs := h.pub.of(c.id)
		if len(evs) != 2 || evs[0].Type != api.EventExecutionStarted || evs[1].Type != api.EventExecutionFinished {
			t.Fatalf("%s: published %+v, want started then finished", c.id, evs)
		}
		if evs[0].Data.SandboxID == "" || evs[0].SessionID != "s" || evs[0].Tenant != "t" {
			t.Errorf("%s: started %+v", c.id, evs[0])
		}
		if d := evs[1].Data; d.Status != c.status || d.ErrorType != c.errTyp || d.ExitCode == nil || d.DurationMs == nil {
			t.Errorf("%s: finished %+v", c.id, d)
		}
	}
	h.pub.mu.Lock()
	defer h.pub.mu.Unlock()
	for i, e := range h.pub.evs {
		if e.Type == api.EventExecutionStarted && e.Data.ExecutionID == second.ExecutionID {
			if i == 0 || h.pub.evs[i-1].Data.ExecutionID != r.ID() || h.pub.evs[i-1].Type != api.EventExecutionFinished {
				t.Errorf("the second execution started before the first was published finished: %+v", h.pub.evs)
			}
		}
	}
}

// TestConcurrentSubmissions: runs submitted at once to one session each
// get their own result, from the session's one sandbox.
func TestConcurrentSubmissions(t *testing.T) {
	h := newHarness(t)
	h.session(t, "s")
	const n = 8
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := h.svc.Submit(context.Background(), "t", "s", api.ExecuteRequest{Code: fmt.Sprintf("print(%d)\nreturn %d * %d", i, i, i)})
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = r.ID()
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if id == "" {
			continue
		}
		x := h.wait(t, h.svc, id)
		if x.Status != api.ExecCompleted || x.Stdout != fmt.Sprintf("%d\n", i) || string(x.ReturnValue) != fmt.Sprint(i*i) {
			t.Errorf("run %d: %+v %+v", i, x, x.Error)
		}
	}
	if l := h.sandboxes(t); len(l) != 1 {
		t.Errorf("sandboxes: %+v, want the session's one", l)
	}
	list, _, err := h.svc.List(context.Background(), "t", "s", 100, "")
	if err != nil || len(list) != n {
		t.Errorf("list: %d %v, want %d", len(list), err, n)
	}
}

// TestSessionDeleted: deleting a session cancels its runs in flight.
func TestSessionDeleted(t *testing.T) {
	h := newHarness(t)
	h.session(t, "s")
	r := h.submit(t, "s", api.ExecuteRequest{Code: "import time\nprint('up', flush=True)\ntime.sleep(600)"})
	output(t, r, "up\n")
	if _, err := h.m.Delete(context.Background(), "t", "s"); err != nil {
		t.Fatal(err)
	}
	<-r.Done()
	x := r.Result()
	if x.Status != api.ExecCancelled || x.Error == nil || x.Error.Type != ErrTypeSessionDeleted {
		t.Fatalf("a run of a deleted session: %+v %+v", x, x.Error)
	}
	if l := h.sandboxes(t); len(l) != 0 {
		t.Errorf("sandboxes after the delete: %+v", l)
	}
}

// TestSessionEnv: a run gets the session's variables under its own, which
// win.
func TestSessionEnv(t *testing.T) {
	h := newHarness(t)
	if _, _, err := h.m.Create(context.Background(), "t", session.CreateRequest{ID: "s", Env: map[string]string{"A": "session", "B": "session"}}); err != nil {
		t.Fatal(err)
	}
	r := h.submit(t, "s", api.ExecuteRequest{Code: "import os\nreturn os.environ['A'] + ' ' + os.environ['B']", EnvVars: map[string]string{"B": "request"}})
	if x := h.wait(t, h.svc, r.ID()); x.Status != api.ExecCompleted || string(x.ReturnValue) != `"session request"` {
		t.Fatalf("result: %+v %+v", x, x.Error)
	}
}
