package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/chat"
	"github.com/sbx-sandbox/sbx/internal/chat/chattest"
)

// startChat is start with the chat loop against llm.
func startChat(t *testing.T, llm *chattest.Server, keySpecs ...string) *testServer {
	t.Helper()
	return startConfigured(t, func(c *app.Config) {
		c.Chat = chat.Config{BaseURL: llm.BaseURL(), Model: "test-model", APIKey: "sk-llm"}
	}, keySpecs...)
}

// chatEvents runs a chat turn through the Go client and returns its
// events.
func chatEvents(t *testing.T, c *client.Client, agent string, req api.ChatRequest) []*client.ChatEvent {
	t.Helper()
	s, err := c.Chat(context.Background(), agent, req)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	defer s.Close()
	var out []*client.ChatEvent
	for {
		ev, err := s.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("chat: %v", err)
		}
		out = append(out, ev)
	}
}

// eventTypes are the events' types, deltas merged into one.
func eventTypes(evs []*client.ChatEvent) string {
	var out []string
	for _, ev := range evs {
		if ev.Type == api.ChatEventDelta && len(out) > 0 && out[len(out)-1] == api.ChatEventDelta {
			continue
		}
		out = append(out, ev.Type)
	}
	return strings.Join(out, " ")
}

// TestChat: the chat endpoint against a scripted model, with the file
// tools (no sandbox needed): they really run in the user's session of the
// agent, in its conversation's view, and the history is the tenant's.
func TestChat(t *testing.T) {
	llm := chattest.New(t,
		chattest.Reply{Text: "I will write it.", ToolCalls: []chattest.ToolCall{
			{ID: "w", Name: "upload_file", Arguments: chattest.Args(map[string]string{"path": "/workspace/notes/hello.txt", "content": "hello from the model"})},
		}},
		chattest.Reply{ToolCalls: []chattest.ToolCall{
			{ID: "r", Name: "read_file", Arguments: `{"path":"notes/hello.txt"}`},
			{ID: "u", Name: "read_file", Arguments: `{"path":"/workspace/uploads/temparea/data.csv"}`},
			{ID: "bad", Name: "list_files", Arguments: `{"path":"notes","colour":"blue"}`},
		}},
		chattest.Reply{Text: "The file says: hello from the model."},
	)
	ts := startChat(t, llm, "alpha-key-1:alpha", "beta-key-1:beta")
	ca, cb := ts.client("alpha-key-1"), ts.client("beta-key-1")
	if _, err := ca.AgentUpload(context.Background(), "analyst", "alice", client.UploadOptions{ConversationID: "c1"},
		client.UploadFile{Name: "data.csv", Reader: strings.NewReader("a,b\n1,2\n")}); err != nil {
		t.Fatal(err)
	}
	evs := chatEvents(t, ca, "analyst", api.ChatRequest{UserID: "alice", ConversationID: "c1", Message: "Write hello to notes/hello.txt and read it back"})
	if got, want := eventTypes(evs), "delta tool_call tool_result tool_call tool_result tool_call tool_result tool_call tool_result delta message done"; got != want {
		t.Fatalf("events %q, want %q", got, want)
	}
	results := map[string]*api.ChatToolResult{}
	for _, ev := range evs {
		if ev.ToolResult != nil {
			results[ev.ToolResult.ID] = ev.ToolResult
		}
	}
	if r := results["r"]; r.IsError || !strings.Contains(r.Content, "hello from the model") {
		t.Errorf("read_file: %+v", r)
	}
	if r := results["u"]; r.IsError || !strings.Contains(r.Content, "a,b") {
		t.Errorf("read_file of the conversation's upload: %+v", r)
	}
	if r := results["bad"]; !r.IsError || !strings.Contains(r.Content, "colour") {
		t.Errorf("list_files with a field it does not take: %+v, want an error result", r)
	}
	last := evs[len(evs)-1].Done
	if last.SessionID != "sb-session-alice-analyst" || last.ConversationID != "c1" || last.Steps != 3 {
		t.Errorf("done %+v", last)
	}
	// The file is in the session of alice's analyst.
	rc, err := ca.AgentOpenFile(context.Background(), "analyst", "alice", "", "notes/hello.txt", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello from the model" {
		t.Errorf("the file in the session: %q", b)
	}
	if h := llm.Requests()[0].Header.Get("Authorization"); h != "Bearer sk-llm" {
		t.Errorf("the endpoint got Authorization %q", h)
	}

	// Tenant beta's conversation of the same ids starts empty, and its
	// files are its own.
	llm.Add(chattest.Reply{Text: "Hello, beta."})
	evs = chatEvents(t, cb, "analyst", api.ChatRequest{UserID: "alice", ConversationID: "c1", Message: "hi"})
	if eventTypes(evs) != "delta message done" {
		t.Errorf("beta's chat: %q", eventTypes(evs))
	}
	if r := llm.Requests()[3]; len(r.Body.Messages) != 2 || r.Contains("hello from the model") {
		t.Errorf("beta's turn was sent alpha's history: %s", r.Raw)
	}
	if _, err := cb.AgentOpenFile(context.Background(), "analyst", "alice", "", "notes/hello.txt", 0, 0); !client.IsNotFound(err) {
		t.Errorf("beta reads alpha's file: %v", err)
	}

	// Alpha's next turn has the first; forgotten, the one after has not,
	// and the conversation's upload is gone.
	llm.Add(chattest.Reply{Text: "You asked for a file."}, chattest.Reply{Text: "I do not know."})
	chatEvents(t, ca, "analyst", api.ChatRequest{UserID: "alice", ConversationID: "c1", Message: "What did I ask?"})
	if r := llm.Requests()[4]; !r.Contains("Write hello to notes/hello.txt") || !r.Contains("hello from the model") {
		t.Errorf("the second turn was not sent the first: %s", r.Raw)
	}
	if err := ca.ForgetConversation(context.Background(), "analyst", "alice", "c1"); err != nil {
		t.Fatal(err)
	}
	chatEvents(t, ca, "analyst", api.ChatRequest{UserID: "alice", ConversationID: "c1", Message: "What did I ask?"})
	if r := llm.Requests()[5]; len(r.Body.Messages) != 2 {
		t.Errorf("a forgotten conversation was sent: %s", r.Raw)
	}
	if _, err := ca.AgentOpenFile(context.Background(), "analyst", "alice", "c1", "data.csv", 0, 0); !client.IsNotFound(err) {
		t.Errorf("the forgotten conversation's upload: %v", err)
	}
	// Forgetting twice, or for a user without a session, is no error.
	for _, user := range []string{"alice", "nobody"} {
		if err := ca.ForgetConversation(context.Background(), "analyst", user, "c1"); err != nil {
			t.Errorf("forget for %s: %v", user, err)
		}
	}
}

