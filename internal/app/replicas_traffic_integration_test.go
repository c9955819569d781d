//go:build integration

package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/execution"
)

// testMixedTraffic: sessions used through every replica at once, with
// pauses, hibernations and resumes asked through any of them, and one
// replica killed (SIGKILL) half way. Nothing may be lost or answered
// wrongly: every execution appends its number to the session's log and
// answers how many lines the log has, so a session's log must hold every
// number an execution said it wrote, once and in order, and each answer
// must count exactly the lines written by then.
func (cl *cluster) testMixedTraffic(t *testing.T) {
	cl.ensureAll(t)
	cl.takeErrors()
	const (
		sessions = 4
		victim   = 1
		run      = 16 * time.Second
	)
	ids := make([]string, sessions)
	for i := range ids {
		ids[i] = "mixed-" + strconv.Itoa(i) + "-" + token()
		cl.create(t, i%3, api.CreateSessionRequest{SessionID: ids[i], TemplateID: "python"})
	}
	var killed atomic.Bool
	// pick chooses a replica at random, never the killed one once it is.
	pick := func(r *rand.Rand) (int, *client.Client) {
		for {
			i := r.IntN(3)
			if i != victim || !killed.Load() {
				return i, cl.c(i)
			}
		}
	}
	// allowed says whether an error is one a client must expect: a
	// transition refused (409: busy, or a state that does not allow it),
	// or the killed replica's connection dropping.
	allowed := func(i int, err error) bool {
		var ae *client.APIError
		if errors.As(err, &ae) {
			return ae.StatusCode == http.StatusConflict
		}
		return i == victim
	}
	type outcome struct {
		mu     sync.Mutex
		seq    int   // the last number sent
		acked  []int // numbers an execution said it wrote
		maybe  []int // numbers of executions whose answer was lost
		wrong  []string
		counts map[string]int
	}
	out := make([]*outcome, sessions)
	end := time.Now().Add(run)
	var wg sync.WaitGroup
	// Per session, one goroutine executes and another pauses,
	// hibernates, resumes and reads the log, each through any replica.
	for s := range sessions {
		o := &outcome{counts: map[string]int{}}
		out[s] = o
		id := ids[s]
		note := func(i int, op string, err error) {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.counts[op]++
			if err != nil && !allowed(i, err) {
				o.wrong = append(o.wrong, fmt.Sprintf("%s through replica %d: %v", op, i, err))
			}
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(s), uint64(time.Now().UnixNano())))
			for time.Now().Before(end) {
				// An agent thinks between steps: pauses and hibernations
				// get their chance.
				time.Sleep(time.Duration(r.IntN(200)) * time.Millisecond)
				i, c := pick(r)
				o.mu.Lock()
				o.seq++
				seq, before := o.seq, len(o.acked)
				o.mu.Unlock()
				code := fmt.Sprintf("with open('/workspace/log.txt', 'a') as f:\n    f.write('%d\\n')\nreturn len(open('/workspace/log.txt').read().split())", seq)
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				x, err := c.Execute(ctx, id, api.ExecuteRequest{Code: code})
				cancel()
				o.mu.Lock()
				switch {
				case err == nil && x.Status == api.ExecCompleted:
					// The log had every acknowledged line and maybe some
					// whose answers were lost: at least before+1 lines.
					n, _ := strconv.Atoi(strings.TrimSpace(string(x.ReturnValue)))
					if n < before+1 || n > seq {
						o.wrong = append(o.wrong, fmt.Sprintf("execution %d through replica %d counted %d lines (acknowledged before: %d)", seq, i, n, before))
					}
					o.acked = append(o.acked, seq)
				case err == nil:
					o.maybe = append(o.maybe, seq)
					if i != victim {
						o.wrong = append(o.wrong, fmt.Sprintf("execution %d through replica %d: %s", seq, i, describeExec(x, nil)))
					}
				default:
					o.maybe = append(o.maybe, seq)
				}
				o.mu.Unlock()
				note(i, "execute", err)
			}
		}()
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(s)+100, uint64(time.Now().UnixNano())))
			for time.Now().Before(end) {
				time.Sleep(time.Duration(r.IntN(300)) * time.Millisecond)
				i, c := pick(r)
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				var err error
				switch op := r.IntN(4); op {
				case 0:
					_, err = c.PauseSession(ctx, id)
					note(i, "pause", err)
				case 1:
					_, err = c.HibernateSession(ctx, id)
					note(i, "hibernate", err)
				case 2:
					_, err = c.ResumeSession(ctx, id)
					note(i, "resume", err)
				default:
					o.mu.Lock()
					acked := slices.Clone(o.acked)
					o.mu.Unlock()
					var b bytes.Buffer
					_, err = c.Download(ctx, id, "log.txt", &b)
					var ae *client.APIError
					if errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound && len(acked) == 0 {
						err = nil // nothing written yet
					}
					if err == nil {
						o.mu.Lock()
						// Executions in flight may have written more.
						msg := checkLog(b.String(), acked, nil, o.seq, true)
						if msg != "" {
							o.wrong = append(o.wrong, fmt.Sprintf("log read through replica %d: %s", i, msg))
						}
						o.mu.Unlock()
					}
					note(i, "download", err)
				}
				cancel()
			}
		}()
	}
	time.Sleep(run / 2)
	killed.Store(true)
	cl.stop(t, victim, syscall.SIGKILL)
	wg.Wait()
	cl.start(t, victim)

	// A client retries 503 (no sandbox now); the victim's dropped
	// connections aside, there should be none.
	for _, e := range cl.takeErrors() {
		t.Errorf("a 5xx answer: %s", e)
	}
	for s, o := range out {
		for _, w := range o.wrong {
			t.Errorf("session %s: %s", ids[s], w)
		}
		var b bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := cl.c(victim).Download(ctx, ids[s], "log.txt", &b)
		cancel()
		if err != nil {
			t.Errorf("session %s: reading its log through the restarted replica: %v", ids[s], err)
			continue
		}
		if msg := checkLog(b.String(), o.acked, o.maybe, o.seq, false); msg != "" {
			t.Errorf("session %s: %s\nlogs:\n%s", ids[s], msg, cl.logs(30, ids[s]))
		}
		t.Logf("session %s: %v; %d acknowledged, %d lost answers", ids[s], o.counts, len(o.acked), len(o.maybe))
	}
	for _, id := range ids {
		if _, err := cl.c(0).DeleteSession(context.Background(), id); err != nil {
			t.Errorf("deleting %s: %v", id, err)
		}
	}
}

