//go:build integration

package server_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/chat"
	"github.com/sbx-sandbox/sbx/internal/chat/chattest"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// startRealChat is startReal with the chat loop against llm.
func startRealChat(t *testing.T, llm *chattest.Server) *realServer {
	t.Helper()
	testenv.New(t).Rootfs(t, "python")
	return startReal(t, t.TempDir(), func(c *app.Config) {
		c.Chat = chat.Config{BaseURL: llm.BaseURL(), Model: "test-model"}
	})
}

// TestChatSandbox: the scripted model has execute_code write a
// file in a real sandbox and read_file read it back; the events say so,
// and the file and the execution are in the user's session of the agent.
func TestChatSandbox(t *testing.T) {
	code := "import os\nos.makedirs('/workspace/out', exist_ok=True)\n" +
		"open('/workspace/out/answer.txt', 'w').write(str(6 * 7))\nprint('written')\nreturn 6 * 7"
	llm := chattest.New(t,
		chattest.Reply{Text: "Computing.", ToolCalls: []chattest.ToolCall{{ID: "x", Name: "execute_code", Arguments: chattest.Args(map[string]string{"code": code})}}},
		chattest.Reply{ToolCalls: []chattest.ToolCall{{ID: "r", Name: "read_file", Arguments: `{"path":"/workspace/out/answer.txt"}`}}},
		chattest.Reply{Text: "The answer is 42."},
	)
	rs := startRealChat(t, llm)
	c := client.New(rs.URL)
	ctx := context.Background()
	evs := chatEvents(t, c, "analyst", api.ChatRequest{UserID: "alice", ConversationID: "c1", Message: "What is 6 times 7? Keep it in a file."})
	if got, want := eventTypes(evs), "delta tool_call tool_result tool_call tool_result delta message done"; got != want {
		t.Fatalf("events %q, want %q", got, want)
	}
	var results []*api.ChatToolResult
	for _, ev := range evs {
		if ev.ToolResult != nil {
			results = append(results, ev.ToolResult)
		}
	}
	if r := results[0]; r.IsError || !strings.Contains(r.Content, "stdout:\nwritten") || !strings.Contains(r.Content, "result: 42") ||
		!strings.Contains(r.Content, "out/answer.txt") {
		t.Errorf("execute_code: %+v", r)
	}
	if r := results[1]; r.IsError || !strings.HasSuffix(r.Content, ":\n42") {
		t.Errorf("read_file: %+v", r)
	}
	// The model saw the results.
	if r := llm.Requests()[2]; !r.Contains("result: 42") || !r.Contains("(end of file):\n42") {
		t.Errorf("the last model call: %s", r.Raw)
	}
	done := evs[len(evs)-1].Done
	if done.SessionID != "sb-session-alice-analyst" || done.Steps != 3 {
		t.Errorf("done %+v", done)
	}
	rc, err := c.AgentOpenFile(ctx, "analyst", "alice", "", "out/answer.txt", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "42" {
		t.Errorf("out/answer.txt in the session: %q", b)
	}
	list, err := c.ListExecutions(ctx, done.SessionID, 10, "")
	if err != nil || len(list.Executions) != 1 || list.Executions[0].Status != api.ExecCompleted {
		t.Errorf("the session's executions: %+v %v", list, err)
	}
}

// TestChatDisconnect: a client that leaves while execute_code runs
// cancels the execution, which ends cancelled, and the model is not
// called again.
func TestChatDisconnect(t *testing.T) {
	llm := chattest.New(t, chattest.Reply{ToolCalls: []chattest.ToolCall{
		{ID: "s", Name: "execute_code", Arguments: `{"code":"import time\nprint('sleeping', flush=True)\ntime.sleep(600)","timeout":900}`},
	}})
	rs := startRealChat(t, llm)
	c := client.New(rs.URL)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := c.Chat(ctx, "analyst", api.ChatRequest{UserID: "alice", ConversationID: "c1", Message: "Sleep."})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("before the tool call: %v", err)
		}
		if ev.ToolCall != nil {
			break
		}
	}
	// Wait until the sleep runs in the sandbox (a bound for a broken
	// server, not a measure).
	const sid = "sb-session-alice-analyst"
	var id string
	for deadline := time.Now().Add(2 * time.Minute); id == ""; {
		list, err := c.ListExecutions(context.Background(), sid, 10, "")
		if err != nil && !client.IsNotFound(err) {
			t.Fatal(err)
		}
		if err == nil && len(list.Executions) == 1 && list.Executions[0].Status == api.ExecRunning {
			x, err := c.GetResult(context.Background(), list.Executions[0].ExecutionID, false, 0)
			if err == nil && strings.Contains(x.Stdout, "sleeping") {
				id = x.ExecutionID
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the execution never ran: %+v", list)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel() // the client goes away
	x, err := c.WaitResult(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if x.Status != api.ExecCancelled {
		t.Errorf("execution %s: %s, want cancelled", id, x.Status)
	}
	if n := len(llm.Requests()); n != 1 {
		t.Errorf("the model was called %d times, want once", n)
	}
}
