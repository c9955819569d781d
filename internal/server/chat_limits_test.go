package server_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/chat"
	"github.com/sbx-sandbox/sbx/internal/chat/chattest"
	"github.com/sbx-sandbox/sbx/internal/session"
)

// chatBody is a chat request of user u1 in conversation c, with extra
// JSON fields.
func chatBody(c, extra string) []byte {
	return []byte(`{"user_id":"u1","conversation_id":"` + c + `","message":"hi"` + extra + `}`)
}

// A request may name only a model the operator offers (--llm-models):
// another is 400 with the list, and the endpoint is never called.
func TestChatModels(t *testing.T) {
	llm := chattest.New(t, chattest.Reply{Text: "small talk"})
	ts := startConfigured(t, func(c *app.Config) {
		c.Chat = chat.Config{BaseURL: llm.BaseURL(), Model: "test-model", Models: []string{"test-model", "small"}, APIKey: "sk-llm"}
	}, "alpha-key-123:alpha")
	key := []string{"X-API-Key", "alpha-key-123"}
	code, body, _ := ts.open(t, false, "POST", "/api/v1/agents/a1/chat", "application/json", chatBody("c1", `,"model":"gpt-dearest"`), key...)
	if code != http.StatusBadRequest || !strings.Contains(body, "test-model, small") {
		t.Errorf("a model not offered: %d %s, want 400 with the models", code, body)
	}
	if n := len(llm.Requests()); n != 0 {
		t.Fatalf("the endpoint was called %d times for a model not offered", n)
	}
	code, body, _ = ts.open(t, false, "POST", "/api/v1/agents/a1/chat", "application/json", chatBody("c1", `,"model":"small"`), key...)
	if code != http.StatusOK || !strings.Contains(body, "small talk") {
		t.Errorf("an offered model: %d %s", code, body)
	}
	if r := llm.Requests(); len(r) != 1 || r[0].Body.Model != "small" {
		t.Errorf("the endpoint was asked for %+v", r)
	}
}

// --limits chats=N: N turns blocked in the endpoint, the next is 429
// naming the limit, another tenant's are its own, and a turn that ends
// frees its slot.
func TestChatConcurrency(t *testing.T) {
	const chats = 2
	llm := chattest.New(t, chattest.Reply{Text: "wait", Hang: true}, chattest.Reply{Text: "wait", Hang: true})
	ts := startConfigured(t, func(c *app.Config) {
		c.Chat = chat.Config{BaseURL: llm.BaseURL(), Model: "test-model"}
		c.Limits = session.Limits{Chats: chats}
	}, "alpha-key-123:alpha", "beta-key-4567:beta")
	alpha, beta := []string{"X-API-Key", "alpha-key-123"}, []string{"X-API-Key", "beta-key-4567"}
	var releases []func()
	for i := range chats {
		code, body, release := ts.open(t, true, "POST", "/api/v1/agents/a1/chat", "application/json", chatBody("c"+strconv.Itoa(i), ""), alpha...)
		if code != http.StatusOK {
			t.Fatalf("turn %d: %d %s", i, code, body)
		}
		releases = append(releases, release)
	}
	if err := llm.WaitRequests(context.Background(), chats); err != nil {
		t.Fatal(err)
	}
	code, body, _ := ts.open(t, false, "POST", "/api/v1/agents/a1/chat", "application/json", chatBody("c9", ""), alpha...)
	if code != http.StatusTooManyRequests || !strings.Contains(body, "limit chats") {
		t.Errorf("a turn past the cap: %d %s, want 429 naming chats", code, body)
	}
	if n := len(llm.Requests()); n != chats {
		t.Errorf("the refused turn called the endpoint (%d calls)", n)
	}
	llm.Add(chattest.Reply{Text: "beta's"})
	if code, body, _ := ts.open(t, false, "POST", "/api/v1/agents/a1/chat", "application/json", chatBody("c1", ""), beta...); code != http.StatusOK || !strings.Contains(body, "beta's") {
		t.Errorf("another tenant's turn: %d %s", code, body)
	}
	releases[0]()
	waitStreams(t, ts.app.Server, chats-1)
	llm.Add(chattest.Reply{Text: "now"})
	if code, body, _ := ts.open(t, false, "POST", "/api/v1/agents/a1/chat", "application/json", chatBody("c9", ""), alpha...); code != http.StatusOK || !strings.Contains(body, "now") {
		t.Errorf("a turn after one ended: %d %s", code, body)
	}
	releases[1]()
	waitStreams(t, ts.app.Server, 0)
}

