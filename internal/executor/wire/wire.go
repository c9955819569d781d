// Package wire is the executor protocol's wire format: the requests,
// responses and limits that the daemon in every sandbox (internal/executor)
// and the control plane's client (internal/executor/client) share, and the
// validation both apply. PROTOCOL.md, beside the daemon, is the contract.
package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Languages an execution can be written in.
const (
	LanguagePython = "python"
	LanguageBash   = "bash"
)

// Limits and defaults of a RunRequest.
const (
	DefaultTimeoutMs   = 30_000
	MaxTimeoutMs       = 24 * 60 * 60 * 1000
	DefaultOutputLimit = 1 << 20
	MaxOutputLimit     = 64 << 20
	// MaxCodeBytes bounds the source of one execution.
	MaxCodeBytes = 8 << 20
	// MaxEventBytes bounds the JSON event handed to handler(event).
	MaxEventBytes = 16 << 20
	// MaxRequestBytes bounds a whole /run body: code, event, env and slack.
	MaxRequestBytes = MaxCodeBytes + MaxEventBytes + 1<<20
	// MaxReturnValueBytes bounds the JSON of a return value; a larger one
	// fails the execution with ReturnValueTooLarge.
	MaxReturnValueBytes = 16 << 20
	// MaxArtifacts bounds Result.Artifacts.
	MaxArtifacts = 1000
	MaxIDLen     = 128
	maxEnvVars   = 1000
)

// RunRequest is the body of POST /run.
type RunRequest struct {
	// ID names the execution for /cancel; the server makes one up when
	// empty. At most 128 characters of [A-Za-z0-9._:-].
	ID string `json:"id,omitempty"`
	// Language is "python" or "bash".
	Language string `json:"language"`
	// Code is the source to run.
	Code string `json:"code"`
	// Event is any JSON value; Python code's handler(event) receives it
	// decoded. Absent means null.
	Event json.RawMessage `json:"event,omitempty"`
	// Env is added to the executor's own environment for this execution.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the working directory; default the workspace.
	Cwd string `json:"cwd,omitempty"`
	// TimeoutMs bounds the run; default 30 s, at most 24 h.
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// OutputLimitBytes caps each of stdout and stderr; default 1 MiB, at
	// most 64 MiB.
	OutputLimitBytes int64 `json:"output_limit_bytes,omitempty"`
	// ContextID, for Python only, runs the code in a long-lived interpreter
	// whose globals survive between executions with the same id (and the
	// same ConversationID: contexts are per conversation).
	ContextID string `json:"context_id,omitempty"`
	// ConversationID, when set, shows the code the conversation's temp
	// area: /workspace/uploads holds only temparea, a read-only view of
	// /workspace/uploads/{ConversationID}/temparea (empty if it does not
	// exist), and no other conversation's uploads. 1-128 characters of
	// [A-Za-z0-9._-], starting with a letter or digit, without "..".
	ConversationID string `json:"conversation_id,omitempty"`
}

// Status is where an execution ended.
type Status string

// Final statuses of an execution.
const (
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusTimeout   Status = "timeout"
	StatusCancelled Status = "cancelled"
)

// Error types the executor itself produces; Python exceptions use their
// class name (ValueError, SyntaxError, SystemExit, ...).
const (
	ErrTypeTimeout             = "Timeout"
	ErrTypeCancelled           = "Cancelled"
	ErrTypeOutOfMemory         = "OutOfMemory"
	ErrTypeSignal              = "Signal"
	ErrTypeNonZeroExit         = "NonZeroExit"
	ErrTypeExecutor            = "ExecutorError"
	ErrTypeReturnValueTooLarge = "ReturnValueTooLarge"
)

