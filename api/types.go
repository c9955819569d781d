// Package api is the control plane's wire format: the JSON bodies of the
// HTTP API under /api/v1, shared by the server (internal/server) and the Go
// client (client/). openapi.yaml beside this file is the contract; the
// server's tests validate every request and response against it, so these
// types and the document cannot drift apart.
package api

import (
	_ "embed"
	"encoding/json"
	"strings"
	"time"
)

// OpenAPI is the contract, api/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

// Prefix is the path every endpoint of the API lives under.
const Prefix = "/api/v1"

// Session statuses.
const (
	StatusPending    = "pending"
	StatusRunning    = "running"
	StatusPaused     = "paused"
	StatusHibernated = "hibernated"
	StatusError      = "error"
	StatusTerminated = "terminated"
)

// Sandbox states: what the server has of a session's sandbox.
const (
	SandboxNone     = "none"
	SandboxStarting = "starting"
	SandboxRunning  = "running"
	SandboxPaused   = "paused"
)

// Execution statuses. Submit answers "submitted"; an execution is
// then pending until a sandbox takes it, running, and finally one of the
// last four.
const (
	ExecSubmitted = "submitted"
	ExecPending   = "pending"
	ExecRunning   = "running"
	ExecCompleted = "completed"
	ExecFailed    = "failed"
	ExecTimeout   = "timeout"
	ExecCancelled = "cancelled"
)

// ErrTypeSandboxUnavailable is the error type of an execution that never
// ran because no sandbox could be had: submitting it again is safe.
const ErrTypeSandboxUnavailable = "SandboxUnavailable"

// ErrTypeTemplateNotBuilt is the error type of an execution that never
// ran because its session's template (a tenant's own) has no build to
// start a sandbox on: its last build failed or was cancelled. (While the
// template builds, the error type is SandboxUnavailable: retrying works.)
// A ?wait=true execute answers it with 409.
const ErrTypeTemplateNotBuilt = "TemplateNotBuilt"

// ErrTypeQuotaExceeded is the error type of an execution that never ran
// because its tenant is at one of its limits (live sandboxes, memory,
// CPU): retryable once the tenant holds less. With ?wait=true it is a 429
// with Retry-After.
const ErrTypeQuotaExceeded = "QuotaExceeded"

// Error is every error response: {"error":{"code","message"}}.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody says what went wrong. Code is one of invalid_argument (400),
// unauthenticated (401), permission_denied (403), not_found (404),
// already_exists and failed_precondition (409), payload_too_large (413),
// unsupported_media_type (415), unprocessable (422), resource_exhausted
// (429), internal (500) and unavailable (503).
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Resources are a session's sandbox limits. Zero fields take the
// template's defaults.
type Resources struct {
	// CPU is in cores (0.5 = half a core), at most 16.
	CPU float64 `json:"cpu,omitempty"`
	// Memory is in MiB, 64..65536.
	Memory int64 `json:"memory,omitempty"`
	// Disk is the workspace quota in MiB, 16..1048576.
	Disk int64 `json:"disk,omitempty"`
}

// FileUploadConfig limits what may be uploaded into a session.
type FileUploadConfig struct {
	// MaxFileSize, in MaxFileSizeUnit, bounds one file. Default 100 MB.
	MaxFileSize int64 `json:"max_file_size,omitempty"`
	// MaxFileSizeUnit is KB, MB (default) or GB (powers of 1024).
	MaxFileSizeUnit string `json:"max_file_size_unit,omitempty"`
	// MaxFileCount bounds the files uploaded into the session and not
	// deleted since. Default 1000.
	MaxFileCount int `json:"max_file_count,omitempty"`
	// AllowedFileTypes, if not empty, lists the file name extensions
	// (".csv", "pdf") or media types ("text/csv", "image/*") that may be
	// uploaded.
	AllowedFileTypes []string `json:"allowed_file_types,omitempty"`
}