// --limits chat_tokens=N: the tokens the endpoint reports count; a turn
// once they are spent is 429 naming the limit, with a Retry-After of when
// they will not be; another tenant's budget is its own.
func TestChatTokenBudget(t *testing.T) {
	llm := chattest.New(t, chattest.Reply{Text: "dear", Usage: 1500})
	ts := startConfigured(t, func(c *app.Config) {
		c.Chat = chat.Config{BaseURL: llm.BaseURL(), Model: "test-model"}
		c.Limits = session.Limits{ChatTokens: 1000}
	}, "alpha-key-123:alpha", "beta-key-4567:beta")
	alpha, beta := []string{"X-API-Key", "alpha-key-123"}, []string{"X-API-Key", "beta-key-4567"}
	if code, body, _ := ts.open(t, false, "POST", "/api/v1/agents/a1/chat", "application/json", chatBody("c1", ""), alpha...); code != http.StatusOK || !strings.Contains(body, `"total_tokens":1500`) {
		t.Fatalf("the first turn: %d %s", code, body)
	}
	resp, b := ts.do(t, "POST", "/api/v1/agents/a1/chat", "application/json", bytes.NewReader(chatBody("c1", "")), alpha...)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), "limit chat_tokens") {
		t.Errorf("a turn past the budget: %d %s, want 429 naming chat_tokens", resp.StatusCode, b)
	}
	// 500 tokens over a budget of 1000 an hour: half an hour, less the
	// time since the first turn (not the default 5 s of other limits).
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra <= 60 || ra > 1805 {
		t.Errorf("Retry-After %q, want up to half an hour", resp.Header.Get("Retry-After"))
	}
	if n := len(llm.Requests()); n != 1 {
		t.Errorf("%d calls, want 1", n)
	}
	llm.Add(chattest.Reply{Text: "beta's"})
	if code, body, _ := ts.open(t, false, "POST", "/api/v1/agents/a1/chat", "application/json", chatBody("c1", ""), beta...); code != http.StatusOK || !strings.Contains(body, "beta's") {
		t.Errorf("another tenant's turn: %d %s", code, body)
	}
}

// An endpoint's failure reaches the client as a fixed message with the
// request's id, never the endpoint's words or URL (a marker in both); the
// server's log has the whole error under the same id.
func TestChatEndpointErrorHidden(t *testing.T) {
	const marker = "mk-5ecret-upstream"
	llm := chattest.New(t,
		chattest.Reply{Status: 500, Message: "proxy error: http://10.9.8.7:8000/" + marker + " answered: quota of account " + marker},
		chattest.Reply{Drop: true},
	)
	var log syncBuffer
	ts := startConfigured(t, func(c *app.Config) {
		c.Chat = chat.Config{BaseURL: llm.BaseURL() + "/" + marker, Model: "test-model"}
		c.Log = slog.New(slog.NewJSONHandler(&log, nil))
	}, "alpha-key-123:alpha")
	for _, what := range []string{"an error answer", "a dropped connection"} {
		resp, b := ts.do(t, "POST", "/api/v1/agents/a1/chat", "application/json", bytes.NewReader(chatBody("c1", "")), "X-API-Key", "alpha-key-123")
		body := string(b)
		id := resp.Header.Get("X-Request-Id")
		if resp.StatusCode != http.StatusOK || id == "" || !strings.Contains(body, "llm_error") {
			t.Fatalf("%s: %d (request %q) %s", what, resp.StatusCode, id, body)
		}
		if strings.Contains(body, marker) || strings.Contains(body, "10.9.8.7") || strings.Contains(body, "127.0.0.1") {
			t.Errorf("%s: the client was shown the endpoint's words or URL: %s", what, body)
		}
		if !strings.Contains(body, "(request "+id+";") {
			t.Errorf("%s: the message does not give the request id %s: %s", what, id, body)
		}
		found := false
		for _, line := range strings.Split(log.String(), "\n") {
			found = found || (strings.Contains(line, `"request_id":"`+id+`"`) && strings.Contains(line, marker) && strings.Contains(line, "model call failed"))
		}
		if !found {
			t.Errorf("%s: no log line of request %s with the endpoint's error:\n%s", what, id, log.String())
		}
	}
}