// Result is the outcome of one execution, the last event of /run.
type Result struct {
	ID     string `json:"id"`
	Status Status `json:"status"`
	// ExitCode is the process's exit code, or 128+signal if a signal
	// killed it; -1 if the run never started or its end was not seen.
	ExitCode int `json:"exit_code"`
	// Stdout and Stderr are the captured text, cut at the output limit and
	// then ended with a "[sbx: output truncated, N bytes omitted]" line.
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	// ReturnValue is the JSON of a top-level return or of handler(event);
	// absent when the code returned nothing.
	ReturnValue json.RawMessage `json:"return_value,omitempty"`
	// Error is set unless Status is completed.
	Error *ExecError `json:"error,omitempty"`
	// Artifacts are the workspace-relative paths of regular files the run
	// created or modified, sorted.
	Artifacts          []string `json:"artifacts"`
	ArtifactsTruncated bool     `json:"artifacts_truncated,omitempty"`
	// WorkspaceUnchanged says the run changed nothing in the workspace, as
	// a walk of it before and after sees (files, directories, links,
	// modes). False (an older executor, a walk that gave up, any change)
	// means it may have: where workspaces are checkpointed (a Pod's), only
	// a run that says unchanged skips its checkpoint.
	WorkspaceUnchanged bool      `json:"workspace_unchanged,omitempty"`
	StartedAt          time.Time `json:"started_at"`
	FinishedAt         time.Time `json:"finished_at"`
	DurationMs         int64     `json:"duration_ms"`
}

// ExecError says why an execution did not complete.
type ExecError struct {
	// Type is the Python exception's class name or one of the ErrType
	// constants.
	Type      string `json:"type"`
	Message   string `json:"message"`
	Traceback string `json:"traceback,omitempty"`
}

// Error makes an ExecError usable as an error: "Type: message".
func (e *ExecError) Error() string { return e.Type + ": " + e.Message }

// Health is the body of GET /health.
type Health struct {
	OK      bool   `json:"ok"`
	Version string `json:"version"`
	// Ready is true once the zygote has imported its preload list and
	// waits for work; executions sent before wait for it.
	Ready        bool     `json:"ready"`
	Preload      []string `json:"preload"`
	PreloadError string   `json:"preload_error,omitempty"`
	UptimeMs     int64    `json:"uptime_ms"`
}

// Stats is the body of GET /stats: the sandbox's cgroup counters. A value
// the cgroup does not expose is 0; a limit of 0 means unlimited.
type Stats struct {
	CgroupVersion    int    `json:"cgroup_version"`
	MemoryUsageBytes uint64 `json:"memory_usage_bytes"`
	MemoryPeakBytes  uint64 `json:"memory_peak_bytes"`
	MemoryLimitBytes uint64 `json:"memory_limit_bytes"`
	// MemoryCacheBytes is the page cache part of MemoryUsageBytes, which
	// the kernel reclaims before it kills anything.
	MemoryCacheBytes  uint64 `json:"memory_cache_bytes"`
	CPUUsageNs        uint64 `json:"cpu_usage_ns"`
	PidsCurrent       uint64 `json:"pids_current"`
	PidsLimit         uint64 `json:"pids_limit"`
	OOMKillCount      uint64 `json:"oom_kill_count"`
	RunningExecutions int    `json:"running_executions"`
	Contexts          int    `json:"contexts"`
	// WorkspaceBytes is the disk the workspace's files took when the
	// executor last walked it, at an execution's start or end (a Pod's
	// emptyDir has no quota to ask); 0 before the first execution.
	WorkspaceBytes uint64 `json:"workspace_bytes"`
}

// CancelRequest is the body of POST /cancel.
type CancelRequest struct {
	ID string `json:"id"`
}

// CancelResponse is the answer to POST /cancel: whether a running
// execution of that id was found and killed.
type CancelResponse struct {
	Cancelled bool `json:"cancelled"`
}

// DeleteConversationResponse is the answer to DELETE /conversations/{id}:
// how many of the conversation's contexts were deleted.
type DeleteConversationResponse struct {
	DeletedContexts int `json:"deleted_contexts"`
}

// Event is one line of the /run response stream.
type Event struct {
	// Type is "stdout", "stderr" or "result".
	Type   string  `json:"type"`
	Data   string  `json:"data,omitempty"`
	Result *Result `json:"result,omitempty"`
}

// ErrorBody is every error response: {"error":{"code","message"}}.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// ValidID reports whether s may name an execution or a context: 1-128 of
// [A-Za-z0-9._:-]. (These are not regular expressions: compiling ones
// with bounded repeats cost the executor, which starts three times per
// sandbox, most of a millisecond each time.)
func ValidID(s string) bool { return validName(s, MaxIDLen, ":") }

// validName: 1-max of letters, digits and ._- plus extra.
func validName(s string, max int, extra string) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		case strings.IndexByte(extra, c) >= 0:
		default:
			return false
		}
	}
	return true
}

