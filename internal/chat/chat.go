// Package chat is the reference chat loop: one turn of a
// conversation with a model behind an OpenAI-compatible chat-completions
// endpoint, which may call tools. Run streams the model's answer, runs the
// tools it calls, gives it their results and calls it again, until it
// answers without a tool call or a step limit ends the turn; every step is
// an event as it happens. The conversation's history is a document of the
// metadata store, bounded (history.go).
//
// The package knows neither HTTP handlers nor sessions: the server gives
// it the tools to run (Tools) and writes its events out as server-sent
// events (internal/server/chat.go). The endpoint is spoken to with the
// official OpenAI Go SDK (model.go).
package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// Defaults of Config.
const (
	DefaultMaxSteps      = 8
	DefaultHistoryTurns  = 20
	DefaultHistoryTokens = 24000
)

// Config configures the loop. Zero fields take the defaults given.
type Config struct {
	// BaseURL is the endpoint's base, the URL that chat/completions is
	// under (https://api.openai.com/v1, http://127.0.0.1:8000/v1). Required.
	BaseURL string
	// Model is the model asked for when a request names none. Required.
	Model string
	// Models are the models a request may name, all on the operator's
	// key (default: Model alone); Model must be one of them.
	Models []string
	// APIKey is sent as Authorization: Bearer KEY ("": no header). It is
	// never logged.
	APIKey string
	// MaxSteps bounds the model calls of one turn (default 8): a model
	// that still calls tools at the last one ends the turn with
	// step_limit.
	MaxSteps int
	// HistoryTurns is how many of the last turns the history keeps whole
	// (default 20); older ones are folded into a summary.
	HistoryTurns int
	// HistoryTokens is the history's budget, in tokens estimated as bytes
	// / 4 (default 24000): past it, the oldest kept turns are folded into
	// the summary too (the last turn is always kept).
	HistoryTokens int
	// MaxRetries is how many times a model call the endpoint refused
	// (429, 5xx, no connection) is tried again, with a backoff, before
	// anything of it is streamed. Default 0: a refused call ends the turn
	// at once with llm_error, and the client may send the message again.
	MaxRetries int
	// HTTPClient makes the requests (default http.DefaultClient).
	HTTPClient *http.Client
	Log        *slog.Logger
}

// Chat runs turns of conversations against one endpoint. It is safe for
// concurrent use.
type Chat struct {
	cfg  Config
	llm  openai.ChatCompletionService
	docs Documents
	log  *slog.Logger
}

// Documents is where conversations are kept: store.Store, or the part of
// it the loop uses.
type Documents interface {
	GetDocument(ctx context.Context, kind, tenant, key string) (*store.Document, error)
	PutDocument(ctx context.Context, d *store.Document) error
	DeleteDocument(ctx context.Context, kind, tenant, key string, revision int64) error
}

var _ Documents = store.Store(nil)

