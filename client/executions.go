package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs/errhttp"
)

func executionPath(id, rest string) (string, error) {
	seg, err := segment("execution id", id)
	if err != nil {
		return "", err
	}
	return api.Prefix + "/executions/" + seg + rest, nil
}

// Submit starts an execution and returns at once with its id; fetch the
// result with GetResult.
func (c *Client) Submit(ctx context.Context, sessionID string, req api.ExecuteRequest) (*api.SubmitResponse, error) {
	p, err := sessionPath(sessionID, "/execute")
	if err != nil {
		return nil, err
	}
	var out api.SubmitResponse
	if _, err := c.call(ctx, http.MethodPost, p, nil, req, &out, http.StatusAccepted); err != nil {
		return nil, err
	}
	return &out, nil
}

// Waiting for a result: a call that found no sandbox (503) or was
// told to slow down (429) is tried again after a pause that doubles from
// pollMinDelay to pollMaxDelay, or the server's Retry-After, at most
// pollMaxFailures times in a row. WaitResult's long polls are held by the
// server for pollWindow each.
const (
	pollWindow      = 30 * time.Second
	pollMaxFailures = 8
)

// Variables for tests.
var (
	pollMinDelay = 50 * time.Millisecond
	pollMaxDelay = 2 * time.Second
)

// Execute runs code and waits for the result, in one request: the server
// answers when the run is over. When no sandbox can be had the server
// runs nothing and answers 503, and Execute submits again with backoff;
// after pollMaxFailures such answers the error is IsUnavailable. For runs
// of many minutes, or through proxies that cut long requests, use Submit
// and WaitResult, which need no connection held for the whole run.
func (c *Client) Execute(ctx context.Context, sessionID string, req api.ExecuteRequest) (*api.Execution, error) {
	p, err := sessionPath(sessionID, "/execute")
	if err != nil {
		return nil, err
	}
	b := backoff{}
	for {
		var out api.Execution
		_, err := c.call(ctx, http.MethodPost, p, url.Values{"wait": {"true"}}, req, &out, http.StatusOK)
		if err == nil {
			return &out, nil
		}
		if err := b.wait(ctx, err); err != nil {
			return nil, err
		}
	}
}

// WaitResult waits until execution id is over and returns it with its
// result, long-polling GetResult (each poll held up to 30 s). Polls that
// fail with 503, 429 or a transport error are retried with backoff, at
// most 8 in a row. An execution that never ran because no sandbox could
// be had is an IsUnavailable error. ctx bounds the wait.
func (c *Client) WaitResult(ctx context.Context, id string) (*api.Execution, error) {
	b := backoff{transport: true}
	early := pollMinDelay
	for {
		start := time.Now()
		x, err := c.GetResult(ctx, id, true, pollWindow)
		if err != nil {
			if err := b.wait(ctx, err); err != nil {
				return nil, fmt.Errorf("waiting for execution %s: %w", id, err)
			}
			continue
		}
		b.failures = 0
		switch x.Status {
		case api.ExecCompleted, api.ExecFailed, api.ExecTimeout, api.ExecCancelled:
			if x.Error != nil && x.Error.Type == api.ErrTypeSandboxUnavailable {
				return nil, &APIError{StatusCode: http.StatusServiceUnavailable, Code: CodeUnavailable,
					Message: fmt.Sprintf("%s (execution %s)", x.Error.Message, id)}
			}
			return x, nil
		}
		// The server held the poll as asked: poll again at once. It came
		// back early: pause first.
		if pause := early - time.Since(start); pause > 0 {
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return nil, fmt.Errorf("waiting for execution %s: %w", id, ctx.Err())
			}
		}
		early = min(early*2, pollMaxDelay)
	}
}

// backoff paces the retries of one call.
type backoff struct {
	failures int
	delay    time.Duration
	// transport: a request that got no answer may be retried too (safe
	// for reads, not for a submit that may have arrived).
	transport bool
}

// wait returns err if it is not worth another try, else sleeps the pause
// before the next one.
func (b *backoff) wait(ctx context.Context, err error) error {
	var ae *APIError
	switch {
	case ctx.Err() != nil:
		return err
	case errors.As(err, &ae):
		if ae.StatusCode != http.StatusServiceUnavailable && ae.StatusCode != http.StatusTooManyRequests {
			return err
		}
	case !b.transport:
		return err
	}
	if b.failures++; b.failures >= pollMaxFailures {
		return err
	}
	if b.delay == 0 {
		b.delay = pollMinDelay
	}
	pause := b.delay
	if ae != nil && ae.RetryAfter > 0 {
		pause = ae.RetryAfter
	}
	b.delay = min(b.delay*2, pollMaxDelay)
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return err
	}
}

