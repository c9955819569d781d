package server

import (
	"context"
	"fmt"
	"net/http"
	"path"
	"regexp"
	"strings"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Agent endpoints: the calls of an agent platform name an agent and
// a user, not a session. The session is sb-session-{user_id}-{agent_id}
// (api.AgentSessionID), made on the first execute or upload (concurrent
// first calls make one: Create is idempotent) and reused after; the rest
// is the session endpoints'.

// agentIDPattern keeps user and agent ids to what makes a valid session
// id together: no "/", no "..", nothing a path or a label would choke on.
var agentIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,55}$`)

// agentSession returns the session id of the request's agent and user
// (the user from userID, or the user_id query parameter).
func agentSession(r *http.Request, userID string) (string, error) {
	return agentSessionID(requestUser(r, userID), r.PathValue("agent_id"))
}

func requestUser(r *http.Request, userID string) string {
	if userID == "" {
		return r.URL.Query().Get("user_id")
	}
	return userID
}

// agentSessionID checks a user and an agent id and returns the session id
// of the pair.
func agentSessionID(userID, agentID string) (string, error) {
	for _, f := range []struct{ name, v string }{{"agent_id", agentID}, {"user_id", userID}} {
		if f.v == "" {
			return "", fmt.Errorf("%s is required: %w", f.name, errdefs.ErrInvalidArgument)
		}
		if !agentIDPattern.MatchString(f.v) || strings.Contains(f.v, "..") {
			return "", fmt.Errorf("%s %q: want 1-56 characters of [A-Za-z0-9._-], starting with a letter or digit, without \"..\": %w", f.name, f.v, errdefs.ErrInvalidArgument)
		}
	}
	sid := api.AgentSessionID(userID, agentID)
	if !session.ValidID(sid) {
		return "", fmt.Errorf("session id %q of user %q and agent %q is not a valid id: %w", sid, userID, agentID, errdefs.ErrInvalidArgument)
	}
	return sid, nil
}

// ensureAgentSession finds or creates the agent's session for the user.
func (s *Server) ensureAgentSession(r *http.Request, userID, templateID string) (string, error) {
	sid, err := agentSession(r, userID)
	if err != nil {
		return "", err
	}
	return sid, s.ensureSession(r.Context(), sid, requestUser(r, userID), r.PathValue("agent_id"), templateID)
}

// ensureSession finds or creates session sid of a user's agent in the
// tenant of ctx. A terminated or failed session is made anew (Create's
// rules).
func (s *Server) ensureSession(ctx context.Context, sid, userID, agentID, templateID string) error {
	_, _, err := s.opt.Sessions.Create(ctx, tenantOf(ctx), session.CreateRequest{
		ID: sid, Template: templateID,
		Metadata: map[string]string{"user_id": userID, "agent_id": agentID},
	})
	// The agents' bodies name the template template_id, as POST /sessions
	// does.
	return session.RenameField(err, restFields)
}

// agentExecute: POST /agents/{agent_id}/execute.
func (s *Server) agentExecute(w http.ResponseWriter, r *http.Request) {
	wait, err := queryBool(r.URL.Query().Get("wait"), "wait")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req api.AgentExecuteRequest
	if err := decodeJSON(r, &req, maxExecuteBody, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.UserID == "" {
		s.writeError(w, r, fmt.Errorf("user_id is required: %w", errdefs.ErrInvalidArgument))
		return
	}
	release, err := s.holdExecution(r, wait)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	sid, err := s.ensureAgentSession(r, req.UserID, req.TemplateID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.submit(w, r, sid, req.Execute(), wait)
}

// agentUpload: POST /agents/{agent_id}/files/upload?user_id= (R-30).
func (s *Server) agentUpload(w http.ResponseWriter, r *http.Request) {
	sid, err := s.ensureAgentSession(r, "", "")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	r.SetPathValue("session_id", sid)
	s.upload(w, r)
}

// agentListFiles: GET /agents/{agent_id}/files?user_id= (R-30). It does
// not create a session: a user with none has no files (404).
func (s *Server) agentListFiles(w http.ResponseWriter, r *http.Request) {
	sid, err := agentSession(r, "")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	r.SetPathValue("session_id", sid)
	s.listFiles(w, r)
}

// agentDownload: GET /agents/{agent_id}/files/{path}?user_id=&conversation_id=
// . With conversation_id the path is in that conversation's temp
// area.
func (s *Server) agentDownload(w http.ResponseWriter, r *http.Request) {
	sid, err := agentSession(r, "")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	r.SetPathValue("session_id", sid)
	if cid := r.URL.Query().Get("conversation_id"); cid != "" {
		if !session.ValidID(cid) {
			s.writeError(w, r, fmt.Errorf("conversation_id %q is not a valid id: %w", cid, errdefs.ErrInvalidArgument))
			return
		}
		rel, err := workspace.CleanPath(r.PathValue("path"))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		r.SetPathValue("path", path.Join(workspace.ConversationDir(cid), rel))
	}
	s.download(w, r)
}
