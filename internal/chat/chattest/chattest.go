// Package chattest is an OpenAI-compatible chat-completions endpoint for
// tests, which answers from a script in the real wire format: a streamed
// answer is `data: {chunk}` lines (chat.completion.chunk objects whose
// choices[0].delta carries content pieces and tool_calls fragments, split
// across chunks), a chunk with finish_reason, the usage chunk when asked
// for, and `data: [DONE]`; an answer without streaming is one
// chat.completion object. Errors are OpenAI's error bodies.
package chattest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// Reply is the server's answer to one request, the next of the script.
type Reply struct {
	// Text is the assistant's text, streamed in pieces of Piece bytes
	// (default 3).
	Text  string
	Piece int
	// ToolCalls are tool calls, each streamed as a first fragment with
	// the id and name, then its arguments in pieces of Piece bytes; with
	// Interleave, the fragments of the calls alternate.
	ToolCalls  []ToolCall
	Interleave bool
	// RepeatIDs sends each call's id and name again in every fragment,
	// as some servers do.
	RepeatIDs bool
	// Finish is the finish_reason (default "tool_calls" with tool calls,
	// else "stop"); NoFinish sends none.
	Finish   string
	NoFinish bool
	// Status, if not 0, answers with that HTTP status and an OpenAI error
	// body saying Message, instead of a stream.
	Status  int
	Message string
	// CutAfter, if not 0, breaks the connection after that many chunks
	// (the client sees a stream cut short); EndAfter ends the response
	// cleanly after that many chunks, without finish_reason or [DONE].
	CutAfter, EndAfter int
	// Hang sends the chunks and then waits, answering nothing more, until
	// the client goes away.
	Hang bool
	// StreamError sends an error object in the stream after the chunks.
	StreamError string
	// Drop closes the connection without an answer (the client's error
	// then quotes the URL it called).
	Drop bool
	// Usage is the total_tokens the reply reports (default 15: prompt
	// 10, completion 5), when usage is asked for; NoUsage reports none,
	// as some servers do.
	Usage   int
	NoUsage bool
}

// ToolCall is one tool call of a Reply.
type ToolCall struct {
	ID, Name, Arguments string
}

// Request is what the server was sent.
type Request struct {
	Header http.Header
	Body   struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role       string `json:"role"`
			Content    any    `json:"content"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"messages"`
		Tools []struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	Raw []byte
}

// Text is the content of message i, whatever its form.
func (r Request) Text(i int) string {
	switch c := r.Body.Messages[i].Content.(type) {
	case string:
		return c
	case nil:
		return ""
	default:
		b, _ := json.Marshal(c)
		return string(b)
	}
}

// Server is the scripted endpoint. Its URL + "/v1" is the base URL to
// configure.
type Server struct {
	*httptest.Server
	t testing.TB

	mu       sync.Mutex
	script   []Reply
	requests []Request
	gone     chan struct{} // closed when a Hang reply's client went away
	arrived  chan struct{} // closed, and made anew, at each request
}

// New starts a server that answers with replies, one per request, in
// order; a request past the end of the script fails the test and is
// answered 500. It stops when the test ends.
func New(t testing.TB, replies ...Reply) *Server {
	s := &Server{t: t, script: replies, gone: make(chan struct{}), arrived: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// NewOn is New listening on addr (HOST:PORT) instead of loopback: for a
// server that is not on this host's loopback, such as sbx in a Pod of
// the test cluster, which reaches the host at the Pods' gateway.
func NewOn(t testing.TB, addr string, replies ...Reply) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("chattest: listen on %s: %v", addr, err)
	}
	s := &Server{t: t, script: replies, gone: make(chan struct{}), arrived: make(chan struct{})}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.Server.Listener.Close()
	s.Server.Listener = ln
	s.Server.Start()
	t.Cleanup(s.Close)
	return s
}

// BaseURL is the URL to configure as the endpoint's base.
func (s *Server) BaseURL() string { return s.URL + "/v1" }

// Add appends replies to the script.
func (s *Server) Add(replies ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, replies...)
}

// Requests are the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// WaitRequests waits until the server has had n requests, or ctx ends.
func (s *Server) WaitRequests(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		have, arrived := len(s.requests), s.arrived
		s.mu.Unlock()
		if have >= n {
			return nil
		}
		select {
		case <-arrived:
		case <-ctx.Done():
			return fmt.Errorf("chattest: %d requests, waiting for %d: %w", have, n, ctx.Err())
		}
	}
}

// Left is closed when the client of a Hang reply has gone away.
func (s *Server) Left() <-chan struct{} { return s.gone }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	// Any base path: a test may give the endpoint's URL a path of its
	// own (a marker that must not reach a client).
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/v1") || !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		http.Error(w, `{"error":{"message":"no such endpoint","type":"invalid_request_error"}}`, http.StatusNotFound)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	req := Request{Header: r.Header.Clone(), Raw: raw}
	if err := json.Unmarshal(raw, &req.Body); err != nil {
		s.t.Errorf("chattest: a request that is not JSON: %v: %s", err, raw)
	}
	s.mu.Lock()
	s.requests = append(s.requests, req)
	n := len(s.requests)
	close(s.arrived)
	s.arrived = make(chan struct{})
	var rep Reply
	ok := n <= len(s.script)
	if ok {
		rep = s.script[n-1]
	}
	s.mu.Unlock()
	if !ok {
		s.t.Errorf("chattest: request %d, but the script has %d replies", n, len(s.script))
		writeError(w, http.StatusInternalServerError, "the script has no reply for this request")
		return
	}
	if rep.Drop {
		panic(http.ErrAbortHandler) // the connection closes, nothing sent
	}
	if rep.Status != 0 {
		writeError(w, rep.Status, rep.Message)
		return
	}
	if !req.Body.Stream {
		s.complete(w, rep)
		return
	}
	s.stream(w, r, rep, req.Body.StreamOptions != nil && req.Body.StreamOptions.IncludeUsage)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "server_error", "code": nil, "param": nil}})
}

