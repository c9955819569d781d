package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
)

// Errors of EnsureSession, for errors.Is: the create call failed, or
// the session did not become running in time.
var (
	ErrCreateFailed = errors.New("sbx: session create failed")
	ErrNotReady     = errors.New("sbx: session not ready in time")
)

// EnsureOptions tune EnsureSession. The zero value is the defaults.
type EnsureOptions struct {
	// Tries and Interval bound the wait for the session to be running
	// (default 30 tries, 500 ms apart).
	Tries    int
	Interval time.Duration
	// Create is the request used when the session must be created; its
	// SessionID is set by EnsureSession, and user_id and agent_id are
	// added to its metadata.
	Create api.CreateSessionRequest
}

// EnsureSession returns the id of the session of a user's agent,
// sb-session-{user_id}-{agent_id}, ready for calls: it gets the
// session and reuses it if it is running, paused or hibernated (a call
// resumes those); creates it if there is none or it was terminated;
// recreates it if it is in error; and polls while it is pending. A failed
// create is ErrCreateFailed, a session still not running after the polls
// ErrNotReady; both wrap the cause.
func (c *Client) EnsureSession(ctx context.Context, userID, agentID string, opt *EnsureOptions) (string, error) {
	var o EnsureOptions
	if opt != nil {
		o = *opt
	}
	if o.Tries <= 0 {
		o.Tries = 30
	}
	if o.Interval <= 0 {
		o.Interval = 500 * time.Millisecond
	}
	if userID == "" || agentID == "" {
		return "", fmt.Errorf("sbx: user id and agent id are required: %w", ErrCreateFailed)
	}
	id := api.AgentSessionID(userID, agentID)
	create := func() (*api.Session, error) {
		req := o.Create
		req.SessionID = id
		meta := map[string]string{}
		for k, v := range req.Metadata {
			meta[k] = v
		}
		meta["user_id"], meta["agent_id"] = userID, agentID
		req.Metadata = meta
		s, _, err := c.CreateSession(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("%w: session %s: %w", ErrCreateFailed, id, err)
		}
		return s, nil
	}
	s, err := c.GetSession(ctx, id)
	switch {
	case IsNotFound(err):
		if s, err = create(); err != nil {
			return "", err
		}
	case err != nil:
		return "", err
	case s.Status == api.StatusTerminated || s.Status == api.StatusError:
		// Create makes a terminated id anew and recovers one in error.
		if s, err = create(); err != nil {
			return "", err
		}
	}
	for try := 1; ; try++ {
		switch s.Status {
		case api.StatusRunning, api.StatusPaused, api.StatusHibernated:
			return id, nil
		case api.StatusError, api.StatusTerminated:
			return "", fmt.Errorf("%w: session %s is %s: %s", ErrCreateFailed, id, s.Status, s.Error)
		}
		if try >= o.Tries {
			return "", fmt.Errorf("%w: session %s still %s after %d tries %v apart", ErrNotReady, id, s.Status, o.Tries, o.Interval)
		}
		t := time.NewTimer(o.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", fmt.Errorf("%w: %w", ErrNotReady, ctx.Err())
		case <-t.C:
		}
		if s, err = c.GetSession(ctx, id); err != nil {
			return "", err
		}
	}
}

// AgentExecute runs code in the session of a user's agent, which the
// server creates on first use, and waits for the result.
func (c *Client) AgentExecute(ctx context.Context, agentID string, req api.AgentExecuteRequest) (*api.Execution, error) {
	seg, err := segment("agent id", agentID)
	if err != nil {
		return nil, err
	}
	var out api.Execution
	if _, err := c.call(ctx, http.MethodPost, api.Prefix+"/agents/"+seg+"/execute", url.Values{"wait": {"true"}}, req, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// agentPath is /agents/{agent_id}REST, and the query naming the user.
func agentPath(agentID, userID, rest string) (string, url.Values, error) {
	seg, err := segment("agent id", agentID)
	if err != nil {
		return "", nil, err
	}
	if userID == "" {
		return "", nil, fmt.Errorf("user id is required: %w", errdefs.ErrInvalidArgument)
	}
	return api.Prefix + "/agents/" + seg + rest, url.Values{"user_id": {userID}}, nil
}

// AgentUpload uploads files into the session of a user's agent, which the
// server creates on first use; with opts.ConversationID they go to
// that conversation's temp area.
func (c *Client) AgentUpload(ctx context.Context, agentID, userID string, opts UploadOptions, files ...UploadFile) (*api.UploadResponse, error) {
	p, q, err := agentPath(agentID, userID, "/files/upload")
	if err != nil {
		return nil, err
	}
	return c.upload(ctx, p, q, opts, files)
}

// AgentListFiles lists the workspace of a user's agent, or one
// conversation's uploads. A user whose session does not exist yet
// is errdefs.ErrNotFound.
func (c *Client) AgentListFiles(ctx context.Context, agentID, userID string, opts ListFilesOptions) (*api.FileList, error) {
	p, q, err := agentPath(agentID, userID, "/files")
	if err != nil {
		return nil, err
	}
	return c.listFiles(ctx, p, q, opts)
}

// AgentOpenFile opens length bytes from offset (length 0: to the end) of a
// file of a user's agent's workspace, or, with conversationID, of that
// conversation's temp area. Close the reader when done.
func (c *Client) AgentOpenFile(ctx context.Context, agentID, userID, conversationID, file string, offset, length int64) (io.ReadCloser, error) {
	if offset < 0 || length < 0 {
		return nil, fmt.Errorf("open %s: negative offset or length: %w", file, errdefs.ErrInvalidArgument)
	}
	fp, err := filePath(file)
	if err != nil {
		return nil, err
	}
	p, q, err := agentPath(agentID, userID, "/files/"+fp)
	if err != nil {
		return nil, err
	}
	set(q, "conversation_id", conversationID)
	return c.openFile(ctx, p, q, file, offset, length)
}

// Tools lists the tools for LLM function calling, in the OpenAI
// function-calling shape.
func (c *Client) Tools(ctx context.Context) ([]api.Tool, error) {
	var out api.ToolList
	if _, err := c.call(ctx, http.MethodGet, api.Prefix+"/tools", nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Tools, nil
}

// InvokeTool runs a tool call of a model in the session of req's user and
// agent. A call that ran and failed is a result with IsError, not an
// error.
func (c *Client) InvokeTool(ctx context.Context, name string, req api.ToolInvokeRequest) (*api.ToolResult, error) {
	seg, err := segment("tool name", name)
	if err != nil {
		return nil, err
	}
	var out api.ToolResult
	if _, err := c.call(ctx, http.MethodPost, api.Prefix+"/tools/"+seg+"/invoke", nil, req, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}
