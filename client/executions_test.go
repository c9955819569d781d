package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
)

func fastBackoff(t *testing.T) {
	minD, maxD := pollMinDelay, pollMaxDelay
	pollMinDelay, pollMaxDelay = time.Millisecond, 4*time.Millisecond
	t.Cleanup(func() { pollMinDelay, pollMaxDelay = minD, maxD })
}

// answers serves the i-th request with answer(i) (status and body), and
// counts the requests.
func answers(t *testing.T, answer func(i int, r *http.Request) (int, any)) (*Client, *atomic.Int32) {
	var n atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, body := answer(int(n.Add(1)), r)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(ts.Close)
	return New(ts.URL), &n
}

func apiErr(code, msg string) api.Error {
	return api.Error{Error: api.ErrorBody{Code: code, Message: msg}}
}

func TestExecuteRetriesWhenNoSandbox(t *testing.T) {
	fastBackoff(t)
	done := api.Execution{ExecutionID: "x3", Status: api.ExecCompleted, Stdout: "1\n"}
	c, n := answers(t, func(i int, r *http.Request) (int, any) {
		if r.URL.Query().Get("wait") != "true" {
			t.Errorf("execute without wait=true: %s", r.URL)
		}
		if i < 3 {
			return 503, apiErr(CodeUnavailable, "no sandbox")
		}
		return 200, done
	})
	x, err := c.Execute(context.Background(), "s1", api.ExecuteRequest{Code: "print(1)"})
	if err != nil || x.ExecutionID != "x3" || n.Load() != 3 {
		t.Fatalf("Execute: %+v %v after %d requests", x, err, n.Load())
	}

	// A refusal is not tried again; nor is unavailability for ever.
	c, n = answers(t, func(int, *http.Request) (int, any) { return 400, apiErr(CodeInvalidArgument, "code is empty") })
	if _, err := c.Execute(context.Background(), "s1", api.ExecuteRequest{}); err == nil || n.Load() != 1 {
		t.Errorf("a 400: %v after %d requests", err, n.Load())
	}
	c, n = answers(t, func(int, *http.Request) (int, any) { return 503, apiErr(CodeUnavailable, "no sandbox") })
	if _, err := c.Execute(context.Background(), "s1", api.ExecuteRequest{Code: "1"}); !IsUnavailable(err) || n.Load() != pollMaxFailures {
		t.Errorf("always 503: %v after %d requests, want IsUnavailable after %d", err, n.Load(), pollMaxFailures)
	}
	// The context bounds the retries.
	ctx, cancel := context.WithCancel(context.Background())
	c, _ = answers(t, func(int, *http.Request) (int, any) {
		cancel()
		return 429, apiErr(CodeResourceExhausted, "slow down")
	})
	if _, err := c.Execute(ctx, "s1", api.ExecuteRequest{Code: "1"}); err == nil {
		t.Error("Execute went on after its context ended")
	}
}

func TestWaitResult(t *testing.T) {
	fastBackoff(t)
	c, n := answers(t, func(i int, r *http.Request) (int, any) {
		if q := r.URL.Query(); r.URL.Path != "/api/v1/executions/x1/result" || q.Get("wait") != "true" || q.Get("timeout") != "30" {
			t.Errorf("poll %s", r.URL)
		}
		switch i {
		case 1:
			return 503, apiErr(CodeUnavailable, "restarting")
		case 2, 3:
			return 200, api.Execution{ExecutionID: "x1", Status: api.ExecRunning} // back early
		}
		return 200, api.Execution{ExecutionID: "x1", Status: api.ExecFailed, Error: &api.ExecError{Type: "ZeroDivisionError"}}
	})
	x, err := c.WaitResult(context.Background(), "x1")
	if err != nil || x.Status != api.ExecFailed || x.Error.Type != "ZeroDivisionError" || n.Load() != 4 {
		t.Fatalf("WaitResult: %+v %v after %d polls", x, err, n.Load())
	}

	// An execution that never ran for want of a sandbox is an error.
	c, _ = answers(t, func(int, *http.Request) (int, any) {
		return 200, api.Execution{ExecutionID: "x1", Status: api.ExecFailed, Error: &api.ExecError{Type: api.ErrTypeSandboxUnavailable, Message: "no sandbox"}}
	})
	if _, err := c.WaitResult(context.Background(), "x1"); !IsUnavailable(err) {
		t.Errorf("SandboxUnavailable: %v, want IsUnavailable", err)
	}
	// A missing execution is not polled again.
	c, n = answers(t, func(int, *http.Request) (int, any) { return 404, apiErr(CodeNotFound, "no execution x1") })
	if _, err := c.WaitResult(context.Background(), "x1"); !IsNotFound(err) || n.Load() != 1 {
		t.Errorf("404: %v after %d polls", err, n.Load())
	}
	// The context bounds the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	c, _ = answers(t, func(int, *http.Request) (int, any) {
		return 200, api.Execution{ExecutionID: "x1", Status: api.ExecRunning}
	})
	if _, err := c.WaitResult(ctx, "x1"); err == nil {
		t.Error("WaitResult went on after its context ended")
	}
}
