package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// A conversation's history is one document of the store (kind
// "conversation"), per tenant, keyed by user, agent and conversation. It
// is bounded when a turn is added:
//   - the last HistoryTurns turns are kept whole while, with the summary,
//     they fit HistoryTokens (tokens estimated as bytes / 4; the last turn
//     is always kept); the turns before them are folded into the summary,
//     which the model writes (one call without streaming, given the old
//     summary and the turns to fold);
//   - what a message keeps is cut: a tool's result to 4 KiB, the user's and
//     the assistant's text to 32 KiB, a tool call's arguments over 16 KiB
//     are left out;
//   - the document stays under the store's 1 MiB: past 900 KiB the oldest
//     turns go without a summary (the summary says how many).
//
// A turn is added by a compare-and-swap on the document's revision; a
// turn of another chat on the same conversation that was added first is
// read again and this one goes after it, so two chats at once both keep
// their turns, in the order they end.

// DocumentKind is the kind of the conversations' documents.
const DocumentKind = "conversation"

// Bounds of what the history keeps.
const (
	keptToolResult = 4 << 10
	keptText       = 32 << 10
	keptArguments  = 16 << 10
	maxSummary     = 8 << 10
	maxDocument    = 900 << 10
	// summarizeInput bounds what one summary call is given: each message
	// cut to summarizeMessage, and the newest part of the whole.
	summarizeMessage = 2 << 10
	summarizeInput   = 96 << 10
	historyTimeout   = 2 * time.Minute
	keepTries        = 8
)

// conversation is the document's value.
type conversation struct {
	// Summary is what the model made of the turns folded into it, of
	// which there are Summarized (and Dropped went without one).
	Summary    string       `json:"summary,omitempty"`
	Summarized int          `json:"summarized,omitempty"`
	Dropped    int          `json:"dropped,omitempty"`
	Turns      []turnRecord `json:"turns"`
}

// turnRecord is one kept turn: the user's message and what followed.
type turnRecord struct {
	At       time.Time `json:"at"`
	Messages []message `json:"messages"`
}

// Key is the document key of a conversation: user, agent and conversation
// ids, each escaped, so that no two triples share a key.
func Key(userID, agentID, conversationID string) (string, error) {
	k := url.PathEscape(userID) + "/" + url.PathEscape(agentID) + "/" + url.PathEscape(conversationID)
	if userID == "" || agentID == "" || conversationID == "" || len(k) > store.MaxDocumentKey {
		return "", fmt.Errorf("conversation %q of user %q and agent %q: ids must be given, and together at most %d bytes: %w",
			conversationID, userID, agentID, store.MaxDocumentKey, errdefs.ErrInvalidArgument)
	}
	return k, nil
}

// load reads a conversation: an empty one, at revision 0, if it has none.
func (c *Chat) load(ctx context.Context, req Request) (*conversation, int64, error) {
	key, err := Key(req.UserID, req.AgentID, req.ConversationID)
	if err != nil {
		return nil, 0, err
	}
	d, err := c.docs.GetDocument(ctx, DocumentKind, req.Tenant, key)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &conversation{}, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var conv conversation
	if err := json.Unmarshal(d.Value, &conv); err != nil {
		return nil, 0, fmt.Errorf("conversation %s: %w", key, err)
	}
	return &conv, d.Revision, nil
}

// Forget deletes a conversation's history from docs; one without any is
// no error. It needs no model endpoint.
func Forget(ctx context.Context, docs Documents, tenant, userID, agentID, conversationID string) error {
	key, err := Key(userID, agentID, conversationID)
	if err != nil {
		return err
	}
	if err := docs.DeleteDocument(ctx, DocumentKind, tenant, key, 0); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	return nil
}

// keep adds a turn's messages to its conversation, bounding it, and
// returns the tokens a summary took.
func (c *Chat) keep(ctx context.Context, req Request, model string, msgs []message) (api.ChatUsage, error) {
	key, err := Key(req.UserID, req.AgentID, req.ConversationID)
	if err != nil {
		return api.ChatUsage{}, err
	}
	t := turnRecord{At: time.Now().UTC(), Messages: make([]message, len(msgs))}
	for i, m := range msgs {
		t.Messages[i] = kept(m)
	}
	var usage api.ChatUsage
	for range keepTries {
		conv, rev, err := c.load(ctx, req)
		if err != nil {
			return usage, err
		}
		conv.Turns = append(conv.Turns, t)
		usage = addUsage(usage, c.bound(ctx, model, conv))
		value, err := json.Marshal(conv)
		if err != nil {
			return usage, err
		}
		err = c.docs.PutDocument(ctx, &store.Document{Kind: DocumentKind, Tenant: req.Tenant, Key: key, Value: value, Revision: rev})
		if errors.Is(err, errdefs.ErrConflict) || errors.Is(err, errdefs.ErrAlreadyExists) || (rev > 0 && errors.Is(err, errdefs.ErrNotFound)) {
			continue // another turn came first, or a forget: read it again
		}
		return usage, err
	}
	return usage, fmt.Errorf("conversation %s: written by others %d times while this turn was added: %w", key, keepTries, errdefs.ErrConflict)
}

