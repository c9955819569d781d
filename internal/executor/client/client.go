// Package client is the control plane's side of the executor protocol:
// a client of the daemon in one sandbox that keeps its connections alive
// and bounds everything the sandbox sends back (the sandbox is not
// trusted). It shares the wire format (package wire) with the daemon and
// nothing else: it needs none of the daemon's code.
package client

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
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
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

// What an executor sends is not trusted: it runs in the sandbox, and code
// there may have replaced it, or the socket the host dials. So the client
// bounds everything it reads, and what it hands on, to what an honest
// executor can send: a response never grows the host's memory beyond a
// bound fixed by the request, and a response that breaks the bounds fails
// the call with ErrBadResponse.
const (
	// maxSmallResponse bounds the bodies of /health, /cancel, the deletes
	// and every error response.
	maxSmallResponse = 1 << 20
	// maxStatsResponse bounds the body of /stats: a dozen numbers, which
	// the control plane reads of every sandbox every few seconds.
	maxStatsResponse = 64 << 10
	// maxMarkerBytes is room for the truncation marker line the executor
	// ends cut output with (output.go), and the newline before it.
	maxMarkerBytes = 128
	// maxErrorText bounds an ExecError's message and its traceback.
	maxErrorText = 1 << 20
	// maxArtifactPath bounds one artifact path (PATH_MAX).
	maxArtifactPath = 4096
	// jsonEscapeFactor: a byte of a JSON string takes at most 6 on the
	// wire (\u0000).
	jsonEscapeFactor = 6
)

// ErrBadResponse marks a response of the executor that breaks the
// protocol's bounds (an event too large, more output than the limit, an
// unknown event): the executor is broken or not the executor.
var ErrBadResponse = fmt.Errorf("the executor's response breaks the protocol: %w", errdefs.ErrUnavailable)

// maxEventLine bounds one line of a /run stream whose output limit is
// limit: the result event, the largest, holds both streams, the return
// value, the error and the artifact list.
func maxEventLine(limit int64) int64 {
	return jsonEscapeFactor*(2*(limit+maxMarkerBytes)+2*maxErrorText+wire.MaxArtifacts*maxArtifactPath) +
		wire.MaxReturnValueBytes + 64<<10
}

// boundedReader fails with ErrBadResponse once more than n bytes were read.
type boundedReader struct {
	r    io.Reader
	n    int64
	what string
	max  int64 // the bound, for the message (maxSmallResponse if 0)
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.n <= 0 {
		if b.max == 0 {
			b.max = maxSmallResponse
		}
		return 0, fmt.Errorf("%w: %s is larger than %d bytes", ErrBadResponse, b.what, b.max)
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	return n, err
}

// NewClient returns a client that reaches the executor through dial (for
// example a unix socket path, or a runtime's Dial).
func NewClient(dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConns:        16,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // a local socket; gzip would only cost CPU
		// The executor's headers are a few fields; a file's description
		// (wire.FilesEntryHeader) is the largest.
		MaxResponseHeaderBytes: 4*wire.MaxEntryJSON/3 + 16<<10,
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
	case "too_large":
		return errdefs.ErrTooLarge
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
		var eb wire.ErrorBody
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &eb) != nil || eb.Error.Code == "" {
			return nil, &APIError{Status: resp.StatusCode, Code: "internal", Message: string(bytes.TrimSpace(b))}
		}
		return nil, &APIError{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
	}
	return resp, nil
}

func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	return c.callLimit(ctx, method, path, in, out, maxSmallResponse)
}