// checkLog says what is wrong with a session's log: numbers out of
// order or twice, a number never sent (past upto, the last one sent; with
// inFlight any number up to it, else only those in acked or maybe), or an
// acknowledged one missing.
func checkLog(log string, acked, maybe []int, upto int, inFlight bool) string {
	var got []int
	for _, f := range strings.Fields(log) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Sprintf("line %q is not a number", f)
		}
		if len(got) > 0 && n <= got[len(got)-1] {
			return fmt.Sprintf("%d after %d: out of order or twice (%v)", n, got[len(got)-1], got)
		}
		if n < 1 || n > upto || !inFlight && !slices.Contains(acked, n) && !slices.Contains(maybe, n) {
			return fmt.Sprintf("%d was never sent (sent up to %d)", n, upto)
		}
		got = append(got, n)
	}
	for _, n := range acked {
		if !slices.Contains(got, n) {
			return fmt.Sprintf("acknowledged %d is missing (log: %v)", n, got)
		}
	}
	return ""
}

// testCancelElsewhere: an execution cancelled through a replica that does
// not run it is cancelled (the request goes through the store).
func (cl *cluster) testCancelElsewhere(t *testing.T) {
	cl.ensureAll(t)
	ctx := context.Background()
	sid := "cancel-" + token()
	cl.create(t, 0, api.CreateSessionRequest{SessionID: sid, TemplateID: "python"})
	cl.exec(t, 0, sid, api.ExecuteRequest{Code: "print(1)"}) // a sandbox up
	sub, err := cl.c(0).Submit(ctx, sid, api.ExecuteRequest{Code: "import time\nprint('started', flush=True)\ntime.sleep(120)"})
	if err != nil {
		t.Fatal(err)
	}
	cl.waitRunning(t, 1, sub.ExecutionID)
	start := time.Now()
	x, err := cl.c(2).CancelExecution(ctx, sub.ExecutionID)
	if err != nil || x.Status != api.ExecCancelled {
		t.Fatalf("cancel through replica 2: %s", describeExec(x, err))
	}
	t.Logf("cancelled through another replica in %v", time.Since(start).Round(time.Millisecond))
	if x, err := cl.c(1).GetExecution(ctx, sub.ExecutionID); err != nil || x.Status != api.ExecCancelled {
		t.Fatalf("after the cancel, replica 1 says %s", describeExec(x, err))
	}
	// The session goes on.
	cl.exec(t, 2, sid, api.ExecuteRequest{Code: "print(2)"})
	if _, err := cl.c(1).DeleteSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
}