// kept is what the history keeps of a message.
func kept(m message) message {
	switch m.Role {
	case roleTool:
		m.Content = cut(m.Content, keptToolResult)
	default:
		m.Content = cut(m.Content, keptText)
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]toolCall, len(m.ToolCalls))
		for i, tc := range m.ToolCalls {
			if len(tc.Arguments) > keptArguments {
				b, _ := json.Marshal(map[string]string{"omitted": fmt.Sprintf("the %d bytes of these arguments are not kept in the history", len(tc.Arguments))})
				tc.Arguments = string(b)
			}
			calls[i] = tc
		}
		m.ToolCalls = calls
	}
	return m
}

// tokens estimates the tokens of the kept part of a conversation.
func tokens(summary string, turns []turnRecord) int {
	n := len(summary)
	for _, t := range turns {
		for _, m := range t.Messages {
			n += len(m.Content) + 16
			for _, tc := range m.ToolCalls {
				n += len(tc.ID) + len(tc.Name) + len(tc.Arguments) + 16
			}
		}
	}
	return n / 4
}

// bound folds the turns the history does not keep whole into the summary
// and returns the tokens the summary call took. If that call fails, the
// turns go without one (the summary says so): the history stays bounded.
func (c *Chat) bound(ctx context.Context, model string, conv *conversation) api.ChatUsage {
	fold := max(0, len(conv.Turns)-c.cfg.HistoryTurns)
	for fold < len(conv.Turns)-1 && tokens(conv.Summary, conv.Turns[fold:]) > c.cfg.HistoryTokens {
		fold++
	}
	var usage api.ChatUsage
	if fold > 0 {
		summary, u, err := c.summarize(ctx, model, conv.Summary, conv.Turns[:fold])
		usage = u
		if err != nil {
			c.log.Warn("chat: summarizing a conversation's older turns failed; they are dropped", "turns", fold, "err", err)
			conv.Dropped += fold
		} else {
			conv.Summary = cut(summary, maxSummary)
			conv.Summarized += fold
		}
		conv.Turns = conv.Turns[fold:]
	}
	for len(conv.Turns) > 1 {
		b, _ := json.Marshal(conv)
		if len(b) <= maxDocument {
			break
		}
		conv.Turns = conv.Turns[1:]
		conv.Dropped++
	}
	return usage
}

// summarizeSystem asks for the summary the history keeps.
const summarizeSystem = "You keep the memory of a conversation between a user and an AI assistant that runs code and reads files " +
	"in a sandbox for the user. Write a summary of the conversation for the assistant's later turns: what the user wants, " +
	"what was decided and found, the files made or read (with their paths), numbers that matter, and what is still open. " +
	"Be brief: at most 300 words. Write only the summary."

// summarize asks the model for a summary of the old one and turns.
func (c *Chat) summarize(ctx context.Context, model, old string, turns []turnRecord) (string, api.ChatUsage, error) {
	var b strings.Builder
	for _, t := range turns {
		for _, m := range t.Messages {
			switch m.Role {
			case roleUser:
				fmt.Fprintf(&b, "User: %s\n", cut(m.Content, summarizeMessage))
			case roleAssistant:
				if m.Content != "" {
					fmt.Fprintf(&b, "Assistant: %s\n", cut(m.Content, summarizeMessage))
				}
				for _, tc := range m.ToolCalls {
					fmt.Fprintf(&b, "Assistant called %s(%s)\n", tc.Name, cut(tc.Arguments, summarizeMessage))
				}
			case roleTool:
				what := "Result"
				if m.IsError {
					what = "Error"
				}
				fmt.Fprintf(&b, "%s of %s: %s\n", what, m.Name, cut(m.Content, summarizeMessage))
			}
		}
	}
	part := b.String()
	if len(part) > summarizeInput {
		i := len(part) - summarizeInput
		for i < len(part) && !utf8.RuneStart(part[i]) {
			i++
		}
		part = "[... the start is left out]\n" + part[i:]
	}
	if old == "" {
		old = "(none: this is the start)"
	}
	text, u, err := c.complete(ctx, model, []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage(summarizeSystem),
		openai.UserMessage("The summary so far:\n" + old + "\n\nThe part of the conversation to add to it:\n" + part),
	})
	if err == nil && strings.TrimSpace(text) == "" {
		err = errors.New("the model wrote an empty summary")
	}
	return strings.TrimSpace(text), u, err
}
