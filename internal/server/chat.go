package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/chat"
	"github.com/sbx-sandbox/sbx/internal/session"
)

// The chat loop's endpoint: POST /agents/{agent_id}/chat makes sure
// the user has the agent's session, then runs a turn of internal/chat
// with the five tools of tools.go, run through callTool in that session
// (the same path as POST /tools/{name}/invoke and MCP), and writes the
// turn's events as server-sent events as they come.

// maxChatBody bounds a chat request: a message and a system prompt.
const maxChatBody = 1 << 20

// errNoModel is the answer of a server started without a model endpoint.
var errNoModel = fmt.Errorf("this server has no model endpoint for the chat loop: start sbx serve with --llm-base-url and --llm-model (or SBX_LLM_BASE_URL and SBX_LLM_MODEL): %w", errdefs.ErrUnavailable)

// agentChat: POST /agents/{agent_id}/chat.
func (s *Server) agentChat(w http.ResponseWriter, r *http.Request) {
	if s.opt.Chat == nil {
		s.writeError(w, r, errNoModel)
		return
	}
	var req api.ChatRequest
	if err := decodeJSON(r, &req, maxChatBody, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := checkChat(req); err != nil {
		s.writeError(w, r, err)
		return
	}
	// The model, the tenant's tokens and its turns at once are checked
	// before anything is made or called: every call is paid with the
	// operator's key.
	model, err := s.opt.Chat.Model(req.Model)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	t := tenant(r)
	var tokens int64
	if s.opt.Limits != nil {
		tokens = s.opt.Limits(t).ChatTokens
	}
	if err := s.budgets.allow(t, tokens); err != nil {
		s.writeError(w, r, err)
		return
	}
	release, err := s.openStream(t, chatTurns)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	agentID := r.PathValue("agent_id")
	sid, err := agentSessionID(req.UserID, agentID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.ensureSession(r.Context(), sid, req.UserID, agentID, ""); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.streamChat(w, r, chat.Request{
		Tenant: t, UserID: req.UserID, AgentID: agentID, ConversationID: req.ConversationID, SessionID: sid,
		Message: req.Message, System: req.System, Model: model,
		RequestID: requestID(r.Context()), Meter: s.chatMeter(t, tokens),
	}, &chatTools{s: s, base: api.ToolInvokeRequest{UserID: req.UserID, AgentID: agentID, ConversationID: req.ConversationID}})
}

func checkChat(req api.ChatRequest) error {
	switch {
	case req.UserID == "":
		return fmt.Errorf("user_id is required: %w", errdefs.ErrInvalidArgument)
	case req.ConversationID == "":
		return fmt.Errorf("conversation_id is required: the history is kept per conversation: %w", errdefs.ErrInvalidArgument)
	case !session.ValidID(req.ConversationID):
		return fmt.Errorf("conversation_id %q is not a valid id: %w", req.ConversationID, errdefs.ErrInvalidArgument)
	case strings.TrimSpace(req.Message) == "":
		return fmt.Errorf("message is required: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// streamChat runs a turn and writes its events. The turn runs in a
// goroutine of its own, which this one waits for; a client that leaves
// (or a write that fails) cancels it.
func (s *Server) streamChat(w http.ResponseWriter, r *http.Request, req chat.Request, tools chat.Tools) {
	rc := beginStream(w, "text/event-stream")

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	events := make(chan chat.Event)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.opt.Chat.Run(ctx, req, tools, func(ev chat.Event) {
			select {
			case events <- ev:
			case <-ctx.Done():
			}
		})
	}()
	beat := time.NewTicker(sseHeartbeat)
	defer beat.Stop()
	write := func(format string, args ...any) {
		if ctx.Err() != nil {
			return
		}
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			cancel()
			return
		}
		rc.Flush()
	}
	for {
		select {
		case ev := <-events:
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false) // code and text, not HTML: "<" stays "<"
			enc.Encode(ev.Data)
			write("event: %s\ndata: %s\n\n", ev.Name, bytes.TrimSuffix(b.Bytes(), []byte("\n")))
		case <-beat.C:
			// Quiet while a tool or the model works: proxies must not
			// take the stream for dead.
			write(": keep-alive\n\n")
		case <-done:
			return
		}
	}
}

// chatTools run the chat's tool calls as POST /tools/{name}/invoke does,
// for the request's user, agent and conversation.
type chatTools struct {
	s    *Server
	base api.ToolInvokeRequest
}

func (t *chatTools) List() []api.Tool { return tools }

func (t *chatTools) Call(ctx context.Context, name string, args json.RawMessage) (string, bool, error) {
	req := t.base
	req.Arguments = args
	res, err := t.s.callTool(ctx, name, req)
	switch {
	case err == nil:
		return res.Content, res.IsError, nil
	case ctx.Err() != nil:
		return "", false, ctx.Err()
	case errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrNotFound):
		// Arguments the tool does not take (a field it has not, code
		// too long): the model can do better.
		return "error: " + err.Error(), true, nil
	}
	if code, _ := status(err); code == http.StatusInternalServerError {
		id := requestID(ctx)
		t.s.log.Error("internal error in a chat's tool call", "request_id", id, "tool", name, "err", err)
		return "", false, fmt.Errorf("internal error (request %s; the server log has the details)", id)
	}
	return "", false, err
}

// agentDeleteConversation: DELETE /agents/{agent_id}/conversations/{cid}
// ?user_id= (R-33): the conversation's chat history goes, and its files in
// the agent's session if the user has one.
func (s *Server) agentDeleteConversation(w http.ResponseWriter, r *http.Request) {
	cid := r.PathValue("conversation_id")
	if !session.ValidID(cid) {
		s.writeError(w, r, fmt.Errorf("conversation_id %q is not a valid id: %w", cid, errdefs.ErrInvalidArgument))
		return
	}
	sid, err := agentSession(r, "")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	t, userID, agentID := tenant(r), requestUser(r, ""), r.PathValue("agent_id")
	if err := chat.Forget(r.Context(), s.opt.Store, t, userID, agentID, cid); err != nil {
		s.writeError(w, r, err)
		return
	}
	// No session: no files.
	if err := s.purgeConversation(r.Context(), t, sid, cid); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
