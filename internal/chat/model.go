package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"

	"github.com/sbx-sandbox/sbx/api"
)

// The model's side of a turn, over the OpenAI SDK: the prompt made from
// the history, one streamed call, and the errors of the endpoint as a
// person can read them.

// Roles of the messages of a conversation.
const (
	roleUser      = "user"
	roleAssistant = "assistant"
	roleTool      = "tool"
)

// message is one message of a conversation, as the history keeps it.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content,omitempty"`
	// ToolCalls are an assistant message's calls.
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
	// ToolCallID, Name and IsError are a tool message's: the call it
	// answers, the tool, and whether it failed.
	ToolCallID string `json:"tool_call_id,omitempty"`
	Name       string `json:"name,omitempty"`
	IsError    bool   `json:"is_error,omitempty"`
}

// toolCall is one tool call of the model.
type toolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// prompt is what the model is sent: the system prompt (with the summary
// of the older turns), the kept turns, and this turn so far.
func (c *Chat) prompt(system string, conv *conversation, msgs []message) []openai.ChatCompletionMessageParamUnion {
	if system == "" {
		system = DefaultSystem
	}
	// One system message, first: some servers' chat templates take no
	// other.
	if conv.Summary != "" {
		system += "\n\nA summary of the conversation's earlier part:\n" + conv.Summary
	}
	if conv.Dropped > 0 {
		system += fmt.Sprintf("\n\n(%d earlier turns of the conversation are forgotten.)", conv.Dropped)
	}
	out := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system)}
	for _, t := range conv.Turns {
		for _, m := range t.Messages {
			out = append(out, m.param())
		}
	}
	for _, m := range msgs {
		out = append(out, m.param())
	}
	return out
}

func (m message) param() openai.ChatCompletionMessageParamUnion {
	switch m.Role {
	case roleAssistant:
		a := openai.ChatCompletionAssistantMessageParam{}
		if m.Content != "" || len(m.ToolCalls) == 0 {
			a.Content.OfString = openai.String(m.Content)
		}
		for _, tc := range m.ToolCalls {
			a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
					ID:       tc.ID,
					Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: tc.Name, Arguments: tc.Arguments},
				},
			})
		}
		return openai.ChatCompletionMessageParamUnion{OfAssistant: &a}
	case roleTool:
		return openai.ToolMessage(m.Content, m.ToolCallID)
	default:
		return openai.UserMessage(m.Content)
	}
}

// toolParams are the tools' definitions for a request.
func toolParams(defs []api.Tool) []openai.ChatCompletionToolUnionParam {
	out := make([]openai.ChatCompletionToolUnionParam, 0, len(defs))
	for _, d := range defs {
		var params shared.FunctionParameters
		if err := json.Unmarshal(d.Function.Parameters, &params); err != nil {
			panic("chat: tool " + d.Function.Name + ": parameters are not a JSON object: " + err.Error())
		}
		out = append(out, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: d.Function.Name, Description: openai.String(d.Function.Description), Parameters: params,
		}))
	}
	return out
}

// stepResult is one model call's answer.
type stepResult struct {
	content string
	// toolCalls by the index the stream gave them.
	toolCalls map[int64]*toolCall
	finish    string
	usage     api.ChatUsage
}

// calls are the tool calls in the order of their indexes, each with an
// id (made up if the model gave none).
func (r *stepResult) calls(step int) []toolCall {
	idx := make([]int64, 0, len(r.toolCalls))
	for i := range r.toolCalls {
		idx = append(idx, i)
	}
	sort.Slice(idx, func(a, b int) bool { return idx[a] < idx[b] })
	out := make([]toolCall, 0, len(idx))
	for n, i := range idx {
		tc := *r.toolCalls[i]
		if tc.ID == "" {
			tc.ID = fmt.Sprintf("call_%d_%d", step, n)
		}
		out = append(out, tc)
	}
	return out
}

// sanitized are calls as they go back to the model in the history:
// arguments that are not JSON become {} (the tool's error result quotes
// them), since some endpoints refuse a request whose history holds them.
func sanitized(calls []toolCall) []toolCall {
	out := make([]toolCall, len(calls))
	for i, c := range calls {
		if !json.Valid([]byte(c.Arguments)) {
			c.Arguments = "{}"
		}
		out[i] = c
	}
	return out
}

