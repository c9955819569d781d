package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/execution"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/files"
	"github.com/sbx-sandbox/sbx/internal/mcp"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Tools for LLM function calling. GET /tools lists them as JSON
// Schema in the OpenAI function-calling shape; POST /tools/{name}/invoke
// runs one with the arguments a model gave, in the session of the user's
// agent (made on first use, as the agent endpoints do), and answers with
// text for the model and the structured result. A tool that ran and
// failed (an exception, a missing file) is a 200 with is_error, which the
// model should see; a request that is wrong (no user, unknown tool,
// arguments that break the schema) is a 4xx.

// cancelWait bounds how long a tool call whose caller left waits for its
// execution to be cancelled.
const cancelWait = 10 * time.Second

// toolReadMax bounds one read_file call: a model reads a large file a
// part at a time.
const (
	toolReadDefault = 64 << 10
	toolReadMax     = 1 << 20
)

// pathDoc describes the paths the file tools take: the ones the model
// sees in its own code as well as relative ones.
const pathDoc = "The file: relative to /workspace (data/input.csv), or absolute under /workspace or /home/user (the same directory)."

var tools = []api.Tool{
	tool("execute_code", "Run Python code in the user's sandbox. Files in /workspace persist between calls; "+
		"the value of a top-level `return` comes back as the result. Returns stdout, stderr, the result or the error.", `{
		"type": "object", "additionalProperties": false, "required": ["code"],
		"properties": {
			"code": {"type": "string", "description": "Python source. A top-level return gives the result."},
			"timeout": {"type": "number", "minimum": 0, "maximum": 86400, "description": "Seconds before the run is killed (default 30)."}
		}}`),
	tool("run_bash", "Run a bash command in the user's sandbox (working directory /workspace). Returns stdout, stderr and the exit code.", `{
		"type": "object", "additionalProperties": false, "required": ["command"],
		"properties": {
			"command": {"type": "string", "description": "The command line."},
			"timeout": {"type": "number", "minimum": 0, "maximum": 86400, "description": "Seconds before it is killed (default 30)."}
		}}`),
	tool("upload_file", "Write a file into the user's workspace (/workspace/PATH), replacing any file there.", `{
		"type": "object", "additionalProperties": false, "required": ["path", "content"],
		"properties": {
			"path": {"type": "string", "description": "`+pathDoc+`"},
			"content": {"type": "string", "description": "The file's content: text, or base64 with encoding base64."},
			"encoding": {"type": "string", "enum": ["utf-8", "base64"], "description": "How content is encoded (default utf-8)."}
		}}`),
	tool("list_files", "List the files of the user's workspace, or of a directory in it.", `{
		"type": "object", "additionalProperties": false,
		"properties": {
			"path": {"type": "string", "description": "The directory (default /workspace): relative to /workspace, or absolute under /workspace or /home/user."},
			"recursive": {"type": "boolean", "description": "List the whole tree (default false)."}
		}}`),
	tool("read_file", "Read part of a file of the user's workspace: length bytes from offset. "+
		"Read a large file a part at a time; next_offset says where the next part starts, and eof when there is none.", `{
		"type": "object", "additionalProperties": false, "required": ["path"],
		"properties": {
			"path": {"type": "string", "description": "`+pathDoc+`"},
			"offset": {"type": "integer", "minimum": 0, "description": "Byte offset to start at (default 0)."},
			"length": {"type": "integer", "minimum": 1, "maximum": 1048576, "description": "Bytes to read (default 65536)."}
		}}`),
}

func tool(name, desc, schema string) api.Tool {
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(schema)); err != nil {
		panic("tool " + name + ": " + err.Error())
	}
	return api.Tool{Type: "function", Function: api.ToolFunction{Name: name, Description: desc, Parameters: compact.Bytes()}}
}

// listTools: GET /tools.
func (s *Server) listTools(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.ToolList{Tools: tools})
}