// testOutputElsewhere: the output so far of an execution shows through a
// replica that does not run it, while it runs.
func (cl *cluster) testOutputElsewhere(t *testing.T) {
	cl.ensureAll(t)
	ctx := context.Background()
	sid := "output-" + token()
	cl.create(t, 0, api.CreateSessionRequest{SessionID: sid, TemplateID: "python"})
	sub, err := cl.c(0).Submit(ctx, sid, api.ExecuteRequest{Code: "import time\nfor i in range(30):\n    print('tick', i, flush=True)\n    time.sleep(0.2)"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		x, err := cl.c(1).GetResult(ctx, sub.ExecutionID, false, 0)
		if err == nil && x.Status == api.ExecRunning && strings.Contains(x.Stdout, "tick 1\n") {
			t.Logf("through another replica while it runs: %q", x.Stdout)
			break
		}
		if err == nil && x.Status != api.ExecRunning && x.Status != api.ExecPending {
			t.Fatalf("the run ended before its output showed elsewhere: %s", describeExec(x, err))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no output so far through another replica: %s", describeExec(x, err))
		}
		time.Sleep(100 * time.Millisecond)
	}
	x, err := cl.c(2).GetResult(ctx, sub.ExecutionID, true, 30*time.Second)
	if err != nil || x.Status != api.ExecCompleted || !strings.Contains(x.Stdout, "tick 29\n") {
		t.Fatalf("the result through a third replica: %s", describeExec(x, err))
	}
	if _, err := cl.c(1).DeleteSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
}

// testOutcomeIsFinal: an execution that another replica recorded as
// failed while it ran (what the reaper's replica does when the runner's
// liveness lease lapses, the store out of its reach for a while) keeps
// that outcome when it ends: clients may have read it, and no replica,
// the runner included, answers anything else afterwards.
func (cl *cluster) testOutcomeIsFinal(t *testing.T) {
	cl.ensureAll(t)
	ctx := context.Background()
	sid := "final-" + token()
	cl.create(t, 0, api.CreateSessionRequest{SessionID: sid, TemplateID: "python"})
	// The run ends when the test says so (a file appears), not after a
	// time the test would have to beat.
	code := "import os, time\nprint('started', flush=True)\n" +
		"for _ in range(1200):\n    if os.path.exists('/workspace/go'): break\n    time.sleep(0.05)\nreturn 'ran'"
	sub, err := cl.c(0).Submit(ctx, sid, api.ExecuteRequest{Code: code})
	if err != nil {
		t.Fatal(err)
	}
	cl.waitRunning(t, 1, sub.ExecutionID)
	rec, err := cl.store.GetExecution(ctx, "default", sub.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	failed := api.Execution{ExecutionID: rec.ID, SessionID: sid, Language: rec.Language, CreatedAt: rec.CreatedAt, Status: api.ExecFailed, FinishedAt: &now, Artifacts: []string{},
		Error: &api.ExecError{Type: execution.ErrTypeServerRestart, Message: "failed by the test, as for a lapsed replica"}}
	rec.Status, rec.FinishedAt = api.ExecFailed, now
	rec.Result, _ = json.Marshal(failed)
	if err := cl.store.UpdateExecution(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.c(1).Upload(ctx, sid, client.UploadOptions{Path: "go"}, client.UploadFile{Name: "go", Reader: strings.NewReader("go")}); err != nil {
		t.Fatal(err)
	}
	for i := range cl.reps {
		x, err := cl.c(i).GetResult(ctx, sub.ExecutionID, true, 30*time.Second)
		if err != nil || x.Status != api.ExecFailed || x.Error == nil || x.Error.Type != execution.ErrTypeServerRestart {
			t.Errorf("replica %d, after the run ended: %s; want the failure recorded while it ran", i, describeExec(x, err))
		}
	}
	// The session goes on.
	cl.exec(t, 1, sid, api.ExecuteRequest{Code: "print(2)"})
	if _, err := cl.c(2).DeleteSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
}

// waitRunning waits until replica i says the execution is running.
func (cl *cluster) waitRunning(t *testing.T, i int, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		x, err := cl.c(i).GetExecution(context.Background(), id)
		if err == nil && x.Status == api.ExecRunning {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the execution never showed running through replica %d: %s", i, describeExec(x, err))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