// New returns the loop of cfg, keeping conversations in docs.
func New(cfg Config, docs Documents) (*Chat, error) {
	if cfg.BaseURL == "" || cfg.Model == "" {
		return nil, errors.New("chat: the model endpoint needs a base URL and a model")
	}
	if len(cfg.Models) == 0 {
		cfg.Models = []string{cfg.Model}
	}
	if !slices.Contains(cfg.Models, cfg.Model) {
		return nil, fmt.Errorf("chat: the default model %q is not one of the models offered (%s)", cfg.Model, strings.Join(cfg.Models, ", "))
	}
	if cfg.MaxSteps <= 0 {
		cfg.MaxSteps = DefaultMaxSteps
	}
	if cfg.HistoryTurns <= 0 {
		cfg.HistoryTurns = DefaultHistoryTurns
	}
	if cfg.HistoryTokens <= 0 {
		cfg.HistoryTokens = DefaultHistoryTokens
	}
	cfg.MaxRetries = max(cfg.MaxRetries, 0)
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = http.DefaultClient
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	// The service alone, not openai.NewClient: that one also reads
	// OPENAI_API_KEY, OPENAI_BASE_URL and more from the environment, and
	// would send an OpenAI key to whatever endpoint is configured.
	opts := []option.RequestOption{
		option.WithBaseURL(cfg.BaseURL),
		option.WithHTTPClient(cfg.HTTPClient),
		option.WithMaxRetries(cfg.MaxRetries),
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	return &Chat{cfg: cfg, llm: openai.NewChatCompletionService(opts...), docs: docs, log: cfg.Log}, nil
}

// Model is the model a request naming name gets: the default for "",
// else name if the operator offers it. Any other is refused before the
// endpoint is called: every call is paid with the operator's key, and a
// tenant must not choose the dearest model.
func (c *Chat) Model(name string) (string, error) {
	if name == "" {
		return c.cfg.Model, nil
	}
	if !slices.Contains(c.cfg.Models, name) {
		return "", fmt.Errorf("model %q is not offered by this server; the models are %s: %w", cut(name, 100), strings.Join(c.cfg.Models, ", "), errdefs.ErrInvalidArgument)
	}
	return name, nil
}

// Meter is what a turn may spend of its tenant's model tokens.
type Meter interface {
	// Allow is asked before each model call of the turn: an error ends
	// the turn with budget_exceeded, its message shown to the user.
	Allow() error
	// Use is told the tokens of each model call (the summary of the
	// history included): as the endpoint counted them, or, when it said
	// nothing, estimated as the bytes sent and received / 4.
	Use(tokens int64)
}

// Tools are the tools a model may call in a turn.
type Tools interface {
	// List is their definitions, in the OpenAI function-calling shape.
	List() []api.Tool
	// Call runs tool name, one of List, with args, a JSON object. content
	// is what the model is shown, isError that the call failed (the
	// model should see why: a missing file, an exception, arguments the
	// tool does not take). An error means the tool could not be run at
	// all (no sandbox, a tenant limit): it ends the turn, its message
	// shown to the user as it is.
	Call(ctx context.Context, name string, args json.RawMessage) (content string, isError bool, err error)
}

// Request is one turn: a user's message in a conversation with an agent.
type Request struct {
	Tenant, UserID, AgentID, ConversationID string
	// SessionID is the session the tools run in, for the done event.
	SessionID string
	Message   string
	// System and Model replace the default system prompt and the
	// configured model for this turn (Model: one of Config.Models; see
	// Chat.Model).
	System, Model string
	// RequestID names the request in the server's log, where the details
	// of a failed model call go: the user is told the id, never what the
	// endpoint said.
	RequestID string
	// Meter, if set, bounds the tokens the turn may use.
	Meter Meter
}

// Event is one event of a turn: its name (api.ChatEvent*) and its data
// (api.ChatDelta, api.ChatToolCall, api.ChatToolResult, api.ChatMessage,
// api.ChatError, api.ChatDone).
type Event struct {
	Name string
	Data any
}

// Bounds on what a turn shows the model and what the history keeps.
const (
	// maxToolResult is the most of a tool's result the model is shown
	// (read_file's default part).
	maxToolResult = 64 << 10
)

// DefaultSystem is the system prompt of a request that gives none.
const DefaultSystem = "You are a helpful assistant with a sandbox: a Linux machine of the user's where you run code. " +
	"Use the tools: execute_code runs Python (a top-level `return` gives a result), run_bash runs a command, " +
	"upload_file writes a file, list_files and read_file look at files. Files in /workspace stay between calls and turns; " +
	"the files the user uploaded in this conversation are in /workspace/uploads/temparea. " +
	"Read large files a part at a time. When you have the answer, give it briefly, without calling a tool."

// Run runs one turn of req's conversation, calling emit with each event
// as it happens, from this goroutine; the last event is always done.
//
// The turn is added to the conversation's history when the model has
// answered, or, after step_limit, with the steps that ran (so that the
// next turn knows what the tools did); a turn that failed otherwise (the
// endpoint, a tool that could not run) is not kept, and the same message
// sent again starts from the same history. When ctx ends (the client
// left) the model's stream and a running tool are cancelled, and the turn
// is not kept unless the model had answered.
func (c *Chat) Run(ctx context.Context, req Request, tools Tools, emit func(Event)) {
	t := &turn{c: c, req: req, tools: tools, emit: emit, model: req.Model}
	if t.model == "" {
		t.model = c.cfg.Model
	}
	if req.Meter != nil {
		ctx = context.WithValue(ctx, meterKey{}, req.Meter)
	}
	t.run(ctx)
	done := api.ChatDone{SessionID: req.SessionID, ConversationID: req.ConversationID, Steps: t.steps}
	if t.usage.TotalTokens > 0 || t.usage.PromptTokens > 0 {
		u := t.usage
		done.Usage = &u
	}
	emit(Event{api.ChatEventDone, done})
}

// turn is one Run.
type turn struct {
	c     *Chat
	req   Request
	tools Tools
	emit  func(Event)
	model string
	steps int
	usage api.ChatUsage
	// msgs are the turn's messages so far: the user's, then the model's
	// and the tools'.
	msgs []message
}

func (t *turn) fail(code, format string, args ...any) {
	t.emit(Event{api.ChatEventError, api.ChatError{Code: code, Message: fmt.Sprintf(format, args...)}})
}

func (t *turn) run(ctx context.Context) {
	conv, _, err := t.c.load(ctx, t.req)
	if err != nil {
		if ctx.Err() == nil {
			t.c.log.Error("chat: reading a conversation", "tenant", t.req.Tenant, "conversation", t.req.ConversationID, "err", err)
			t.fail(api.ChatErrHistory, "the conversation's history could not be read; try again")
		}
		return
	}
	t.msgs = []message{{Role: roleUser, Content: t.req.Message}}
	defs := t.tools.List()
	known := make(map[string]bool, len(defs))
	for _, d := range defs {
		known[d.Function.Name] = true
	}
	params := toolParams(defs)
	for {
		if m := t.req.Meter; m != nil {
			if err := m.Allow(); err != nil {
				t.fail(api.ChatErrBudget, "%v", err)
				return
			}
		}
		t.steps++
		res, err := t.c.step(ctx, t.model, t.c.prompt(t.req.System, conv, t.msgs), params, func(text string) {
			t.emit(Event{api.ChatEventDelta, api.ChatDelta{Text: text}})
		})
		t.usage = addUsage(t.usage, res.usage)
		if err != nil {
			if ctx.Err() == nil {
				// The endpoint's words and its URL stay in the log: they
				// may name the operator's hosts, accounts or key.
				t.c.log.Warn("chat: model call failed", "request_id", t.req.RequestID, "tenant", t.req.Tenant, "model", t.model, "step", t.steps, "err", llmDetail(err))
				msg := llmError(err)
				if t.req.RequestID != "" {
					msg += " (request " + t.req.RequestID + "; the server log has the details)"
				}
				t.fail(api.ChatErrLLM, "%s", msg)
			}
			return
		}
		calls := res.calls(t.steps)
		if len(calls) == 0 {
			t.msgs = append(t.msgs, message{Role: roleAssistant, Content: res.content})
			t.emit(Event{api.ChatEventMessage, api.ChatMessage{Role: roleAssistant, Content: res.content}})
			t.keep(ctx)
			return
		}
		if t.steps >= t.c.cfg.MaxSteps {
			// The calls of the last step are not run: their results
			// could reach no model call. The steps that ran are kept, so
			// that the next turn knows what the tools did.
			if res.content != "" {
				t.msgs = append(t.msgs, message{Role: roleAssistant, Content: res.content})
			}
			t.fail(api.ChatErrStepLimit, "the model still called tools after %d steps, the most a turn may take (--llm-max-steps); what it did so far is kept: ask it to go on", t.steps)
			t.keep(ctx)
			return
		}
		t.msgs = append(t.msgs, message{Role: roleAssistant, Content: res.content, ToolCalls: sanitized(calls)})
		for _, call := range calls {
			t.emit(Event{api.ChatEventToolCall, api.ChatToolCall{ID: call.ID, Name: call.Name, Arguments: call.Arguments}})
			content, isError, err := t.call(ctx, known, call)
			if err != nil {
				if ctx.Err() == nil {
					t.c.log.Warn("chat: a tool could not be run", "tenant", t.req.Tenant, "tool", call.Name, "err", err)
					t.fail(api.ChatErrTool, "tool %s could not be run: %v", call.Name, err)
				}
				return
			}
			content = cut(content, maxToolResult)
			t.emit(Event{api.ChatEventToolResult, api.ChatToolResult{ID: call.ID, Name: call.Name, Content: content, IsError: isError}})
			t.msgs = append(t.msgs, message{Role: roleTool, ToolCallID: call.ID, Name: call.Name, Content: content, IsError: isError})
		}
	}
}

// call runs one of the model's tool calls. A call the model got wrong
// (no such tool, arguments that are not a JSON object) is an error result
// for it to see, not a failure of the turn.
func (t *turn) call(ctx context.Context, known map[string]bool, call toolCall) (string, bool, error) {
	if !known[call.Name] {
		names := make([]string, 0, len(known))
		for _, d := range t.tools.List() {
			names = append(names, d.Function.Name)
		}
		return fmt.Sprintf("error: there is no tool %q; the tools are %s", call.Name, strings.Join(names, ", ")), true, nil
	}
	args := strings.TrimSpace(call.Arguments)
	if args == "" {
		args = "{}" // a call without arguments, as some models send it
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(args), &obj); err != nil || obj == nil {
		return fmt.Sprintf("error: the arguments of %s are not a JSON object (%s): %s", call.Name, jsonProblem(err), cut(call.Arguments, 200)), true, nil
	}
	return t.tools.Call(ctx, call.Name, json.RawMessage(args))
}

func jsonProblem(err error) string {
	if err == nil {
		return "null"
	}
	return err.Error()
}

// keep adds the turn to the conversation's history. It goes on when the
// client has left: the model's answer is worth keeping, sent or not.
func (t *turn) keep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), historyTimeout)
	defer cancel()
	u, err := t.c.keep(ctx, t.req, t.model, t.msgs)
	t.usage = addUsage(t.usage, u)
	if err != nil {
		t.c.log.Error("chat: keeping a turn", "tenant", t.req.Tenant, "conversation", t.req.ConversationID, "err", err)
		t.fail(api.ChatErrHistory, "the answer could not be kept in the conversation's history: the next turn will not know of it")
	}
}

func addUsage(a, b api.ChatUsage) api.ChatUsage {
	return api.ChatUsage{
		PromptTokens: a.PromptTokens + b.PromptTokens, CompletionTokens: a.CompletionTokens + b.CompletionTokens,
		TotalTokens: a.TotalTokens + b.TotalTokens,
	}
}

// cut returns s, or its first n bytes (at a character's start) and a note
// of how much is left out.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return fmt.Sprintf("%s\n[... %d more bytes not shown]", s[:i], len(s)-i)
}

// meterKey holds a turn's Meter in its context, for the model calls of
// the history's summary too.
type meterKey struct{}

// use tells the turn's meter, if any, what a model call used: its usage,
// or, when the endpoint counted nothing, its bytes sent and received / 4.
func use(ctx context.Context, u api.ChatUsage, sent, received int) {
	m, _ := ctx.Value(meterKey{}).(Meter)
	if m == nil {
		return
	}
	n := u.TotalTokens
	if n <= 0 {
		n = u.PromptTokens + u.CompletionTokens
	}
	if n <= 0 {
		n = int64(sent+received)/4 + 1
	}
	m.Use(n)
}
