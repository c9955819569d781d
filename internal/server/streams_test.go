package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/chat"
	"github.com/sbx-sandbox/sbx/internal/chat/chattest"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/session"
)

// open sends a request and returns its status and body: all of it, or,
// with hold, none, the request left open until release is called (a
// stream that would go on for ever).
func (ts *testServer) open(t *testing.T, hold bool, method, path, ctype string, body []byte, hdr ...string) (code int, text string, release func()) {
	t.Helper()
	return openAt(t, ts.URL, hold, method, path, ctype, body, hdr...)
}

// openAt is open on the server at base.
func openAt(t *testing.T, base string, hold bool, method, path, ctype string, body []byte, hdr ...string) (code int, text string, release func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	release = func() {
		cancel()
		resp.Body.Close()
	}
	if hold && resp.StatusCode == http.StatusOK {
		return resp.StatusCode, "", release
	}
	b, _ := io.ReadAll(resp.Body)
	release()
	return resp.StatusCode, string(b), func() {}
}

// waitStreams waits until the server counts n streams open: a stream
// whose client left ends when its handler notices.
func waitStreams(t *testing.T, s *server.Server, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.OpenStreams() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d streams counted open, want %d", s.OpenStreams(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStreamCaps: every kind of long-lived request counts against its
// tenant's cap of its kind (--limits streams=N, chats=N for chat turns):
// with the cap's slots taken the next is 429 naming the limit, before it
// does anything (no execution submitted, no model call); another tenant
// is not counted against it; a slot given back lets the next through; and
// every request gives its slot back when it ends.
func TestStreamCaps(t *testing.T) {
	const limit = 2
	llm := chattest.New(t)
	ts := startConfigured(t, func(c *app.Config) {
		withEvents(c)
		c.Limits = session.Limits{Streams: limit, Chats: limit}
		c.Chat = chat.Config{BaseURL: llm.BaseURL(), Model: "test-model"}
	}, "alpha-key-123:alpha", "beta-key-4567:beta")
	srv := ts.app.Server
	// E2B's calls are not in the contract that ts checks.
	raw := httptest.NewServer(srv.Handler())
	defer raw.Close()
	alpha, beta := []string{"X-API-Key", "alpha-key-123"}, []string{"X-API-Key", "beta-key-4567"}
	ca := ts.client("alpha-key-123")
	if _, _, err := ca.CreateSession(context.Background(), apiSession("s1")); err != nil {
		t.Fatal(err)
	}
	// An E2B sandbox of alpha's, and its access token.
	code, body, _ := openAt(t, raw.URL, false, "POST", "/sandboxes", "application/json", []byte(`{"templateID":"base"}`), alpha...)
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &sb) != nil {
		t.Fatalf("E2B create: %d %s", code, body)
	}
	e2b := func(port string) []string {
		return []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", port, "X-Access-Token", sb.EnvdAccessToken}
	}
	sse := []string{"Accept", "text/event-stream"}
	with := func(a ...[]string) []string {
		var out []string
		for _, h := range a {
			out = append(out, h...)
		}
		return out
	}

	for _, c := range []struct {
		name         string
		kind         server.StreamKind
		limitName    string
		hold         bool // the request stays open when let through
		method, path string
		ctype        string
		body         string
		hdr          []string
		betaHdr      []string // the same request as beta, if it can be
		passed       int      // the status once let through
		llmReply     bool     // the request calls the model
		raw          bool     // E2B's: not through the contract checker
	}{
		{name: "event stream", kind: server.EventStreams, limitName: "streams", hold: true, method: "GET", path: "/api/v1/events",
			hdr: with(alpha, sse), betaHdr: with(beta, sse), passed: 200},
		{name: "session event stream", kind: server.EventStreams, limitName: "streams", hold: true, method: "GET", path: "/api/v1/sessions/s1/events",
			hdr: with(alpha, sse), passed: 200},
		{name: "execute as a stream", kind: server.ExecStreams, limitName: "streams", method: "POST", path: "/api/v1/sessions/s1/execute",
			ctype: "application/json", body: `{"code":"print(1)"}`, hdr: with(alpha, sse), passed: 200},
		{name: "execute ?wait=true", kind: server.ExecStreams, limitName: "streams", method: "POST", path: "/api/v1/sessions/s1/execute?wait=true",
			ctype: "application/json", body: `{"code":"print(1)"}`, hdr: alpha, passed: 503},
		{name: "agent execute ?wait=true", kind: server.ExecStreams, limitName: "streams", method: "POST", path: "/api/v1/agents/a1/execute?wait=true",
			ctype: "application/json", body: `{"user_id":"u1","code":"print(1)"}`, hdr: alpha, passed: 503},
		{name: "result ?wait=true", kind: server.ExecStreams, limitName: "streams", method: "GET", path: "/api/v1/executions/exec-none/result?wait=true",
			hdr: alpha, betaHdr: beta, passed: 404},
		{name: "build log as a stream", kind: server.LogFollows, limitName: "streams", method: "GET", path: "/api/v1/templates/python/builds/b-none/logs",
			hdr: with(alpha, sse), betaHdr: with(beta, sse), passed: 404},
		{name: "build log ?follow=true", kind: server.LogFollows, limitName: "streams", method: "GET", path: "/api/v1/templates/python/builds/b-none/logs?follow=true",
			hdr: alpha, passed: 404},
		{name: "E2B process Start", kind: server.E2BStreams, limitName: "streams", method: "POST", path: "/process.Process/Start",
			ctype: "application/connect+json", body: envelope(`{"process":{"cmd":"/bin/bash","args":["-c","true"]}}`), hdr: e2b("49983"), passed: 200, raw: true},
		{name: "E2B interpreter cell", kind: server.E2BStreams, limitName: "streams", method: "POST", path: "/execute",
			ctype: "application/json", body: `{"code":"1"}`, hdr: e2b("49999"), passed: 200, raw: true},
		{name: "chat turn", kind: server.ChatTurns, limitName: "chats", method: "POST", path: "/api/v1/agents/a1/chat",
			ctype: "application/json", body: `{"user_id":"u1","conversation_id":"c1","message":"hi"}`, hdr: alpha, betaHdr: beta, passed: 200, llmReply: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := ts.URL
			if c.raw {
				base = raw.URL
			}
			var held []func()
			for range limit {
				release, err := srv.OpenStream("alpha", c.kind)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, release)
			}
			executions, sessions := len(listExecutions(t, ts, alpha)), countSessions(t, ts, alpha)
			calls := len(llm.Requests())
			code, body, _ := openAt(t, base, false, c.method, c.path, c.ctype, []byte(c.body), c.hdr...)
			if code != http.StatusTooManyRequests || !strings.Contains(body, "limit "+c.limitName) {
				t.Errorf("past the cap: %d %s, want 429 naming %s", code, body, c.limitName)
			}
			if n := len(listExecutions(t, ts, alpha)); n != executions {
				t.Errorf("a refused request submitted an execution (%d, were %d)", n, executions)
			}
			if n := countSessions(t, ts, alpha); n != sessions {
				t.Errorf("a refused request made a session (%d, were %d)", n, sessions)
			}
			if n := len(llm.Requests()); n != calls {
				t.Errorf("a refused chat turn called the model")
			}
			if c.betaHdr != nil {
				if c.llmReply {
					llm.Add(chattest.Reply{Text: "hello"})
				}
				code, body, release := openAt(t, base, c.hold, c.method, c.path, c.ctype, []byte(c.body), c.betaHdr...)
				release()
				if code != c.passed {
					t.Errorf("another tenant: %d %s, want %d", code, body, c.passed)
				}
			}
			waitStreams(t, srv, limit)
			held[0]()
			held[0]() // twice is once
			if c.llmReply {
				llm.Add(chattest.Reply{Text: "hello"})
			}
			code, body, release := openAt(t, base, c.hold, c.method, c.path, c.ctype, []byte(c.body), c.hdr...)
			if code != c.passed {
				t.Errorf("a slot given back: %d %s, want %d", code, body, c.passed)
			}
			release()
			for _, r := range held[1:] {
				r()
			}
			waitStreams(t, srv, 0)
		})
	}
}

