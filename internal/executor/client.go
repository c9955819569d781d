package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Client talks to one executor. It keeps connections alive between calls:
// a run's round trip should cost a request, not a connection set-up.
type Client struct {
	tr   *http.Transport
	http *http.Client
}

// clientBase is the URL every request goes to; the transport ignores the
// host and dials the executor.
const clientBase = "http://sbx-executor"

// NewClient returns a client that reaches the executor through dial (for
// example a unix socket path, or a runtime's Dial).
func NewClient(dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConns:        16,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // a local socket; gzip would only cost CPU
	}
	return &Client{tr: tr, http: &http.Client{Transport: tr}}
}

// Close releases idle connections. The client remains usable.
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// ErrNoAnswer marks a request the executor never answered: the
// connection could not be made, or broke before the response began. The
// executor answers /run as soon as it has started the run, so a run that
// failed this way had not started, or died with its sandbox at once.
var ErrNoAnswer = errors.New("no answer from the executor")

// APIError is an error response of the executor. It unwraps to the
// errdefs category of its code, so callers test it with errors.Is.
type APIError struct {
	Status  int
	Code    string
	Message string
}

// Error says what the executor answered.
func (e *APIError) Error() string {
	return fmt.Sprintf("executor: %s (%d %s)", e.Message, e.Status, e.Code)
}

// Unwrap maps the wire code back to its category.
func (e *APIError) Unwrap() error {
	switch e.Code {
	case "invalid_argument":
		return errdefs.ErrInvalidArgument
	case "not_found":
		return errdefs.ErrNotFound
	case "already_exists":
		return errdefs.ErrAlreadyExists
	case "failed_precondition":
		return errdefs.ErrFailedPrecondition
	case "resource_exhausted":
		return errdefs.ErrResourceExhausted
	case "unavailable":
		return errdefs.ErrUnavailable
	}
	return nil
}

func (c *Client) do(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, clientBase+path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	// A request on a kept-alive connection whose other end is gone (the
	// sandbox was killed, say) fails before any answer comes back. This
	// header lets the transport send it again on a new connection in that
	// case only (a reused connection, no answer at all), which it never
	// does for a POST otherwise; the new connection then fails to dial,
	// and the caller knows the request never reached an executor.
	req.Header.Set("X-Idempotency-Key", method+" "+path)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("executor %s %s: %w: %w", method, path, ErrNoAnswer, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var eb errorBody
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &eb) != nil || eb.Error.Code == "" {
			return nil, &APIError{Status: resp.StatusCode, Code: "internal", Message: string(bytes.TrimSpace(b))}
		}
		return nil, &APIError{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
	}
	return resp, nil
}

func (c *Client) call(ctx context.Context, method, path string, in, out any) (err error) {
	ctx, span := startSpan(ctx, method, path)
	defer func() { endSpan(span, nil, err) }()
	resp, err := c.do(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("executor %s %s: bad response: %w", method, path, err)
	}
	// Drain so that the connection goes back to the pool.
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// Health reports whether the executor is up and its zygote ready.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	if err := c.call(ctx, http.MethodGet, "/health", nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// WaitReady polls Health until the executor is ready or ctx is done. The
// backoff starts at 1 ms, because a warm executor answers in well under
// that and a sandbox start is waiting on it.
func (c *Client) WaitReady(ctx context.Context) error {
	delay := time.Millisecond
	var last error
	for {
		h, err := c.Health(ctx)
		switch {
		case err == nil && h.Ready:
			return nil
		case err == nil:
			last = fmt.Errorf("executor not ready yet (preload error: %q)", h.PreloadError)
		default:
			last = err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("executor not ready: %w (last: %v)", context.Cause(ctx), last)
		case <-t.C:
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// Run executes req and returns its result. onOutput, if not nil, receives
// the output as it happens, in order, with each piece whole UTF-8 text.
// Cancelling ctx disconnects, which kills the execution.
func (c *Client) Run(ctx context.Context, req RunRequest, onOutput func(stream, data string)) (res *Result, err error) {
	ctx, span := startSpan(ctx, http.MethodPost, "/run")
	defer func() { endSpan(span, res, err) }()
	if span.IsRecording() {
		span.SetAttributes(attribute.String("sbx.execution.id", req.ID))
	}
	resp, err := c.do(ctx, http.MethodPost, "/run", req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev Event
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("executor run %q: stream ended without a result: %w", req.ID, err)
		}
		switch ev.Type {
		case "stdout", "stderr":
			if onOutput != nil {
				onOutput(ev.Type, ev.Data)
			}
		case "result":
			if ev.Result == nil {
				return nil, fmt.Errorf("executor run %q: empty result event", req.ID)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			return ev.Result, nil
		}
	}
}

// Cancel kills the running execution id. It reports whether there was one.
func (c *Client) Cancel(ctx context.Context, id string) (bool, error) {
	var out CancelResponse
	if err := c.call(ctx, http.MethodPost, "/cancel", CancelRequest{ID: id}, &out); err != nil {
		return false, err
	}
	return out.Cancelled, nil
}

// Stats reads the sandbox's resource usage.
func (c *Client) Stats(ctx context.Context) (*Stats, error) {
	var st Stats
	if err := c.call(ctx, http.MethodGet, "/stats", nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// DeleteContext destroys the stateful context id of conversationID ("" for
// a context without a conversation); errdefs.ErrNotFound if there is none.
func (c *Client) DeleteContext(ctx context.Context, conversationID, id string) error {
	path := "/contexts/" + url.PathEscape(id)
	if conversationID != "" {
		path += "?" + url.Values{"conversation_id": {conversationID}}.Encode()
	}
	return c.call(ctx, http.MethodDelete, path, nil, nil)
}

// DeleteConversation destroys every stateful context of conversationID and
// returns how many there were. It is idempotent.
func (c *Client) DeleteConversation(ctx context.Context, conversationID string) (int, error) {
	var out DeleteConversationResponse
	if err := c.call(ctx, http.MethodDelete, "/conversations/"+url.PathEscape(conversationID), nil, &out); err != nil {
		return 0, err
	}
	return out.DeletedContexts, nil
}