// invokeTool: POST /tools/{name}/invoke.
func (s *Server) invokeTool(w http.ResponseWriter, r *http.Request) {
	var req api.ToolInvokeRequest
	if err := decodeJSON(r, &req, maxExecuteBody, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.callTool(r.Context(), r.PathValue("name"), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// serveMCP: /mcp?user_id=&agent_id=[&conversation_id=], the same tools over
// MCP's streamable HTTP transport. An MCP client names no user in a
// tool call, so the URL says whose sandbox the tools work in.
func (s *Server) serveMCP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	base := api.ToolInvokeRequest{UserID: q.Get("user_id"), AgentID: q.Get("agent_id"), ConversationID: q.Get("conversation_id")}
	if _, err := agentSessionID(base.UserID, base.AgentID); err != nil {
		s.writeError(w, r, fmt.Errorf("/mcp?user_id=&agent_id= name whose sandbox the tools use: %w", err))
		return
	}
	if base.ConversationID != "" && !session.ValidID(base.ConversationID) {
		s.writeError(w, r, fmt.Errorf("conversation_id %q is not a valid id: %w", base.ConversationID, errdefs.ErrInvalidArgument))
		return
	}
	t := tenant(r)
	srv := mcp.NewServer(tools, func(ctx context.Context, name string, args json.RawMessage) (*api.ToolResult, error) {
		req := base
		req.Arguments = args
		return s.callTool(context.WithValue(ctx, tenantKey{}, t), name, req)
	}, s.opt.Version)
	mcp.Handler(srv).ServeHTTP(w, r)
}

// toolCall runs a tool, its arguments checked, in session sid.
type toolCall func(ctx context.Context, sid string) (*api.ToolResult, error)

// callTool runs tool name for req's user and agent in the tenant of ctx:
// the tool endpoint and the MCP server (/mcp, sbx mcp) both come here.
// Arguments are checked before the session is made, so a call that is
// refused leaves nothing behind.
func (s *Server) callTool(ctx context.Context, name string, req api.ToolInvokeRequest) (*api.ToolResult, error) {
	if req.ConversationID != "" && !session.ValidID(req.ConversationID) {
		return nil, fmt.Errorf("conversation_id %q is not a valid id: %w", req.ConversationID, errdefs.ErrInvalidArgument)
	}
	if len(req.Arguments) == 0 || string(req.Arguments) == "null" {
		req.Arguments = json.RawMessage("{}")
	}
	var call toolCall
	var err error
	switch name {
	case "execute_code", "run_bash":
		call, err = s.toolRun(name, req.ConversationID, req.Arguments)
	case "upload_file":
		call, err = s.toolUpload(req.Arguments)
	case "list_files":
		call, err = s.toolList(req.ConversationID, req.Arguments)
	case "read_file":
		call, err = s.toolRead(req.ConversationID, req.Arguments)
	default:
		return nil, fmt.Errorf("no tool %q (see GET /api/v1/tools): %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	sid, err := agentSessionID(req.UserID, req.AgentID)
	if err != nil {
		return nil, err
	}
	if err := s.ensureSession(ctx, sid, req.UserID, req.AgentID, ""); err != nil {
		return nil, err
	}
	res, err := call(ctx, sid)
	if err != nil {
		return nil, err
	}
	res.SessionID = sid
	return res, nil
}

// arguments decodes a tool's arguments strictly: a model that invents a
// field should hear so.
func arguments(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("arguments: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

func toolError(err error) (*api.ToolResult, error) {
	// What the model can act on comes back to it (a file over the
	// session's limits too: it can write less); the rest is the request's
	// failure.
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalidArgument) ||
		errors.Is(err, errdefs.ErrFailedPrecondition) || errors.Is(err, errdefs.ErrResourceExhausted) {
		return &api.ToolResult{Content: "error: " + err.Error(), IsError: true}, nil
	}
	return nil, err
}

func (s *Server) toolRun(name, conversationID string, raw json.RawMessage) (toolCall, error) {
	var args struct {
		Code    string  `json:"code"`
		Command string  `json:"command"`
		Timeout float64 `json:"timeout"`
	}
	if err := arguments(raw, &args); err != nil {
		return nil, err
	}
	x := api.ExecuteRequest{Code: args.Code, Timeout: args.Timeout, ConversationID: conversationID, Language: "python"}
	if name == "run_bash" {
		if args.Code != "" {
			return nil, fmt.Errorf("arguments: run_bash takes command, not code: %w", errdefs.ErrInvalidArgument)
		}
		x.Code, x.Language = args.Command, "bash"
	} else if args.Command != "" {
		return nil, fmt.Errorf("arguments: execute_code takes code, not command: %w", errdefs.ErrInvalidArgument)
	}
	if err := execution.Check(x); err != nil {
		return nil, err
	}
	return func(ctx context.Context, sid string) (*api.ToolResult, error) {
		run, err := s.opt.Executions.Submit(ctx, tenantOf(ctx), sid, x)
		if err != nil {
			return nil, err
		}
		select {
		case <-run.Done():
		case <-ctx.Done():
			// Whoever called the tool is gone (a chat's client left, an
			// MCP call was cancelled): no one will read the result, so
			// the run stops, and its record says cancelled.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelWait)
			defer cancel()
			if _, err := s.opt.Executions.Cancel(cctx, tenantOf(ctx), run.ID()); err != nil {
				s.log.Warn("cancelling the execution of a tool call whose caller left", "execution_id", run.ID(), "err", err)
			}
			return nil, ctx.Err()
		}
		return runResult(name, run.Result())
	}, nil
}

// runResult is what execute_code and run_bash tell the model.
func runResult(name string, res *api.Execution) (*api.ToolResult, error) {
	if unavailable(res) {
		return nil, fmt.Errorf("%s (execution %s): %w", res.Error.Message, res.ExecutionID, errdefs.ErrUnavailable)
	}
	var b strings.Builder
	if res.Stdout != "" {
		fmt.Fprintf(&b, "stdout:\n%s\n", strings.TrimRight(res.Stdout, "\n"))
	}
	if res.Stderr != "" {
		fmt.Fprintf(&b, "stderr:\n%s\n", strings.TrimRight(res.Stderr, "\n"))
	}
	if len(res.ReturnValue) > 0 && string(res.ReturnValue) != "null" {
		fmt.Fprintf(&b, "result: %s\n", res.ReturnValue)
	}
	// A command's non-zero exit is its exit code, said below.
	if res.Error != nil && !(name == "run_bash" && res.Error.Type == wire.ErrTypeNonZeroExit) {
		fmt.Fprintf(&b, "error: %s: %s\n", res.Error.Type, res.Error.Message)
		if res.Error.Traceback != "" {
			b.WriteString(res.Error.Traceback + "\n")
		}
	}
	if res.ExitCode != nil && name == "run_bash" {
		fmt.Fprintf(&b, "exit code: %d\n", *res.ExitCode)
	}
	if len(res.Artifacts) > 0 {
		fmt.Fprintf(&b, "files written: %s\n", strings.Join(res.Artifacts, ", "))
	}
	if b.Len() == 0 {
		b.WriteString("(no output)\n")
	}
	data, _ := json.Marshal(res)
	return &api.ToolResult{Content: b.String(), IsError: res.Status != api.ExecCompleted, Data: data}, nil
}

func (s *Server) toolUpload(raw json.RawMessage) (toolCall, error) {
	var args struct {
		Path     string `json:"path"`
		Content  string `json:"content"`
		Encoding string `json:"encoding"`
	}
	if err := arguments(raw, &args); err != nil {
		return nil, err
	}
	content := []byte(args.Content)
	switch args.Encoding {
	case "", "utf-8":
	case "base64":
		var err error
		if content, err = base64.StdEncoding.DecodeString(args.Content); err != nil {
			return nil, fmt.Errorf("arguments: content is not base64: %v: %w", err, errdefs.ErrInvalidArgument)
		}
	default:
		return nil, fmt.Errorf("arguments: encoding %q: want utf-8 or base64: %w", args.Encoding, errdefs.ErrInvalidArgument)
	}
	return func(ctx context.Context, sid string) (*api.ToolResult, error) {
		rel, err := workspace.SandboxPath(args.Path)
		if err != nil {
			return toolError(err)
		}
		ws, err := s.opt.Files.Open(ctx, tenantOf(ctx), sid)
		if err != nil {
			return nil, err
		}
		defer ws.Close()
		saved, err := ws.Write(ctx, files.FileWrite{Path: rel, Body: bytes.NewReader(content)})
		if err != nil {
			return toolError(err)
		}
		data, _ := json.Marshal(saved)
		return &api.ToolResult{Content: fmt.Sprintf("wrote %d bytes to /workspace/%s", saved.Size, saved.Path), Data: data}, nil
	}, nil
}

// toolPath maps a file tool's path to the workspace: what the model sees
// in its own code (/workspace/x, /home/user/x) or a relative path. In a
// conversation, /workspace/uploads/temparea is that conversation's temp
// area, as its code sees it.
func toolPath(p, conversationID string) (string, error) {
	rel, err := workspace.SandboxPath(p)
	if err != nil || conversationID == "" {
		return rel, err
	}
	const view = "uploads/temparea"
	if rest, ok := strings.CutPrefix(rel, view); ok && (rest == "" || rest[0] == '/') {
		return workspace.ConversationDir(conversationID) + rest, nil
	}
	return rel, nil
}

func (s *Server) toolList(conversationID string, raw json.RawMessage) (toolCall, error) {
	var args struct {
		Path      string `json:"path"`
		Recursive bool   `json:"recursive"`
	}
	if err := arguments(raw, &args); err != nil {
		return nil, err
	}
	return func(ctx context.Context, sid string) (*api.ToolResult, error) {
		rel, err := toolPath(args.Path, conversationID)
		if err != nil {
			return toolError(err)
		}
		ws, err := s.opt.Files.Open(ctx, tenantOf(ctx), sid)
		if err != nil {
			return nil, err
		}
		defer ws.Close()
		entries, truncated, err := ws.List(ctx, rel, args.Recursive, maxListEntries)
		if err != nil {
			return toolError(err)
		}
		out := api.FileList{Files: make([]api.FileEntry, 0, len(entries)), Truncated: truncated}
		var b strings.Builder
		for _, e := range entries {
			out.Files = append(out.Files, api.FileEntry{Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size, ModifiedAt: e.ModTime.UTC()})
			if e.Type == "dir" {
				fmt.Fprintf(&b, "%s/\n", e.Path)
			} else {
				fmt.Fprintf(&b, "%s (%d bytes)\n", e.Path, e.Size)
			}
		}
		if len(entries) == 0 {
			b.WriteString("(empty)\n")
		}
		if truncated {
			fmt.Fprintf(&b, "(only the first %d entries)\n", maxListEntries)
		}
		data, _ := json.Marshal(out)
		return &api.ToolResult{Content: b.String(), Data: data}, nil
	}, nil
}

// readResult is read_file's structured result.
type readResult struct {
	Path       string `json:"path"`
	Size       int64  `json:"size"`
	Offset     int64  `json:"offset"`
	Length     int    `json:"length"`
	NextOffset int64  `json:"next_offset"`
	EOF        bool   `json:"eof"`
	Encoding   string `json:"encoding"`
	Content    string `json:"content"`
}

func (s *Server) toolRead(conversationID string, raw json.RawMessage) (toolCall, error) {
	var args struct {
		Path   string `json:"path"`
		Offset int64  `json:"offset"`
		Length int    `json:"length"`
	}
	if err := arguments(raw, &args); err != nil {
		return nil, err
	}
	if args.Length == 0 {
		args.Length = toolReadDefault
	}
	if args.Offset < 0 || args.Length < 1 || args.Length > toolReadMax {
		return nil, fmt.Errorf("arguments: offset must be >= 0 and length 1..%d: %w", toolReadMax, errdefs.ErrInvalidArgument)
	}
	return func(ctx context.Context, sid string) (*api.ToolResult, error) {
		rel, err := toolPath(args.Path, conversationID)
		if err != nil {
			return toolError(err)
		}
		ws, err := s.opt.Files.Open(ctx, tenantOf(ctx), sid)
		if err != nil {
			return nil, err
		}
		defer ws.Close()
		f, err := ws.Open(ctx, rel)
		if err != nil {
			return toolError(err)
		}
		defer f.Close()
		fi := f.Info()
		buf := make([]byte, args.Length)
		if _, err := f.Seek(args.Offset, io.SeekStart); err != nil {
			return nil, err
		}
		n, err := io.ReadFull(f, buf)
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			return nil, err
		}
		buf = buf[:n]
		next := args.Offset + int64(n)
		// A part cut in the middle of a UTF-8 character is still text: the
		// cut character's bytes go to the next part.
		if next < fi.Size {
			for k := 0; k < 3 && len(buf) > 0 && !utf8.Valid(buf); k++ {
				buf = buf[:len(buf)-1]
				next--
			}
		}
		out := readResult{Path: rel, Size: fi.Size, Offset: args.Offset, Length: len(buf), NextOffset: next, EOF: next >= fi.Size, Encoding: "utf-8"}
		if utf8.Valid(buf) {
			out.Content = string(buf)
		} else {
			out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(buf)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s: bytes %d-%d of %d", rel, args.Offset, next, fi.Size)
		if out.EOF {
			b.WriteString(" (end of file)")
		} else {
			fmt.Fprintf(&b, " (more: read again with offset %d)", next)
		}
		if out.Encoding == "base64" {
			b.WriteString(", binary, base64")
		}
		b.WriteString(":\n" + out.Content)
		data, _ := json.Marshal(out)
		return &api.ToolResult{Content: b.String(), Data: data}, nil
	}, nil
}
