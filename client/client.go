// Package client is the Go client of the sbx HTTP API (api/openapi.yaml):
// sessions, executions (asynchronous, synchronous and streamed) and the
// session's files. Its requests and answers are the types of package api.
//
//	c := client.New("http://127.0.0.1:7070", client.WithAPIKey(key))
//	s, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "demo"})
//	x, err := c.Execute(ctx, s.SessionID, api.ExecuteRequest{Code: "print(1 + 1)"})
//
// Errors the server answers with are *APIError; IsNotFound and
// IsUnavailable test the common cases.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
)

// Client talks to one sbx server. It is safe for concurrent use.
type Client struct {
	base   string // scheme://host[:port][/path], without a trailing slash
	apiKey string
	hc     *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithAPIKey sends key with every request, as Authorization: Bearer KEY.
func WithAPIKey(key string) Option { return func(c *Client) { c.apiKey = key } }

// WithHTTPClient makes requests with hc instead of http.DefaultClient. The
// client's Timeout bounds whole requests, synchronous executions and
// streams included; prefer contexts.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// New returns a client of the server at baseURL (http://127.0.0.1:7070,
// say; the API lives under its /api/v1).
func New(baseURL string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), hc: http.DefaultClient}
	for _, o := range opts {
		o(c)
	}
	return c
}

const userAgent = "sbx-go-client"

// request makes a request of path (escaped already) under the base URL.
func (c *Client) request(ctx context.Context, method, path string, query url.Values, body io.Reader) (*http.Request, error) {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	req.Header.Set("User-Agent", userAgent)
	return req, nil
}

// do sends req and returns the response if its status is one of ok, else
// the error the server answered with.
func (c *Client) do(req *http.Request, ok ...int) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(ok, resp.StatusCode) {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

// call sends a JSON request (in, if not nil) and decodes the JSON answer
// into out (if not nil). It returns the status, one of ok.
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any, ok ...int) (int, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, err
		}
		body = bytes.NewReader(b)
	}
	req, err := c.request(ctx, method, path, query, body)
	if err != nil {
		return 0, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.do(req, ok...)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return 0, fmt.Errorf("%s %s: decoding the answer: %w", method, req.URL.Path, err)
		}
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // lets the connection be reused
	return resp.StatusCode, nil
}

// segment is one path segment for an id; ids are never empty, "." or "..".
func segment(what, id string) (string, error) {
	if id == "" || id == "." || id == ".." {
		return "", fmt.Errorf("%s %q: %w", what, id, errdefs.ErrInvalidArgument)
	}
	return url.PathEscape(id), nil
}

// filePath escapes a workspace-relative path for the URL, each segment on
// its own, keeping the slashes. Leading and trailing slashes are dropped
// ("/data/" is "data"); empty, "." and ".." segments are refused, since
// the server would redirect such a URL instead of answering it.
func filePath(p string) (string, error) {
	trimmed := strings.Trim(p, "/")
	if trimmed == "" {
		return "", fmt.Errorf("path %q: want a workspace-relative path like dir/data.csv: %w", p, errdefs.ErrInvalidArgument)
	}
	segs := strings.Split(trimmed, "/")
	for i, s := range segs {
		if s == "" || s == "." || s == ".." {
			return "", fmt.Errorf("path %q: empty, \".\" and \"..\" segments are not allowed: %w", p, errdefs.ErrInvalidArgument)
		}
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/"), nil
}

// Healthz asks whether the server is up.
func (c *Client) Healthz(ctx context.Context) (*api.Health, error) {
	var h api.Health
	if _, err := c.call(ctx, http.MethodGet, "/healthz", nil, nil, &h, http.StatusOK); err != nil {
		return nil, err
	}
	return &h, nil
}

// Readyz asks whether the server can take work. When it cannot, the error
// is an *APIError with status 503 and the Health, which says what is
// wrong, is returned too.
func (c *Client) Readyz(ctx context.Context) (*api.Health, error) {
	req, err := c.request(ctx, http.MethodGet, "/readyz", nil, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.do(req, http.StatusOK, http.StatusServiceUnavailable)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var h api.Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return nil, fmt.Errorf("readyz: decoding the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var bad []string
		for _, k := range slices.Sorted(maps.Keys(h.Checks)) {
			if h.Checks[k] != "ok" {
				bad = append(bad, k+": "+h.Checks[k])
			}
		}
		return &h, &APIError{StatusCode: resp.StatusCode, Code: CodeUnavailable, Message: "not ready: " + strings.Join(bad, "; "),
			RetryAfter: retryAfter(resp.Header.Get("Retry-After"))}
	}
	return &h, nil
}