// TestChatRequests: a server without a model says so; requests that are
// wrong are refused before anything runs; a tool that cannot run ends the
// turn with tool_error.
func TestChatRequests(t *testing.T) {
	ts := start(t)
	resp, b := ts.do(t, "POST", "/api/v1/agents/analyst/chat", "application/json",
		strings.NewReader(`{"user_id":"alice","conversation_id":"c1","message":"hi"}`))
	if resp.StatusCode != 503 || errorCode(t, b) != "unavailable" || !strings.Contains(string(b), "--llm-base-url") {
		t.Errorf("chat without a model: %d %s", resp.StatusCode, b)
	}

	llm := chattest.New(t, chattest.Reply{ToolCalls: []chattest.ToolCall{{ID: "x", Name: "execute_code", Arguments: `{"code":"return 1"}`}}})
	ts = startChat(t, llm)
	for _, body := range []string{
		`{"conversation_id":"c1","message":"hi"}`,
		`{"user_id":"alice","message":"hi"}`,
		`{"user_id":"alice","conversation_id":"../x","message":"hi"}`,
		`{"user_id":"alice","conversation_id":"c1","message":"  "}`,
		`{"user_id":"alice","conversation_id":"c1","message":"hi","temperature":1}`,
		`{"user_id":"al/ice","conversation_id":"c1","message":"hi"}`,
	} {
		resp, b := ts.do(t, "POST", "/api/v1/agents/analyst/chat", "application/json", strings.NewReader(body))
		if resp.StatusCode != 400 || errorCode(t, b) != "invalid_argument" {
			t.Errorf("%s: %d %s, want 400", body, resp.StatusCode, b)
		}
	}
	if len(llm.Requests()) != 0 {
		t.Errorf("refused requests reached the model")
	}
	// No runtime here: execute_code cannot run, and says why.
	evs := chatEvents(t, ts.client(""), "analyst", api.ChatRequest{UserID: "alice", ConversationID: "c1", Message: "run it"})
	if got := eventTypes(evs); got != "tool_call error done" || evs[1].Error.Code != api.ChatErrTool || !strings.Contains(evs[1].Error.Message, "execute_code") {
		t.Errorf("events %q (%+v)", got, evs[1])
	}
	var ae *client.APIError
	_, err := ts.client("").Chat(context.Background(), "bad agent", api.ChatRequest{UserID: "alice", ConversationID: "c1", Message: "hi"})
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest {
		t.Errorf("bad agent id: %v", err)
	}
}