// CreateSessionRequest is the body of POST /sessions.
type CreateSessionRequest struct {
	// SessionID is chosen by the client (^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$)
	// or, when empty, by the server. Creating an id that exists returns
	// that session.
	SessionID  string `json:"session_id,omitempty"`
	TemplateID string `json:"template_id,omitempty"`
	// Timeout is the session's time to live in seconds (default 86400, at
	// most 604800).
	Timeout int64 `json:"timeout,omitempty"`
	// IdleTimeout is how many seconds without activity pause the sandbox
	// (default 600).
	IdleTimeout int64 `json:"idle_timeout,omitempty"`
	// HibernateTimeout is how many seconds without activity hibernate the
	// session: workspace to the blob store, sandbox gone (default 86400).
	HibernateTimeout int64 `json:"hibernate_timeout,omitempty"`
	// WarmUp starts the sandbox at once (status pending, then running)
	// rather than at the first execution.
	WarmUp    bool              `json:"warm_up,omitempty"`
	Resources *Resources        `json:"resources,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
	// Network is "none" (the default and, for now, the only choice).
	Network          string            `json:"network,omitempty"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	FileUploadConfig *FileUploadConfig `json:"file_upload_config,omitempty"`
}

// Session is a session as the API shows it.
type Session struct {
	SessionID  string `json:"session_id"`
	Status     string `json:"status"`
	TemplateID string `json:"template_id"`
	// Error says why Status is "error".
	Error            string    `json:"error,omitempty"`
	CreatedAt        time.Time `json:"created_at"`
	LastActivityAt   time.Time `json:"last_activity_at"`
	ExpiresAt        time.Time `json:"expires_at"`
	TTL              int64     `json:"ttl"`
	IdleTimeout      int64     `json:"idle_timeout"`
	HibernateTimeout int64     `json:"hibernate_timeout"`
	// SandboxState is what this server has of the session's sandbox:
	// none, starting, running or paused.
	SandboxState     string            `json:"sandbox_state"`
	Resources        Resources         `json:"resources"`
	Network          string            `json:"network"`
	Metadata         map[string]string `json:"metadata"`
	FileUploadConfig FileUploadConfig  `json:"file_upload_config"`
	// EnvVars lists the names of the session's environment variables; the
	// values are not shown again.
	EnvVars []string `json:"env_vars"`
}

// Snapshot is a saved copy of a session's workspace.
type Snapshot struct {
	SnapshotID string    `json:"snapshot_id"`
	SessionID  string    `json:"session_id"`
	CreatedAt  time.Time `json:"created_at"`
	// Files, Dirs and Symlinks count the workspace's entries; Bytes is the
	// size of its files.
	Files    int   `json:"files"`
	Dirs     int   `json:"dirs"`
	Symlinks int   `json:"symlinks"`
	Bytes    int64 `json:"bytes"`
	// NewBytes, in the answer to a create, is what this snapshot added to
	// the blob store: content already there (an unchanged file, a file of
	// an earlier snapshot) is not stored twice.
	NewBytes *int64 `json:"new_bytes,omitempty"`
}

// SnapshotList is GET /sessions/{id}/snapshots, oldest first.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// SessionMetrics is GET /sessions/{id}/metrics: the usage of the
// session's sandbox, now and over the last minutes.
type SessionMetrics struct {
	SessionID string `json:"session_id"`
	// Sandbox is what the session has: none, starting, running, paused
	// or hibernated. Only a running or paused sandbox has readings.
	Sandbox string `json:"sandbox"`
	// IntervalSeconds is the time between two samples.
	IntervalSeconds float64 `json:"interval_seconds"`
	// Current is a reading taken for the request.
	Current *MetricsSample `json:"current,omitempty"`
	// Samples are the readings the server took, oldest first.
	Samples []MetricsSample `json:"samples"`
}

// MetricsSample is one reading of a sandbox.
type MetricsSample struct {
	Timestamp time.Time `json:"timestamp"`
	// CPUUsedPct is the CPU used since the reading before, as a
	// percentage of what the sandbox's CPUCount cores allow.
	CPUUsedPct float64 `json:"cpu_used_pct"`
	CPUCount   float64 `json:"cpu_count"`
	// MemoryUsedBytes is what the memory limit counts, page cache
	// (MemoryCacheBytes) included.
	MemoryUsedBytes  int64 `json:"memory_used_bytes"`
	MemoryCacheBytes int64 `json:"memory_cache_bytes"`
	MemoryLimitBytes int64 `json:"memory_limit_bytes"`
	// DiskUsedBytes and DiskLimitBytes are the workspace's, as its disk
	// quota counts; 0 (absent) when the server has no disk quotas.
	DiskUsedBytes  int64 `json:"disk_used_bytes,omitempty"`
	DiskLimitBytes int64 `json:"disk_limit_bytes,omitempty"`
	PIDs           int64 `json:"pids"`
	PIDsLimit      int64 `json:"pids_limit"`
}