// usage is what a reply counts.
func usage(rep Reply) map[string]int {
	if rep.Usage > 0 {
		return map[string]int{"prompt_tokens": rep.Usage - rep.Usage/3, "completion_tokens": rep.Usage / 3, "total_tokens": rep.Usage}
	}
	return map[string]int{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
}

func (s *Server) complete(w http.ResponseWriter, rep Reply) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"id": "chatcmpl-test", "object": "chat.completion", "created": 1700000000, "model": "test-model",
		"choices": []any{map[string]any{
			"index": 0, "finish_reason": "stop", "logprobs": nil,
			"message": map[string]any{"role": "assistant", "content": rep.Text, "refusal": nil},
		}},
		"usage": func() any {
			if rep.NoUsage {
				return nil
			}
			return usage(rep)
		}(),
	})
}

// chunks are a streamed reply's chunks, before the finish.
func chunks(rep Reply) []map[string]any {
	piece := rep.Piece
	if piece <= 0 {
		piece = 3
	}
	split := func(s string) []string {
		var out []string
		for len(s) > piece {
			out = append(out, s[:piece])
			s = s[piece:]
		}
		return append(out, s)
	}
	var deltas []map[string]any
	deltas = append(deltas, map[string]any{"role": "assistant", "content": ""})
	if rep.Text != "" {
		for _, p := range split(rep.Text) {
			deltas = append(deltas, map[string]any{"content": p})
		}
	}
	frags := make([][]map[string]any, len(rep.ToolCalls))
	for i, tc := range rep.ToolCalls {
		first := map[string]any{"index": i, "type": "function", "function": map[string]any{"name": tc.Name, "arguments": ""}}
		if tc.ID != "" {
			first["id"] = tc.ID
		}
		frags[i] = append(frags[i], first)
		if tc.Arguments != "" {
			for _, p := range split(tc.Arguments) {
				f := map[string]any{"index": i, "function": map[string]any{"arguments": p}}
				if rep.RepeatIDs {
					f["id"], f["type"], f["function"].(map[string]any)["name"] = tc.ID, "function", tc.Name
				}
				frags[i] = append(frags[i], f)
			}
		}
	}
	if rep.Interleave {
		for k := 0; ; k++ {
			more := false
			for i := range frags {
				if k < len(frags[i]) {
					deltas = append(deltas, map[string]any{"tool_calls": []any{frags[i][k]}})
					more = true
				}
			}
			if !more {
				break
			}
		}
	} else {
		for i := range frags {
			for _, f := range frags[i] {
				deltas = append(deltas, map[string]any{"tool_calls": []any{f}})
			}
		}
	}
	out := make([]map[string]any, len(deltas))
	for i, d := range deltas {
		out[i] = chunk([]any{map[string]any{"index": 0, "delta": d, "finish_reason": nil, "logprobs": nil}})
	}
	return out
}

func chunk(choices []any) map[string]any {
	return map[string]any{
		"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1700000000, "model": "test-model",
		"system_fingerprint": "fp_test", "choices": choices,
	}
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request, rep Reply, withUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		rc.Flush()
	}
	for i, c := range chunks(rep) {
		if rep.CutAfter > 0 && i == rep.CutAfter {
			panic(http.ErrAbortHandler) // the connection breaks
		}
		if rep.EndAfter > 0 && i == rep.EndAfter {
			return
		}
		send(c)
	}
	if rep.Hang {
		<-r.Context().Done()
		s.mu.Lock()
		select {
		case <-s.gone:
		default:
			close(s.gone)
		}
		s.mu.Unlock()
		return
	}
	if rep.StreamError != "" {
		send(map[string]any{"error": map[string]any{"message": rep.StreamError, "type": "server_error"}})
		return
	}
	if !rep.NoFinish {
		finish := rep.Finish
		if finish == "" {
			finish = "stop"
			if len(rep.ToolCalls) > 0 {
				finish = "tool_calls"
			}
		}
		send(chunk([]any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": finish, "logprobs": nil}}))
	}
	if withUsage && !rep.NoUsage {
		c := chunk([]any{})
		c["usage"] = usage(rep)
		send(c)
	}
	io.WriteString(w, "data: [DONE]\n\n")
	rc.Flush()
}

// Args is JSON of v, for a ToolCall's Arguments.
func Args(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// Contains reports whether any message of r has s in its text.
func (r Request) Contains(s string) bool {
	for i := range r.Body.Messages {
		if strings.Contains(r.Text(i), s) {
			return true
		}
	}
	return false
}