// apiSession is a request for a session of id, without a sandbox.
func apiSession(id string) api.CreateSessionRequest { return api.CreateSessionRequest{SessionID: id} }

// listExecutions are the ids of the tenant's executions in session s1.
func listExecutions(t *testing.T, ts *testServer, hdr []string) []string {
	t.Helper()
	code, body, _ := ts.open(t, false, "GET", "/api/v1/sessions/s1/executions", "", nil, hdr...)
	var list api.ExecutionList
	if code != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil {
		t.Fatalf("executions: %d %s", code, body)
	}
	var out []string
	for _, x := range list.Executions {
		out = append(out, x.ExecutionID)
	}
	return out
}

// countSessions is how many sessions the tenant has.
func countSessions(t *testing.T, ts *testServer, hdr []string) int {
	t.Helper()
	code, body, _ := ts.open(t, false, "GET", "/api/v1/sessions", "", nil, hdr...)
	var list api.SessionList
	if code != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil {
		t.Fatalf("sessions: %d %s", code, body)
	}
	return len(list.Sessions)
}

// envelope is a Connect streaming request's one message.
func envelope(msg string) string { return string(connectEnvelope(msg)) }

func TestParseStreamLimits(t *testing.T) {
	l, err := server.ParseLimits("streams=5,chats=3,chat_tokens=250K", session.Limits{Sessions: 7})
	if err != nil || l != (session.Limits{Sessions: 7, Streams: 5, Chats: 3, ChatTokens: 250000}) {
		t.Errorf("ParseLimits = %+v, %v", l, err)
	}
	if l, err := server.ParseLimits("chat_tokens=2m", session.Limits{}); err != nil || l.ChatTokens != 2000000 {
		t.Errorf("chat_tokens=2m: %+v, %v", l, err)
	}
	for _, bad := range []string{"streams=-1", "chats=many", "chat_tokens=1G", "chat_tokens=-5"} {
		if _, err := server.ParseLimits(bad, session.Limits{}); err == nil {
			t.Errorf("ParseLimits(%q) succeeded", bad)
		}
	}
}
