package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/sbx-sandbox/sbx/api"
)

// ChatEvent is one event of a chat turn: Type names it
// (api.ChatEventDelta, ...), and the field of that type is set.
type ChatEvent struct {
	Type       string
	Delta      *api.ChatDelta
	ToolCall   *api.ChatToolCall
	ToolResult *api.ChatToolResult
	Message    *api.ChatMessage
	Error      *api.ChatError
	Done       *api.ChatDone
}

// ChatStream reads the events of a chat turn as the server sends them.
// Close it when done; closing it early cancels the turn on the server
// (the model's stream and a running tool).
type ChatStream struct {
	body   io.ReadCloser
	events *sseReader
	done   bool
}

// Chat sends a user's message to a conversation with an agent and
// returns the turn's events: the server runs the model with the tools in
// the session of the user's agent (POST /agents/{agent_id}/chat).
//
//	s, err := c.Chat(ctx, "analyst", api.ChatRequest{UserID: "alice", ConversationID: "c1", Message: "..."})
//	defer s.Close()
//	for {
//		ev, err := s.Next()
//		if err == io.EOF { break }
//		...
//	}
//
// A server without a model endpoint answers IsUnavailable.
func (c *Client) Chat(ctx context.Context, agentID string, req api.ChatRequest) (*ChatStream, error) {
	seg, err := segment("agent id", agentID)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hreq, err := c.request(ctx, http.MethodPost, api.Prefix+"/agents/"+seg+"/chat", nil, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	resp, err := c.do(hreq, http.StatusOK)
	if err != nil {
		return nil, err
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		resp.Body.Close()
		return nil, fmt.Errorf("chat: the server answered with %q, not an event stream", mt)
	}
	return &ChatStream{body: resp.Body, events: newSSEReader(resp.Body)}, nil
}

// Next returns the next event; io.EOF after done, the last event.
// A stream that ends before done is io.ErrUnexpectedEOF.
func (s *ChatStream) Next() (*ChatEvent, error) {
	if s.done {
		return nil, io.EOF
	}
	for {
		ev, err := s.events.next()
		if err == io.EOF {
			return nil, fmt.Errorf("chat: the stream ended before its done event: %w", io.ErrUnexpectedEOF)
		}
		if err != nil {
			return nil, fmt.Errorf("chat: reading the stream: %w", err)
		}
		out := &ChatEvent{Type: ev.name}
		var v any
		switch ev.name {
		case api.ChatEventDelta:
			out.Delta = new(api.ChatDelta)
			v = out.Delta
		case api.ChatEventToolCall:
			out.ToolCall = new(api.ChatToolCall)
			v = out.ToolCall
		case api.ChatEventToolResult:
			out.ToolResult = new(api.ChatToolResult)
			v = out.ToolResult
		case api.ChatEventMessage:
			out.Message = new(api.ChatMessage)
			v = out.Message
		case api.ChatEventError:
			out.Error = new(api.ChatError)
			v = out.Error
		case api.ChatEventDone:
			out.Done = new(api.ChatDone)
			v = out.Done
			s.done = true
		default:
			continue // for later versions of the API
		}
		if err := json.Unmarshal([]byte(ev.data), v); err != nil {
			return nil, fmt.Errorf("chat: event %s: %w", ev.name, err)
		}
		return out, nil
	}
}

// Close ends the stream.
func (s *ChatStream) Close() error { return s.body.Close() }

// ForgetConversation deletes a conversation's chat history and, if the
// user has the agent's session, the conversation's files there
// (DELETE /agents/{agent_id}/conversations/{conversation_id}).
func (c *Client) ForgetConversation(ctx context.Context, agentID, userID, conversationID string) error {
	seg, err := segment("conversation id", conversationID)
	if err != nil {
		return err
	}
	p, q, err := agentPath(agentID, userID, "/conversations/"+seg)
	if err != nil {
		return err
	}
	_, err = c.call(ctx, http.MethodDelete, p, q, nil, nil, http.StatusNoContent)
	return err
}