// callLimit is call with a response body of at most limit bytes.
func (c *Client) callLimit(ctx context.Context, method, path string, in, out any, limit int64) (err error) {
	ctx, span := startSpan(ctx, method, path)
	defer func() { endSpan(span, nil, err) }()
	resp, err := c.do(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body := &boundedReader{r: resp.Body, n: limit, max: limit, what: "the response to " + method + " " + path}
	if out == nil {
		if _, err := io.Copy(io.Discard, body); err != nil {
			return fmt.Errorf("executor %s %s: %w", method, path, err)
		}
		return nil
	}
	if err := json.NewDecoder(body).Decode(out); err != nil {
		return fmt.Errorf("executor %s %s: bad response: %w", method, path, err)
	}
	// Drain so that the connection goes back to the pool.
	if _, err := io.Copy(io.Discard, body); err != nil {
		return fmt.Errorf("executor %s %s: %w", method, path, err)
	}
	return nil
}

// Health reports whether the executor is up and its zygote ready.
func (c *Client) Health(ctx context.Context) (*wire.Health, error) {
	var h wire.Health
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
func (c *Client) Run(ctx context.Context, req wire.RunRequest, onOutput func(stream, data string)) (res *wire.Result, err error) {
	ctx, span := startSpan(ctx, http.MethodPost, "/run")
	defer func() { endSpan(span, res, err) }()
	if span.IsRecording() {
		span.SetAttributes(attribute.String("sbx.execution.id", req.ID))
	}
	limit := req.OutputLimitBytes
	if limit <= 0 || limit > wire.MaxOutputLimit {
		limit = wire.DefaultOutputLimit
	}
	resp, err := c.do(ctx, http.MethodPost, "/run", req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("executor run %q: %w: "+format, append([]any{req.ID, ErrBadResponse}, args...)...)
	}
	lines := newLineReader(resp.Body, maxEventLine(limit))
	// What an honest executor streams of each stream: the output up to
	// the limit, then its truncation marker.
	room := map[string]int64{"stdout": limit + maxMarkerBytes, "stderr": limit + maxMarkerBytes}
	for {
		line, err := lines.next()
		if err != nil {
			if errors.Is(err, errLineTooLong) {
				return nil, bad("an event of more than %d bytes", maxEventLine(limit))
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("executor run %q: stream ended without a result: %w", req.ID, err)
		}
		var ev wire.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, bad("undecodable event: %v", err)
		}
		switch ev.Type {
		case "stdout", "stderr":
			if room[ev.Type] -= int64(len(ev.Data)); room[ev.Type] < 0 {
				return nil, bad("more %s than its limit of %d bytes", ev.Type, limit)
			}
			if onOutput != nil {
				onOutput(ev.Type, ev.Data)
			}
		case "result":
			if ev.Result == nil {
				return nil, fmt.Errorf("executor run %q: empty result event", req.ID)
			}
			if err := checkResult(ev.Result, limit); err != nil {
				return nil, bad("%v", err)
			}
			// Nothing but the end of the response follows a result: read
			// that (a little, never more), so that the connection goes
			// back to the pool.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
			return ev.Result, nil
		default:
			return nil, bad("unknown event type %.64q", ev.Type)
		}
	}
}

// checkResult checks a result against what an honest executor sends for
// an output limit of limit.
func checkResult(r *wire.Result, limit int64) error {
	switch {
	case len(r.ID) > wire.MaxIDLen:
		return fmt.Errorf("an id of %d bytes", len(r.ID))
	case len(r.Status) > 64:
		return fmt.Errorf("a status of %d bytes", len(r.Status))
	case int64(len(r.Stdout)) > limit+maxMarkerBytes || int64(len(r.Stderr)) > limit+maxMarkerBytes:
		return fmt.Errorf("output of %d and %d bytes over a limit of %d", len(r.Stdout), len(r.Stderr), limit)
	case len(r.ReturnValue) > wire.MaxReturnValueBytes:
		return fmt.Errorf("a return value of %d bytes, more than %d", len(r.ReturnValue), wire.MaxReturnValueBytes)
	case len(r.Artifacts) > wire.MaxArtifacts:
		return fmt.Errorf("%d artifacts, more than %d", len(r.Artifacts), wire.MaxArtifacts)
	}
	if e := r.Error; e != nil && (len(e.Type) > 256 || len(e.Message) > maxErrorText || len(e.Traceback) > maxErrorText) {
		return fmt.Errorf("an error of %d, %d and %d bytes", len(e.Type), len(e.Message), len(e.Traceback))
	}
	for _, a := range r.Artifacts {
		if len(a) > maxArtifactPath {
			return fmt.Errorf("an artifact path of %d bytes", len(a))
		}
	}
	return nil
}

var errLineTooLong = errors.New("line too long")

// lineReader reads newline-ended lines of at most max bytes without ever
// holding more than that (bufio.Scanner's limit, but growing its buffer
// only as far as a line needs).
type lineReader struct {
	r   io.Reader
	max int64
	buf []byte // unread bytes are buf[off:]
	off int
}

func newLineReader(r io.Reader, max int64) *lineReader { return &lineReader{r: r, max: max} }

// next returns the next line without its newline; it is valid until the
// next call.
func (l *lineReader) next() ([]byte, error) {
	scanned := 0
	for {
		if i := bytes.IndexByte(l.buf[l.off+scanned:], '\n'); i >= 0 {
			end := l.off + scanned + i
			line := l.buf[l.off:end]
			l.off = end + 1
			return line, nil
		}
		scanned = len(l.buf) - l.off
		if int64(scanned) > l.max {
			return nil, errLineTooLong
		}
		// Move what is unread to the front, then read more.
		if l.off > 0 {
			n := copy(l.buf, l.buf[l.off:])
			l.buf, l.off = l.buf[:n], 0
		}
		if len(l.buf) == cap(l.buf) {
			grown := min(max(2*cap(l.buf), 64<<10), int(l.max)+1)
			if grown <= cap(l.buf) {
				return nil, errLineTooLong
			}
			nb := make([]byte, len(l.buf), grown)
			copy(nb, l.buf)
			l.buf = nb
		}
		n, err := l.r.Read(l.buf[len(l.buf):cap(l.buf)])
		l.buf = l.buf[:len(l.buf)+n]
		if n == 0 && err != nil {
			if err == io.EOF && len(l.buf) > 0 {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// Cancel kills the running execution id. It reports whether there was one.
func (c *Client) Cancel(ctx context.Context, id string) (bool, error) {
	var out wire.CancelResponse
	if err := c.call(ctx, http.MethodPost, "/cancel", wire.CancelRequest{ID: id}, &out); err != nil {
		return false, err
	}
	return out.Cancelled, nil
}

// Stats reads the sandbox's resource usage.
func (c *Client) Stats(ctx context.Context) (*wire.Stats, error) {
	var st wire.Stats
	if err := c.callLimit(ctx, http.MethodGet, "/stats", nil, &st, maxStatsResponse); err != nil {
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
	var out wire.DeleteConversationResponse
	if err := c.call(ctx, http.MethodDelete, "/conversations/"+url.PathEscape(conversationID), nil, &out); err != nil {
		return 0, err
	}
	return out.DeletedContexts, nil
}