// ExecuteStream runs code, calls onOutput (if not nil) with each piece of
// its output as it happens (stream is "stdout" or "stderr"), and returns
// the result. If the stream breaks before the result, the error names the
// execution, whose result GetResult can still fetch.
func (c *Client) ExecuteStream(ctx context.Context, sessionID string, req api.ExecuteRequest, onOutput func(stream, text string)) (*api.Execution, error) {
	p, err := sessionPath(sessionID, "/execute")
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hreq, err := c.request(ctx, http.MethodPost, p, nil, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	resp, err := c.do(hreq, http.StatusOK)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return nil, fmt.Errorf("execute: the server answered with %q, not an event stream", mt)
	}
	id := ""
	events := newSSEReader(resp.Body)
	for {
		ev, err := events.next()
		if err == io.EOF {
			if id == "" {
				return nil, fmt.Errorf("execute: the stream ended before the execution was submitted: %w", io.ErrUnexpectedEOF)
			}
			return nil, fmt.Errorf("execution %s: the stream ended before its result: %w", id, io.ErrUnexpectedEOF)
		}
		if err != nil {
			if id != "" {
				return nil, fmt.Errorf("execution %s: reading the stream: %w", id, err)
			}
			return nil, fmt.Errorf("execute: reading the stream: %w", err)
		}
		switch ev.name {
		case api.EventSubmitted:
			var s api.SubmitResponse
			if err := json.Unmarshal([]byte(ev.data), &s); err != nil {
				return nil, fmt.Errorf("execute: event %s: %w", ev.name, err)
			}
			id = s.ExecutionID
		case api.EventStdout, api.EventStderr:
			var out api.StreamOutput
			if err := json.Unmarshal([]byte(ev.data), &out); err != nil {
				return nil, fmt.Errorf("execution %s: event %s: %w", id, ev.name, err)
			}
			if onOutput != nil {
				onOutput(ev.name, out.Text)
			}
		case api.EventResult:
			var x api.Execution
			if err := json.Unmarshal([]byte(ev.data), &x); err != nil {
				return nil, fmt.Errorf("execution %s: event %s: %w", id, ev.name, err)
			}
			return &x, nil
		case api.EventError:
			var e api.Error
			if err := json.Unmarshal([]byte(ev.data), &e); err != nil {
				return nil, fmt.Errorf("execution %s: event %s: %w", id, ev.name, err)
			}
			return nil, &APIError{StatusCode: errhttp.StatusOf(e.Error.Code), Code: e.Error.Code, Message: e.Error.Message}
		}
		// Other events are for later versions of the API.
	}
}

// GetExecution returns an execution's status and timings, without its
// output and result.
func (c *Client) GetExecution(ctx context.Context, id string) (*api.Execution, error) {
	return c.executionCall(ctx, http.MethodGet, id, "", nil)
}

// GetResult returns an execution with its output and result. With wait,
// the server holds the request until the execution is over or timeout
// has passed (0: the server's default, 60 s; at most 300 s), and then
// answers with the current state: repeat while the status is pending or
// running.
func (c *Client) GetResult(ctx context.Context, id string, wait bool, timeout time.Duration) (*api.Execution, error) {
	q := url.Values{}
	if wait {
		q.Set("wait", "true")
		if timeout > 0 {
			q.Set("timeout", strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64))
		}
	}
	return c.executionCall(ctx, http.MethodGet, id, "/result", q)
}

// CancelExecution stops an execution; it ends as cancelled.
func (c *Client) CancelExecution(ctx context.Context, id string) (*api.Execution, error) {
	return c.executionCall(ctx, http.MethodPost, id, "/cancel", nil)
}

// ListExecutions returns a page of the session's executions, newest
// first, without their output. limit 0 is the server's default (50).
func (c *Client) ListExecutions(ctx context.Context, sessionID string, limit int, pageToken string) (*api.ExecutionList, error) {
	p, err := sessionPath(sessionID, "/executions")
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	set(q, "page_token", pageToken)
	var out api.ExecutionList
	if _, err := c.call(ctx, http.MethodGet, p, q, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

func (c *Client) executionCall(ctx context.Context, method, id, rest string, q url.Values) (*api.Execution, error) {
	p, err := executionPath(id, rest)
	if err != nil {
		return nil, err
	}
	var x api.Execution
	if _, err := c.call(ctx, method, p, q, nil, &x, http.StatusOK); err != nil {
		return nil, err
	}
	return &x, nil
}
