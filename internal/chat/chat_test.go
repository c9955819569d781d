package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/chat"
	"github.com/sbx-sandbox/sbx/internal/chat/chattest"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeTools are two tools that answer from a function of the test.
type fakeTools struct {
	mu    sync.Mutex
	calls []string // "name args"
	run   func(ctx context.Context, name string, args json.RawMessage) (string, bool, error)
}

func (f *fakeTools) List() []api.Tool {
	obj := json.RawMessage(`{"type":"object","properties":{"code":{"type":"string"},"path":{"type":"string"}}}`)
	return []api.Tool{
		{Type: "function", Function: api.ToolFunction{Name: "execute_code", Description: "Run Python.", Parameters: obj}},
		{Type: "function", Function: api.ToolFunction{Name: "read_file", Description: "Read a file.", Parameters: obj}},
	}
}

func (f *fakeTools) Call(ctx context.Context, name string, args json.RawMessage) (string, bool, error) {
	f.mu.Lock()
	f.calls = append(f.calls, name+" "+string(args))
	f.mu.Unlock()
	if f.run != nil {
		return f.run(ctx, name, args)
	}
	return "ran " + name, false, nil
}

func (f *fakeTools) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newChat(t *testing.T, srv *chattest.Server, st store.Store, configure ...func(*chat.Config)) *chat.Chat {
	t.Helper()
	cfg := chat.Config{BaseURL: srv.BaseURL(), Model: "test-model", APIKey: "sk-test-key",
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	for _, f := range configure {
		f(&cfg)
	}
	c, err := chat.New(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testWriter shows the loop's log in the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func request(msg string) chat.Request {
	return chat.Request{Tenant: "t1", UserID: "alice", AgentID: "analyst", ConversationID: "c1", SessionID: "sb-session-alice-analyst", Message: msg}
}

// run runs a turn and returns its events.
func run(ctx context.Context, c *chat.Chat, req chat.Request, tools chat.Tools) []chat.Event {
	var evs []chat.Event
	c.Run(ctx, req, tools, func(ev chat.Event) { evs = append(evs, ev) })
	return evs
}

// names are the events' names, deltas merged into one.
func names(evs []chat.Event) string {
	var out []string
	for _, ev := range evs {
		if ev.Name == api.ChatEventDelta && len(out) > 0 && out[len(out)-1] == api.ChatEventDelta {
			continue
		}
		out = append(out, ev.Name)
	}
	return strings.Join(out, " ")
}

func text(evs []chat.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		if d, ok := ev.Data.(api.ChatDelta); ok {
			b.WriteString(d.Text)
		}
	}
	return b.String()
}

func find[T any](evs []chat.Event) []T {
	var out []T
	for _, ev := range evs {
		if v, ok := ev.Data.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func history(t *testing.T, st store.Store, tenant string) (map[string]any, bool) {
	t.Helper()
	key, _ := chat.Key("alice", "analyst", "c1")
	d, err := st.GetDocument(context.Background(), chat.DocumentKind, tenant, key)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(d.Value, &v); err != nil {
		t.Fatal(err)
	}
	return v, true
}

func turns(h map[string]any) []any {
	ts, _ := h["turns"].([]any)
	return ts
}

// TestToolRounds: text and tool calls streamed in pieces, over three model
// calls (one with two calls at once, their fragments interleaved, ids and
// names repeated in each), and the next turn sees the first.
func TestToolRounds(t *testing.T) {
	code := chattest.Args(map[string]string{"code": "open('/workspace/a.txt','w').write('hi')\nreturn 42"})
	srv := chattest.New(t,
		chattest.Reply{Text: "Let me write it.", ToolCalls: []chattest.ToolCall{{ID: "call_a", Name: "execute_code", Arguments: code}}},
		chattest.Reply{Interleave: true, RepeatIDs: true, Piece: 2, ToolCalls: []chattest.ToolCall{
			{ID: "call_b", Name: "read_file", Arguments: `{"path":"a.txt"}`},
			{ID: "call_c", Name: "execute_code", Arguments: `{"code":"return 1"}`},
		}},
		chattest.Reply{Text: "The file says hi; the result is 42."},
		chattest.Reply{Text: "You asked me to write a file."},
	)
	st := openStore(t)
	c := newChat(t, srv, st)
	tools := &fakeTools{}
	evs := run(context.Background(), c, request("Write hi to a.txt"), tools)

	if got, want := names(evs), "delta tool_call tool_result tool_call tool_result tool_call tool_result delta message done"; got != want {
		t.Fatalf("events %q, want %q", got, want)
	}
	if got := text(evs); got != "Let me write it.The file says hi; the result is 42." {
		t.Errorf("deltas %q", got)
	}
	calls := find[api.ChatToolCall](evs)
	if calls[0] != (api.ChatToolCall{ID: "call_a", Name: "execute_code", Arguments: code}) ||
		calls[1] != (api.ChatToolCall{ID: "call_b", Name: "read_file", Arguments: `{"path":"a.txt"}`}) ||
		calls[2] != (api.ChatToolCall{ID: "call_c", Name: "execute_code", Arguments: `{"code":"return 1"}`}) {
		t.Errorf("tool calls %+v", calls)
	}
	if got := tools.called(); len(got) != 3 || got[0] != "execute_code "+code || got[1] != `read_file {"path":"a.txt"}` {
		t.Errorf("tools ran %q", got)
	}
	res := find[api.ChatToolResult](evs)
	if res[1] != (api.ChatToolResult{ID: "call_b", Name: "read_file", Content: "ran read_file"}) {
		t.Errorf("tool results %+v", res)
	}
	if m := find[api.ChatMessage](evs); len(m) != 1 || m[0] != (api.ChatMessage{Role: "assistant", Content: "The file says hi; the result is 42."}) {
		t.Errorf("message %+v", m)
	}
	done := find[api.ChatDone](evs)[0]
	if done.Steps != 3 || done.SessionID != "sb-session-alice-analyst" || done.ConversationID != "c1" || done.Usage == nil || done.Usage.TotalTokens != 45 {
		t.Errorf("done %+v (usage %+v)", done, done.Usage)
	}

	reqs := srv.Requests()
	r0 := reqs[0]
	if r0.Header.Get("Authorization") != "Bearer sk-test-key" || r0.Body.Model != "test-model" || !r0.Body.Stream ||
		len(r0.Body.Tools) != 2 || r0.Body.Tools[0].Function.Name != "execute_code" || r0.Body.StreamOptions == nil {
		t.Errorf("first request: %s", r0.Raw)
	}
	if m := r0.Body.Messages; len(m) != 2 || m[0].Role != "system" || m[1].Role != "user" || r0.Text(1) != "Write hi to a.txt" {
		t.Errorf("first request's messages: %s", r0.Raw)
	}
	// The third call has the calls and their results, each answering its id.
	m := reqs[2].Body.Messages
	if len(m) != 7 || m[2].Role != "assistant" || len(m[2].ToolCalls) != 1 || m[2].ToolCalls[0].Function.Arguments != code ||
		m[3].Role != "tool" || m[3].ToolCallID != "call_a" || m[4].Role != "assistant" || len(m[4].ToolCalls) != 2 ||
		m[5].ToolCallID != "call_b" || m[6].ToolCallID != "call_c" || reqs[2].Text(5) != "ran read_file" {
		t.Errorf("third request's messages: %s", reqs[2].Raw)
	}

	h, ok := history(t, st, "t1")
	if !ok || len(turns(h)) != 1 {
		t.Fatalf("history: %v", h)
	}
	// The next turn carries the first one whole.
	evs = run(context.Background(), c, request("What did you do?"), tools)
	if names(evs) != "delta message done" {
		t.Errorf("second turn: %q", names(evs))
	}
	r3 := srv.Requests()[3]
	if m := r3.Body.Messages; len(m) != 9 || r3.Text(1) != "Write hi to a.txt" || r3.Text(7) != "The file says hi; the result is 42." || r3.Text(8) != "What did you do?" {
		t.Errorf("second turn's request: %s", r3.Raw)
	}
	// Another tenant's conversation of the same ids is another one.
	other := request("Hello")
	other.Tenant = "t2"
	srv.Add(chattest.Reply{Text: "Hi."})
	run(context.Background(), c, other, tools)
	if r := srv.Requests()[4]; len(r.Body.Messages) != 2 || r.Contains("Write hi") {
		t.Errorf("tenant t2 saw tenant t1's conversation: %s", r.Raw)
	}
}

// TestMalformedToolCalls: calls the model got wrong are error results it
// sees, and the loop goes on.
func TestMalformedToolCalls(t *testing.T) {
	srv := chattest.New(t,
		chattest.Reply{ToolCalls: []chattest.ToolCall{
			{ID: "c1", Name: "execute_code", Arguments: `{"code": "print(1)`},
			{ID: "c2", Name: "rm_rf", Arguments: `{}`},
			{ID: "c3", Name: "read_file", Arguments: `[1, 2]`},
			{Name: "read_file", Arguments: ``}, // no id, no arguments
		}},
		chattest.Reply{Text: "Sorry."},
	)
	st := openStore(t)
	tools := &fakeTools{}
	evs := run(context.Background(), newChat(t, srv, st), request("go"), tools)
	if got := names(evs); got != "tool_call tool_result tool_call tool_result tool_call tool_result tool_call tool_result delta message done" {
		t.Fatalf("events %q", got)
	}
	res := find[api.ChatToolResult](evs)
	for i, want := range []string{"not a JSON object", `no tool "rm_rf"`, "not a JSON object"} {
		if !res[i].IsError || !strings.Contains(res[i].Content, want) {
			t.Errorf("result %d: %+v, want an error saying %q", i, res[i], want)
		}
	}
	if !strings.Contains(res[0].Content, `{"code": "print(1)`) || !strings.Contains(res[1].Content, "execute_code, read_file") {
		t.Errorf("error results do not quote what was wrong: %+v", res[:2])
	}
	// A call without arguments is a call with {}, and one without an id
	// gets one.
	if res[3].IsError || res[3].ID == "" || find[api.ChatToolCall](evs)[3].ID != res[3].ID {
		t.Errorf("call without id or arguments: %+v", res[3])
	}
	if got := tools.called(); len(got) != 1 || got[0] != "read_file {}" {
		t.Errorf("tools ran %q, want only the call without arguments", got)
	}
	// The model is sent its bad arguments as {} (endpoints may refuse
	// them), with the results.
	m := srv.Requests()[1].Body.Messages
	if len(m) != 7 || m[2].ToolCalls[0].Function.Arguments != "{}" || m[2].ToolCalls[2].Function.Arguments != "[1, 2]" || m[3].ToolCallID != "c1" {
		t.Errorf("second request: %s", srv.Requests()[1].Raw)
	}
	if h, ok := history(t, st, "t1"); !ok || len(turns(h)) != 1 {
		t.Errorf("the turn was not kept: %v", h)
	}
}

// TestLLMErrors: an endpoint that fails ends the turn with llm_error and
// done, and the turn is not kept.
func TestLLMErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replies []chattest.Reply
		want    string
		notWant string
	}{
		// The endpoint's words are never relayed: they may name the
		// operator's hosts and accounts, or quote part of its key.
		{"500", []chattest.Reply{{Status: 500, Message: "the GPU caught fire at http://10.1.2.3:8000/internal"}}, "500 Internal Server Error (request req-1;", "GPU"},
		{"401", []chattest.Reply{{Status: 401, Message: "Incorrect API key provided: sk-te****-key"}}, "401 Unauthorized: it refused the server's API key", "sk-te"},
		{"cut", []chattest.Reply{{Text: "Hello there, I am", CutAfter: 3}}, "could not be reached, or its stream broke off (request req-1;", "127.0.0.1"},
		{"dropped", []chattest.Reply{{Drop: true}}, "could not be reached, or its stream broke off (request req-1;", "127.0.0.1"},
		{"ended", []chattest.Reply{{Text: "Hello there, I am", EndAfter: 3}}, "no finish_reason", ""},
		{"no finish", []chattest.Reply{{Text: "Hello", NoFinish: true}}, "no finish_reason", ""},
		{"stream error", []chattest.Reply{{Text: "Hello", StreamError: "overloaded on node gpu-7.internal"}}, "error in its stream (request req-1;", "gpu-7"},
		{"after a tool", []chattest.Reply{{ToolCalls: []chattest.ToolCall{{ID: "x", Name: "read_file", Arguments: `{"path":"a"}`}}}, {Status: 503, Message: "try later"}}, "503 Service Unavailable (request req-1;", "try later"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := chattest.New(t, tc.replies...)
			st := openStore(t)
			req := request("hi")
			req.RequestID = "req-1"
			evs := run(context.Background(), newChat(t, srv, st), req, &fakeTools{})
			if n := len(evs); n < 2 || evs[n-2].Name != api.ChatEventError || evs[n-1].Name != api.ChatEventDone {
				t.Fatalf("events %q, want error and done last", names(evs))
			}
			e := evs[len(evs)-2].Data.(api.ChatError)
			if e.Code != api.ChatErrLLM || !strings.Contains(e.Message, tc.want) || (tc.notWant != "" && strings.Contains(e.Message, tc.notWant)) {
				t.Errorf("error %+v, want %s saying %q", e, api.ChatErrLLM, tc.want)
			}
			if len(find[api.ChatMessage](evs)) != 0 {
				t.Errorf("a message after an error: %q", names(evs))
			}
			if h, ok := history(t, st, "t1"); ok {
				t.Errorf("a failed turn was kept: %v", h)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		srv := chattest.New(t)
		srv.Close()
		evs := run(context.Background(), newChat(t, srv, openStore(t)), request("hi"), &fakeTools{})
		if got := names(evs); got != "error done" || !strings.Contains(evs[0].Data.(api.ChatError).Message, "could not be reached") {
			t.Errorf("events %q %+v", got, evs)
		}
	})
}

// TestStepLimit: a model that never stops calling tools is stopped, and
// the steps that ran are kept.
func TestStepLimit(t *testing.T) {
	call := func(id string) chattest.Reply {
		return chattest.Reply{Text: "Again.", ToolCalls: []chattest.ToolCall{{ID: id, Name: "execute_code", Arguments: `{"code":"1"}`}}}
	}
	srv := chattest.New(t, call("s1"), call("s2"), call("s3"))
	st := openStore(t)
	tools := &fakeTools{}
	evs := run(context.Background(), newChat(t, srv, st, func(c *chat.Config) { c.MaxSteps = 3 }), request("loop"), tools)
	if got := names(evs); got != "delta tool_call tool_result delta tool_call tool_result delta error done" {
		t.Fatalf("events %q", got)
	}
	if e := find[api.ChatError](evs)[0]; e.Code != api.ChatErrStepLimit || !strings.Contains(e.Message, "3 steps") {
		t.Errorf("error %+v", e)
	}
	if d := find[api.ChatDone](evs)[0]; d.Steps != 3 || len(tools.called()) != 2 {
		t.Errorf("done %+v after %d tool runs, want 3 steps and 2 runs", d, len(tools.called()))
	}
	h, ok := history(t, st, "t1")
	if !ok || len(turns(h)) != 1 {
		t.Fatalf("history %v", h)
	}
	msgs := turns(h)[0].(map[string]any)["messages"].([]any)
	// user, (assistant with a call, its result) twice, the last text.
	if len(msgs) != 6 || msgs[5].(map[string]any)["tool_calls"] != nil {
		t.Errorf("kept messages %v", msgs)
	}
}

// TestToolCannotRun: a tool that cannot be run at all ends the turn.
func TestToolCannotRun(t *testing.T) {
	srv := chattest.New(t, chattest.Reply{ToolCalls: []chattest.ToolCall{{ID: "x", Name: "execute_code", Arguments: `{"code":"1"}`}}})
	st := openStore(t)
	tools := &fakeTools{run: func(context.Context, string, json.RawMessage) (string, bool, error) {
		return "", false, fmt.Errorf("no sandbox can be had now: %w", errdefs.ErrUnavailable)
	}}
	evs := run(context.Background(), newChat(t, srv, st), request("go"), tools)
	if got := names(evs); got != "tool_call error done" {
		t.Fatalf("events %q", got)
	}
	if e := find[api.ChatError](evs)[0]; e.Code != api.ChatErrTool || !strings.Contains(e.Message, "no sandbox can be had now") {
		t.Errorf("error %+v", e)
	}
	if _, ok := history(t, st, "t1"); ok {
		t.Error("the turn was kept")
	}
}

// TestCancel: the client's leaving cancels the model's stream and a
// running tool; nothing is kept.
func TestCancel(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		srv := chattest.New(t, chattest.Reply{Text: "I am thinking about it", Hang: true})
		st := openStore(t)
		c := newChat(t, srv, st)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var evs []chat.Event
		c.Run(ctx, request("hi"), &fakeTools{}, func(ev chat.Event) {
			evs = append(evs, ev)
			if ev.Name == api.ChatEventDelta {
				cancel() // the client is gone after the first piece
			}
		})
		<-srv.Left() // the endpoint saw its request go
		if got := names(evs); got != "delta done" {
			t.Errorf("events %q", got)
		}
		if _, ok := history(t, st, "t1"); ok {
			t.Error("a cancelled turn was kept")
		}
	})
	t.Run("tool", func(t *testing.T) {
		srv := chattest.New(t, chattest.Reply{ToolCalls: []chattest.ToolCall{{ID: "x", Name: "execute_code", Arguments: `{"code":"import time; time.sleep(600)"}`}}})
		st := openStore(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var toolErr error
		tools := &fakeTools{run: func(ctx context.Context, _ string, _ json.RawMessage) (string, bool, error) {
			cancel()
			<-ctx.Done()
			toolErr = ctx.Err()
			return "", false, ctx.Err()
		}}
		evs := run(ctx, newChat(t, srv, st), request("sleep"), tools)
		if got := names(evs); got != "tool_call done" || !errors.Is(toolErr, context.Canceled) {
			t.Errorf("events %q, tool's context %v", got, toolErr)
		}
		if _, ok := history(t, st, "t1"); ok {
			t.Error("a cancelled turn was kept")
		}
	})
}

func keptTurns(t *testing.T, st store.Store) (summary string, users []string) {
	t.Helper()
	h, ok := history(t, st, "t1")
	if !ok {
		t.Fatal("no history")
	}
	summary, _ = h["summary"].(string)
	for _, tr := range turns(h) {
		msgs := tr.(map[string]any)["messages"].([]any)
		users = append(users, msgs[0].(map[string]any)["content"].(string))
	}
	return summary, users
}

// TestHistoryBounds: turns past the last N, or past the token budget, are
// folded into a summary the model writes; the summary goes with the next
// turns; a failed summary drops them; tool results are kept cut.
func TestHistoryBounds(t *testing.T) {
	t.Run("turns", func(t *testing.T) {
		srv := chattest.New(t, chattest.Reply{Text: "one"}, chattest.Reply{Text: "two"}, chattest.Reply{Text: "three"},
			chattest.Reply{Text: "SUMMARY: the user counted to one."}, chattest.Reply{Text: "four"}, chattest.Reply{Text: "SUMMARY 2"})
		st := openStore(t)
		c := newChat(t, srv, st, func(c *chat.Config) { c.HistoryTurns = 2 })
		var evs []chat.Event
		for _, m := range []string{"say one", "say two", "say three"} {
			evs = run(context.Background(), c, request(m), &fakeTools{})
		}
		// The summary's tokens count, the third turn's.
		if d := find[api.ChatDone](evs)[0]; d.Usage.TotalTokens != 30 || names(evs) != "delta message done" {
			t.Errorf("third turn: %q, done %+v", names(evs), d.Usage)
		}
		reqs := srv.Requests()
		if len(reqs) != 4 || reqs[3].Body.Stream || !reqs[3].Contains("User: say one") || reqs[3].Contains("say two") {
			t.Fatalf("the summary's request: %d requests, last %s", len(reqs), reqs[len(reqs)-1].Raw)
		}
		summary, users := keptTurns(t, st)
		if summary != "SUMMARY: the user counted to one." || strings.Join(users, ",") != "say two,say three" {
			t.Errorf("kept %q and %q", summary, users)
		}
		run(context.Background(), c, request("say four"), &fakeTools{})
		r := srv.Requests()[4]
		if !strings.Contains(r.Text(0), "SUMMARY: the user counted to one.") || r.Contains("say one") || !r.Contains("say two") {
			t.Errorf("next turn's request: %s", r.Raw)
		}
		if r := srv.Requests()[5]; !r.Contains("SUMMARY: the user counted to one.") || !r.Contains("User: say two") {
			t.Errorf("the second summary is not made from the first: %s", r.Raw)
		}
	})
	t.Run("tokens", func(t *testing.T) {
		long := strings.Repeat("x", 400) // 100 tokens a message
		srv := chattest.New(t, chattest.Reply{Text: long}, chattest.Reply{Text: long}, chattest.Reply{Text: "S1"},
			chattest.Reply{Text: long}, chattest.Reply{Text: "S2"})
		st := openStore(t)
		c := newChat(t, srv, st, func(c *chat.Config) { c.HistoryTokens = 250 })
		for _, m := range []string{"a" + long, "b" + long, "c" + long} {
			run(context.Background(), c, request(m), &fakeTools{})
		}
		// Two turns of 200 tokens are over 250: only the last is kept.
		summary, users := keptTurns(t, st)
		if summary != "S2" || len(users) != 1 || users[0][0] != 'c' {
			t.Errorf("kept %q and %d turns", summary, len(users))
		}
	})
	t.Run("summary fails", func(t *testing.T) {
		srv := chattest.New(t, chattest.Reply{Text: "one"}, chattest.Reply{Text: "two"}, chattest.Reply{Status: 500, Message: "no"},
			chattest.Reply{Text: "three"}, chattest.Reply{Text: "S"})
		st := openStore(t)
		c := newChat(t, srv, st, func(c *chat.Config) { c.HistoryTurns = 1 })
		run(context.Background(), c, request("say one"), &fakeTools{})
		evs := run(context.Background(), c, request("say two"), &fakeTools{})
		if names(evs) != "delta message done" {
			t.Errorf("a failed summary shows: %q", names(evs))
		}
		_, users := keptTurns(t, st)
		if strings.Join(users, ",") != "say two" {
			t.Errorf("kept %q", users)
		}
		run(context.Background(), c, request("say three"), &fakeTools{})
		if r := srv.Requests()[3]; !strings.Contains(r.Text(0), "1 earlier turns of the conversation are forgotten") || r.Contains("say one") {
			t.Errorf("next request: %s", r.Raw)
		}
	})
	t.Run("tool results cut", func(t *testing.T) {
		big := strings.Repeat("0123456789", 1000)
		srv := chattest.New(t, chattest.Reply{ToolCalls: []chattest.ToolCall{{ID: "x", Name: "read_file", Arguments: `{"path":"big"}`}}},
			chattest.Reply{Text: "done"})
		st := openStore(t)
		tools := &fakeTools{run: func(context.Context, string, json.RawMessage) (string, bool, error) { return big, false, nil }}
		run(context.Background(), newChat(t, srv, st), request("read"), tools)
		if r := srv.Requests()[1]; r.Text(3) != big {
			t.Errorf("the model was not shown the whole result: %d bytes", len(r.Text(3)))
		}
		h, _ := history(t, st, "t1")
		kept := turns(h)[0].(map[string]any)["messages"].([]any)[2].(map[string]any)["content"].(string)
		if len(kept) > 4200 || !strings.HasPrefix(kept, big[:4096]) || !strings.Contains(kept, "more bytes not shown") {
			t.Errorf("kept %d bytes of the result: %q", len(kept), kept[len(kept)-40:])
		}
	})
}

// TestConcurrentTurns: two turns of one conversation at once are both
// kept.
func TestConcurrentTurns(t *testing.T) {
	srv := chattest.New(t, chattest.Reply{Text: "ok"}, chattest.Reply{Text: "ok"})
	st := openStore(t)
	c := newChat(t, srv, st)
	var wg sync.WaitGroup
	for _, m := range []string{"first", "second"} {
		wg.Go(func() { run(context.Background(), c, request(m), &fakeTools{}) })
	}
	wg.Wait()
	if _, users := keptTurns(t, st); len(users) != 2 || users[0] == users[1] {
		t.Errorf("kept %q", users)
	}
}

// TestKey: no two (user, agent, conversation) share a key, and a key fits
// the store.
func TestKey(t *testing.T) {
	a, _ := chat.Key("a/b", "c", "d")
	b, _ := chat.Key("a", "b/c", "d")
	c, _ := chat.Key("a", "b", "c/d")
	if a == b || b == c || a == c {
		t.Errorf("keys %q %q %q", a, b, c)
	}
	if _, err := chat.Key("u", "a", strings.Repeat("x", 600)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a key over the store's bound: %v", err)
	}
	if _, err := chat.Key("", "a", "c"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("no user: %v", err)
	}
}

// TestModels: a request may name only a model the operator offers; none
// is the default, which must be offered.
func TestModels(t *testing.T) {
	srv := chattest.New(t)
	c := newChat(t, srv, openStore(t), func(c *chat.Config) { c.Model, c.Models = "small", []string{"small", "medium"} })
	for name, want := range map[string]string{"": "small", "small": "small", "medium": "medium"} {
		if got, err := c.Model(name); err != nil || got != want {
			t.Errorf("Model(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := c.Model("gpt-huge"); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "small, medium") {
		t.Errorf("a model not offered: %v, want invalid argument naming the models", err)
	}
	// Only Model: it alone.
	if _, err := newChat(t, srv, openStore(t)).Model("other"); err == nil {
		t.Error("a model other than the only one was accepted")
	}
	if _, err := chat.New(chat.Config{BaseURL: srv.BaseURL(), Model: "large", Models: []string{"small"}}, openStore(t)); err == nil {
		t.Error("a default model that is not offered was accepted")
	}
	if len(srv.Requests()) != 0 {
		t.Errorf("the endpoint was called %d times", len(srv.Requests()))
	}
}

// meter is a chat.Meter that records what it is told and refuses once
// it has been told more than limit.
type meter struct {
	mu    sync.Mutex
	limit int64
	used  []int64
}

func (m *meter) Allow() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sum int64
	for _, n := range m.used {
		sum += n
	}
	if sum >= m.limit {
		return fmt.Errorf("the tenant's tokens are spent (%d of %d)", sum, m.limit)
	}
	return nil
}

func (m *meter) Use(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used = append(m.used, n)
}

func (m *meter) uses() []int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]int64(nil), m.used...)
}