// step makes one streamed model call, calling delta with each piece of
// text as it comes. A stream that ends before the model said why it
// stopped (finish_reason) is an error: the connection was cut.
func (c *Chat) step(ctx context.Context, model string, msgs []openai.ChatCompletionMessageParamUnion, tools []openai.ChatCompletionToolUnionParam, delta func(string)) (stepResult, error) {
	res := stepResult{toolCalls: map[int64]*toolCall{}}
	stream := c.llm.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: model, Messages: msgs, Tools: tools,
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer stream.Close()
	var text strings.Builder
	defer func() {
		// Every call counts against the tenant's tokens, one that failed
		// or was cut short too.
		received := text.Len()
		for _, tc := range res.toolCalls {
			received += len(tc.Name) + len(tc.Arguments)
		}
		use(ctx, res.usage, paramBytes(msgs, tools), received)
	}()
	for stream.Next() {
		chunk := stream.Current()
		if chunk.JSON.Usage.Valid() {
			res.usage = addUsage(res.usage, api.ChatUsage{
				PromptTokens: chunk.Usage.PromptTokens, CompletionTokens: chunk.Usage.CompletionTokens, TotalTokens: chunk.Usage.TotalTokens,
			})
		}
		for _, ch := range chunk.Choices {
			if ch.Index != 0 {
				continue // one choice asked for (n is 1)
			}
			d := ch.Delta
			if s := d.Content + d.Refusal; s != "" {
				text.WriteString(s)
				delta(s)
			}
			for _, f := range d.ToolCalls {
				i := f.Index
				if i < 0 {
					i = 0 // some servers number a lone call -1
				}
				tc := res.toolCalls[i]
				if tc == nil {
					if len(res.toolCalls) >= maxToolCalls {
						return res, fmt.Errorf("the model made more than %d tool calls in one answer", maxToolCalls)
					}
					tc = &toolCall{}
					res.toolCalls[i] = tc
				}
				if f.ID != "" {
					tc.ID = f.ID
				}
				// The name comes whole in the first fragment; a server
				// that repeats it in the next ones does not double it.
				if f.Function.Name != tc.Name {
					tc.Name += f.Function.Name
				}
				tc.Arguments += f.Function.Arguments
			}
			if ch.FinishReason != "" {
				res.finish = ch.FinishReason
			}
		}
	}
	res.content = text.String()
	if err := stream.Err(); err != nil {
		return res, err
	}
	if res.finish == "" {
		return res, errCut
	}
	return res, nil
}

// maxToolCalls bounds the tool calls of one answer.
const maxToolCalls = 64

// errCut is a stream that ended without saying why the model stopped.
var errCut = errors.New("the model's stream ended before the model had finished (no finish_reason): it was cut short")

// complete makes one call without streaming and returns the text.
func (c *Chat) complete(ctx context.Context, model string, msgs []openai.ChatCompletionMessageParamUnion) (string, api.ChatUsage, error) {
	res, err := c.llm.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs})
	if err != nil {
		use(ctx, api.ChatUsage{}, paramBytes(msgs, nil), 0)
		return "", api.ChatUsage{}, err
	}
	u := api.ChatUsage{PromptTokens: res.Usage.PromptTokens, CompletionTokens: res.Usage.CompletionTokens, TotalTokens: res.Usage.TotalTokens}
	received := 0
	for _, ch := range res.Choices {
		received += len(ch.Message.Content)
	}
	use(ctx, u, paramBytes(msgs, nil), received)
	if len(res.Choices) == 0 {
		return "", u, errors.New("the model's answer has no choices")
	}
	return res.Choices[0].Message.Content, u, nil
}

// llmDetail is all an endpoint's error says, for the server's log (never
// the user): its status, URL and message, or the error in its stream.
func llmDetail(err error) string {
	var ae *openai.Error
	var se *ssestream.StreamError
	switch {
	case errors.As(err, &ae):
		url := ""
		if ae.Request != nil && ae.Request.URL != nil {
			url = ae.Request.URL.Redacted()
		}
		body := cut(ae.RawJSON(), 2000)
		if ae.StatusCode == http.StatusUnauthorized || ae.StatusCode == http.StatusForbidden {
			body = "(not logged: a refusal of the key may quote part of it)"
		}
		return fmt.Sprintf("%s: %d %s: %s", url, ae.StatusCode, http.StatusText(ae.StatusCode), body)
	case errors.As(err, &se):
		return fmt.Sprintf("an error in the stream: %s: %s", se.Message, cut(string(se.Event.Data), 2000))
	}
	return err.Error()
}

// paramBytes is the size of what a model call sends, for a token
// estimate when the endpoint counts none.
func paramBytes(msgs []openai.ChatCompletionMessageParamUnion, tools []openai.ChatCompletionToolUnionParam) int {
	b, _ := json.Marshal(msgs)
	n := len(b)
	if len(tools) > 0 {
		b, _ = json.Marshal(tools)
		n += len(b)
	}
	return n
}

// llmError says what went wrong with the endpoint, for the user, in
// words of the server's own: never the endpoint's text or its URL (the
// log has those), which may name the operator's hosts and accounts or
// quote part of its key.
func llmError(err error) string {
	var ae *openai.Error
	var se *ssestream.StreamError
	switch {
	case errors.As(err, &ae):
		msg := fmt.Sprintf("the model endpoint answered %d %s", ae.StatusCode, http.StatusText(ae.StatusCode))
		if ae.StatusCode == http.StatusUnauthorized || ae.StatusCode == http.StatusForbidden {
			msg += ": it refused the server's API key (--llm-api-key)"
		}
		return msg
	case errors.As(err, &se):
		return "the model endpoint sent an error in its stream"
	case errors.Is(err, errCut):
		return err.Error()
	}
	return "the model endpoint could not be reached, or its stream broke off"
}