// SessionList is a page of GET /sessions.
type SessionList struct {
	Sessions      []Session `json:"sessions"`
	NextPageToken string    `json:"next_page_token,omitempty"`
}

// DeleteSessionResponse is the answer to DELETE /sessions/{id}.
type DeleteSessionResponse struct {
	SessionID string `json:"session_id"`
	Status    string `json:"status"`
}

// KeepaliveRequest is the optional body of POST /sessions/{id}/keepalive:
// the session then expires Timeout seconds from now (default: its TTL).
type KeepaliveRequest struct {
	Timeout int64 `json:"timeout,omitempty"`
}

// ExecuteRequest is the body of POST /sessions/{id}/execute.
type ExecuteRequest struct {
	Code string `json:"code"`
	// Language is python (default) or bash.
	Language string `json:"language,omitempty"`
	// Timeout is in seconds (default 30, at most 86400); fractions allowed.
	Timeout float64 `json:"timeout,omitempty"`
	// Event is passed to handler(event).
	Event          json.RawMessage   `json:"event,omitempty"`
	EnvVars        map[string]string `json:"env_vars,omitempty"`
	ConversationID string            `json:"conversation_id,omitempty"`
	ContextID      string            `json:"context_id,omitempty"`
}

// AgentExecuteRequest is the body of POST /agents/{agent_id}/execute
// an execute request for the session of one user's agent,
// sb-session-{user_id}-{agent_id}, which the server creates on first use.
type AgentExecuteRequest struct {
	UserID string `json:"user_id"`
	// TemplateID is the template of the session if this call creates it
	// (default python); it does not change an existing session.
	TemplateID     string            `json:"template_id,omitempty"`
	Code           string            `json:"code"`
	Language       string            `json:"language,omitempty"`
	Timeout        float64           `json:"timeout,omitempty"`
	Event          json.RawMessage   `json:"event,omitempty"`
	EnvVars        map[string]string `json:"env_vars,omitempty"`
	ConversationID string            `json:"conversation_id,omitempty"`
	ContextID      string            `json:"context_id,omitempty"`
}

// Execute is the request's execute part.
func (r *AgentExecuteRequest) Execute() ExecuteRequest {
	return ExecuteRequest{
		Code: r.Code, Language: r.Language, Timeout: r.Timeout, Event: r.Event, EnvVars: r.EnvVars,
		ConversationID: r.ConversationID, ContextID: r.ContextID,
	}
}

// AgentSessionID is the session of a user's agent:
// sb-session-{user_id}-{agent_id}, with every "-" in the user id doubled.
//
// Plain concatenation gave (alice, data-analyst) and (alice-data, analyst)
// one session, so one user read the other's files. With the user's dashes
// doubled, the first single "-" after the prefix is the separator (an
// agent id starts with a letter or digit), so no two pairs share an id;
// ids without a "-" in the user id are unchanged.
func AgentSessionID(userID, agentID string) string {
	return "sb-session-" + strings.ReplaceAll(userID, "-", "--") + "-" + agentID
}

// Tool is one tool definition in the OpenAI function-calling shape
// {"type":"function","function":{name, description, parameters}}.
type Tool struct {
	Type     string       `json:"type"`
	Function ToolFunction `json:"function"`
}

// ToolFunction names a tool, says what it does, and gives the JSON Schema
// of its arguments.
type ToolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// ToolList is GET /tools.
type ToolList struct {
	Tools []Tool `json:"tools"`
}

// ToolInvokeRequest is the body of POST /tools/{name}/invoke: the
// arguments a model gave, and whose session runs them.
type ToolInvokeRequest struct {
	UserID  string `json:"user_id"`
	AgentID string `json:"agent_id"`
	// ConversationID, if set, is the conversation the call is for: code
	// runs with its temp area in view.
	ConversationID string          `json:"conversation_id,omitempty"`
	Arguments      json.RawMessage `json:"arguments"`
}

