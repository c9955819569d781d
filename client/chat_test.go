package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
)

func TestChatStream(t *testing.T) {
	body := ": keep-alive\n\n" +
		"event: delta\ndata: {\"text\":\"Hi\"}\n\n" +
		"event: tool_call\ndata: {\"id\":\"c1\",\"name\":\"read_file\",\"arguments\":\"{}\"}\n\n" +
		"event: later_event\ndata: {}\n\n" +
		"event: tool_result\ndata: {\"id\":\"c1\",\"name\":\"read_file\",\"content\":\"x\",\"is_error\":true}\n\n" +
		"event: message\ndata: {\"role\":\"assistant\",\"content\":\"Hi\"}\n\n" +
		"event: done\ndata: {\"session_id\":\"s\",\"conversation_id\":\"c\",\"steps\":2}\n\n"
	var cut atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/api/v1/agents/a1/chat" || r.Header.Get("Accept") != "text/event-stream" {
			t.Errorf("request %s %s", r.Method, r.URL)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		if cut.Load() {
			io.WriteString(w, body[:strings.Index(body, "event: done")])
			return
		}
		io.WriteString(w, body)
	}))
	defer srv.Close()
	c := New(srv.URL)
	s, err := c.Chat(context.Background(), "a1", api.ChatRequest{UserID: "u", ConversationID: "c", Message: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		ev, err := s.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.Type)
		switch {
		case ev.Type == api.ChatEventToolResult && (ev.ToolResult.ID != "c1" || !ev.ToolResult.IsError),
			ev.Type == api.ChatEventDone && ev.Done.Steps != 2,
			ev.Type == api.ChatEventDelta && ev.Delta.Text != "Hi":
			t.Errorf("event %+v", ev)
		}
	}
	s.Close()
	if strings.Join(got, " ") != "delta tool_call tool_result message done" {
		t.Errorf("events %q", got)
	}
	cut.Store(true)
	s, err = c.Chat(context.Background(), "a1", api.ChatRequest{UserID: "u", ConversationID: "c", Message: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for {
		_, err := s.Next()
		if err != nil {
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("a stream without done: %v", err)
			}
			break
		}
	}
}