// TestMeter: every model call of a turn is counted, as the endpoint
// reported it or, when it reported nothing, estimated from the bytes; a
// meter that refuses ends the turn before the next call.
func TestMeter(t *testing.T) {
	call := chattest.Reply{ToolCalls: []chattest.ToolCall{{ID: "x", Name: "read_file", Arguments: `{"path":"a"}`}}, Usage: 700}
	srv := chattest.New(t, call, chattest.Reply{Text: "done", NoUsage: true})
	m := &meter{limit: 1 << 40}
	req := request("hi")
	req.Meter = m
	evs := run(context.Background(), newChat(t, srv, openStore(t)), req, &fakeTools{})
	if got := names(evs); got != "tool_call tool_result delta message done" {
		t.Fatalf("events %q", got)
	}
	u := m.uses()
	// The second call sent at least the first's prompt (its system
	// prompt alone is over 400 bytes): an estimate of a hundred tokens
	// and more.
	if len(u) != 2 || u[0] != 700 || u[1] < 100 {
		t.Errorf("counted %v, want 700 as reported, then an estimate", u)
	}

	// A meter already full: the turn ends before any call.
	srv = chattest.New(t)
	req.Meter = &meter{limit: 0}
	evs = run(context.Background(), newChat(t, srv, openStore(t)), req, &fakeTools{})
	if got := names(evs); got != "error done" || find[api.ChatError](evs)[0].Code != api.ChatErrBudget {
		t.Errorf("events %q %+v", got, evs)
	}
	if len(srv.Requests()) != 0 {
		t.Error("the endpoint was called past the budget")
	}

	// One that fills during the turn: the next step is not taken.
	srv = chattest.New(t, call)
	req.Meter = &meter{limit: 500}
	evs = run(context.Background(), newChat(t, srv, openStore(t)), req, &fakeTools{})
	if got := names(evs); got != "tool_call tool_result error done" || find[api.ChatError](evs)[0].Code != api.ChatErrBudget {
		t.Errorf("events %q", got)
	}
	if len(srv.Requests()) != 1 {
		t.Errorf("%d calls, want 1", len(srv.Requests()))
	}
}