// ToolResult is what a tool call gives back to the model: Content is the
// text to show it, IsError says the call failed (the model may try
// again); Data is the structured result (an Execution, a FileList...).
type ToolResult struct {
	Content   string          `json:"content"`
	IsError   bool            `json:"is_error"`
	SessionID string          `json:"session_id"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// ChatRequest is the body of POST /agents/{agent_id}/chat: one
// user message of a conversation, answered by the model with the tools,
// in the session of the user's agent.
type ChatRequest struct {
	UserID         string `json:"user_id"`
	ConversationID string `json:"conversation_id"`
	Message        string `json:"message"`
	// System replaces the server's system prompt for this turn (it is not
	// kept in the conversation's history).
	System string `json:"system,omitempty"`
	// Model replaces the server's model (--llm-model) for this turn: one
	// of the models it offers (--llm-models), else 400.
	Model string `json:"model,omitempty"`
}

// Server-sent event names of a chat: any number of "delta"
// (ChatDelta), "tool_call" (ChatToolCall) and "tool_result"
// (ChatToolResult), then "message" (ChatMessage) when the model has
// answered, or "error" (ChatError) when it could not; "done" (ChatDone)
// always ends the stream.
const (
	ChatEventDelta      = "delta"
	ChatEventToolCall   = "tool_call"
	ChatEventToolResult = "tool_result"
	ChatEventMessage    = "message"
	ChatEventError      = "error"
	ChatEventDone       = "done"
)

// ChatDelta is a piece of the assistant's text as the model streams it.
type ChatDelta struct {
	Text string `json:"text"`
}

// ChatToolCall is a tool call of the model, about to run. Arguments is
// the model's text, which may not be JSON (the tool result then says so).
type ChatToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ChatToolResult is what a tool call gave back to the model.
type ChatToolResult struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Content string `json:"content"`
	IsError bool   `json:"is_error"`
}

// ChatMessage is the model's final answer of a turn.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatError says why a chat turn ended without the model's answer (or
// why its history was not kept). Code is one of the ChatErr* codes.
type ChatError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Codes of a chat's "error" event.
const (
	// ChatErrLLM: the model's endpoint failed (an HTTP error, no
	// connection, a stream cut short).
	ChatErrLLM = "llm_error"
	// ChatErrStepLimit: the model still asked for tools at the last step
	// the server allows (--llm-max-steps).
	ChatErrStepLimit = "step_limit"
	// ChatErrTool: a tool could not be run at all (no sandbox, a tenant
	// limit, a server fault); a tool that ran and failed is a
	// tool_result with is_error instead.
	ChatErrTool = "tool_error"
	// ChatErrHistory: the conversation's history could not be read or
	// kept.
	ChatErrHistory = "history_error"
	// ChatErrBudget: the tenant's model tokens (--limits chat_tokens) ran
	// out during the turn.
	ChatErrBudget = "budget_exceeded"
)

// ChatDone ends a chat's stream.
type ChatDone struct {
	SessionID      string `json:"session_id"`
	ConversationID string `json:"conversation_id"`
	// Steps is how many times the model was called for the turn.
	Steps int `json:"steps"`
	// Usage is the tokens the endpoint counted, when it said.
	Usage *ChatUsage `json:"usage,omitempty"`
}

// ChatUsage counts the tokens of a turn's model calls (a summary of the
// history included).
type ChatUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// SubmitResponse is the answer to an asynchronous submit.
type SubmitResponse struct {
	ExecutionID string `json:"execution_id"`
	Status      string `json:"status"`
}

// ExecError says why an execution did not complete.
type ExecError struct {
	Type      string `json:"type"`
	Message   string `json:"message"`
	Traceback string `json:"traceback,omitempty"`
}

// Execution is an execution's status and, once it is over, its result
// . GET /executions/{id} leaves out the result fields.
type Execution struct {
	ExecutionID    string     `json:"execution_id"`
	SessionID      string     `json:"session_id"`
	Status         string     `json:"status"`
	Language       string     `json:"language"`
	ConversationID string     `json:"conversation_id,omitempty"`
	ContextID      string     `json:"context_id,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	StartedAt      *time.Time `json:"started_at,omitempty"`
	FinishedAt     *time.Time `json:"finished_at,omitempty"`
	DurationMs     int64      `json:"duration_ms"`

	Stdout          string          `json:"stdout"`
	Stderr          string          `json:"stderr"`
	StdoutTruncated bool            `json:"stdout_truncated,omitempty"`
	StderrTruncated bool            `json:"stderr_truncated,omitempty"`
	ExitCode        *int            `json:"exit_code,omitempty"`
	ReturnValue     json.RawMessage `json:"return_value,omitempty"`
	Error           *ExecError      `json:"error,omitempty"`
	// Artifacts are the workspace paths the run created or modified.
	Artifacts []string `json:"artifacts"`
	// Truncated, in a result read back from the server's records, names
	// the fields the record keeps only in part (stdout, stderr,
	// error.message, error.traceback, error.type; artifacts: only the
	// first ones) or not at all (return_value), each with its full size in
	// bytes (artifacts: their number). The answer of the request that ran
	// the execution has them whole.
	Truncated map[string]int64 `json:"truncated,omitempty"`
}