// ValidConversationID reports whether id may name a conversation: it
// names a directory (uploads/{id}), so 1-128 of [A-Za-z0-9._-] starting
// with a letter or digit, without "/", a leading dot or "..". worker.py
// checks it again before it opens that directory.
func ValidConversationID(id string) bool {
	if !validName(id, MaxIDLen, "") || id[0] == '.' || id[0] == '_' || id[0] == '-' {
		return false
	}
	return !strings.Contains(id, "..")
}

// DecodeRunRequest reads and validates a RunRequest and fills in its
// defaults. Unknown fields are refused, so that a misspelt option
// ("timeout" for "timeout_ms") does not silently do nothing. workspace is
// the default cwd.
func DecodeRunRequest(r io.Reader, workspace string) (*RunRequest, error) {
	dec := json.NewDecoder(io.LimitReader(r, MaxRequestBytes+1))
	dec.DisallowUnknownFields()
	var req RunRequest
	if err := dec.Decode(&req); err != nil {
		return nil, fmt.Errorf("run request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if dec.More() {
		return nil, fmt.Errorf("run request: trailing data after the JSON object: %w", errdefs.ErrInvalidArgument)
	}
	if err := req.validate(workspace); err != nil {
		return nil, fmt.Errorf("run request: %w", err)
	}
	return &req, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// validate checks every field (the control plane is not trusted to have
// done it, R-76) and applies defaults.
func (r *RunRequest) validate(workspace string) error {
	if r.ID != "" && !ValidID(r.ID) {
		return invalid("id must be 1-%d characters of [A-Za-z0-9._:-]", MaxIDLen)
	}
	switch r.Language {
	case LanguagePython, LanguageBash:
	case "":
		return invalid("language is required (python or bash)")
	default:
		return invalid("language %q is not python or bash", r.Language)
	}
	if len(r.Code) > MaxCodeBytes {
		return invalid("code is %d bytes, more than %d", len(r.Code), MaxCodeBytes)
	}
	// bash -c takes a C string. (JSON decoding already made the code valid
	// UTF-8; Python reports a NUL as a SyntaxError of its own.)
	if r.Language == LanguageBash && strings.IndexByte(r.Code, 0) >= 0 {
		return invalid("bash code must not contain NUL")
	}
	if len(r.Event) > MaxEventBytes {
		return invalid("event is %d bytes, more than %d", len(r.Event), MaxEventBytes)
	}
	if len(r.Event) == 0 || bytes.Equal(bytes.TrimSpace(r.Event), []byte("null")) {
		r.Event = json.RawMessage("null")
	}
	if len(r.Env) > maxEnvVars {
		return invalid("env has %d variables, more than %d", len(r.Env), maxEnvVars)
	}
	for k, v := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return invalid("env: variable %q: names must be non-empty without '=' or NUL, values without NUL", k)
		}
	}
	if r.Cwd == "" {
		r.Cwd = workspace
	}
	if !path.IsAbs(r.Cwd) || strings.IndexByte(r.Cwd, 0) >= 0 {
		return invalid("cwd %q must be an absolute path", r.Cwd)
	}
	switch {
	case r.TimeoutMs == 0:
		r.TimeoutMs = DefaultTimeoutMs
	case r.TimeoutMs < 0 || r.TimeoutMs > MaxTimeoutMs:
		return invalid("timeout_ms %d out of range 1..%d", r.TimeoutMs, MaxTimeoutMs)
	}
	switch {
	case r.OutputLimitBytes == 0:
		r.OutputLimitBytes = DefaultOutputLimit
	case r.OutputLimitBytes < 0 || r.OutputLimitBytes > MaxOutputLimit:
		return invalid("output_limit_bytes %d out of range 1..%d", r.OutputLimitBytes, MaxOutputLimit)
	}
	if r.ConversationID != "" && !ValidConversationID(r.ConversationID) {
		return invalid("conversation_id %q must be 1-%d characters of [A-Za-z0-9._-], starting with a letter or digit, without \"..\"",
			r.ConversationID, MaxIDLen)
	}
	if r.ContextID != "" {
		if r.Language != LanguagePython {
			return invalid("context_id is for python only")
		}
		if !ValidID(r.ContextID) {
			return invalid("context_id must be 1-%d characters of [A-Za-z0-9._:-]", MaxIDLen)
		}
	}
	return nil
}

// Validate checks a request the way the executor will, and fills in its
// defaults, so that a caller can refuse bad input before it has a sandbox.
func (r *RunRequest) Validate() error { return r.validate("/workspace") }