// ExecutionList is a page of GET /sessions/{id}/executions,
// newest first, without outputs.
type ExecutionList struct {
	Executions    []Execution `json:"executions"`
	NextPageToken string      `json:"next_page_token,omitempty"`
}

// StreamOutput is the data of a "stdout" or "stderr" server-sent event.
type StreamOutput struct {
	Text string `json:"text"`
}

// Server-sent event names of a streamed execution: "submitted" (data
// SubmitResponse), any number of "stdout"/"stderr" (StreamOutput), then one
// "result" (Execution) or "error" (Error).
const (
	EventSubmitted = "submitted"
	EventStdout    = "stdout"
	EventStderr    = "stderr"
	EventResult    = "result"
	EventError     = "error"
)

// UploadedFile describes one file of an upload.
type UploadedFile struct {
	Name string `json:"name"`
	// Path is the file's path relative to the workspace: the name to use
	// with the other file endpoints.
	Path string `json:"path"`
	// SandboxPath is where the session's code sees it: for a conversation
	// upload, where that conversation's code sees it
	// (/workspace/uploads/temparea/NAME).
	SandboxPath    string `json:"sandbox_path"`
	Size           int64  `json:"size"`
	SHA256         string `json:"sha256"`
	ConversationID string `json:"conversation_id,omitempty"`
}

// UploadResponse is the answer to POST /sessions/{id}/files/upload.
type UploadResponse struct {
	Files []UploadedFile `json:"files"`
}

// FileEntry is one entry of a file listing.
type FileEntry struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// Type is file, dir, symlink or other.
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modified_at"`
}

// FileList is the answer to GET /sessions/{id}/files.
type FileList struct {
	Files     []FileEntry `json:"files"`
	Truncated bool        `json:"truncated,omitempty"`
}

// PresignResponse is the answer to GET /sessions/{id}/files/{path}?presign=true.
type PresignResponse struct {
	// URL is absolute when the request said which host it came to.
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Health is the body of /healthz and /readyz.
type Health struct {
	Status string `json:"status"`
	// Checks maps each dependency /readyz looks at to "ok" or what is wrong.
	Checks map[string]string `json:"checks,omitempty"`
}

// NamedResource is one entry of a resource manifest: a path below
// the session's resource directory, and the SHA-256 (lower-case hex) and
// size of its content. (Not Resources, a session's CPU and memory.)
type NamedResource struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// ResourceManifest is the body of PUT /sessions/{id}/resources: every
// resource the session should have; what is not named is removed.
type ResourceManifest struct {
	Resources []NamedResource `json:"resources"`
}

// ResourceSync is the answer to PUT /sessions/{id}/resources. Needed lists
// the resources whose content the server does not have: upload each with
// PUT /resources/{sha256}, then send the manifest again. Complete is true
// when everything in the manifest is in place.
type ResourceSync struct {
	// Path is where the sandbox sees the resources.
	Path      string          `json:"path"`
	Complete  bool            `json:"complete"`
	Needed    []NamedResource `json:"needed"`
	Added     []string        `json:"added"`
	Changed   []string        `json:"changed"`
	Removed   []string        `json:"removed"`
	Unchanged int             `json:"unchanged"`
}

// ResourceList is the answer to GET /sessions/{id}/resources: the
// resources in place.
type ResourceList struct {
	Path      string          `json:"path"`
	Resources []NamedResource `json:"resources"`
}

// ContentUpload is the answer to PUT /resources/{sha256}: 201 if the
// content is new, 200 if the server had it already.
type ContentUpload struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}
