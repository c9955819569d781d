package apitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
)

// sseChecker validates a stream of server-sent events as it is written,
// against a text/event-stream media type's x-sse-events (event name ->
// "#/components/schemas/NAME"), x-sse-first and x-sse-final.
type sseChecker struct {
	errorf  func(format string, args ...any)
	schemas map[string]*openapi3.Schema
	first   string
	final   []string

	line   []byte // an incomplete line
	skipLF bool   // the last write ended in CR
	event  string
	data   []string
	count  int
	ended  bool // an event of final went by
}

func newSSEChecker(m *openapi3.MediaType, doc *openapi3.T, errorf func(string, ...any)) *sseChecker {
	c := &sseChecker{errorf: errorf, schemas: map[string]*openapi3.Schema{}}
	events, _ := m.Extensions["x-sse-events"].(map[string]any)
	if len(events) == 0 {
		errorf("the contract's text/event-stream has no x-sse-events to check the events against")
	}
	for name, v := range events {
		ref, _ := v.(string)
		s := doc.Components.Schemas[strings.TrimPrefix(ref, "#/components/schemas/")]
		if s == nil || s.Value == nil {
			errorf("x-sse-events: event %q refers to %q, which is not a schema of the contract", name, ref)
			continue
		}
		c.schemas[name] = s.Value
	}
	c.first, _ = m.Extensions["x-sse-first"].(string)
	if final, ok := m.Extensions["x-sse-final"].([]any); ok {
		for _, f := range final {
			if s, ok := f.(string); ok {
				c.final = append(c.final, s)
			}
		}
	}
	return c
}

// write takes the next bytes of the stream; lines end in LF, CRLF or CR.
func (c *sseChecker) write(b []byte) {
	if c.skipLF && len(b) > 0 && b[0] == '\n' {
		b = b[1:] // the LF of a CRLF split between two writes
	}
	c.skipLF = false
	for len(b) > 0 {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			c.line = append(c.line, b...)
			return
		}
		c.line = append(c.line, b[:i]...)
		c.handleLine(string(c.line))
		c.line = c.line[:0]
		if b[i] == '\r' {
			if i+1 == len(b) {
				c.skipLF = true
			} else if b[i+1] == '\n' {
				i++
			}
		}
		b = b[i+1:]
	}
}

func (c *sseChecker) handleLine(l string) {
	if l == "" {
		c.dispatch()
		return
	}
	if l[0] == ':' {
		return // a comment: keep-alive
	}
	field, value, _ := strings.Cut(l, ":")
	value = strings.TrimPrefix(value, " ")
	switch field {
	case "event":
		c.event = value
	case "data":
		c.data = append(c.data, value)
	case "id", "retry":
	default:
		c.errorf("server-sent events: unknown field %q in line %q", field, l)
	}
}

// dispatch checks the event the lines so far make up.
func (c *sseChecker) dispatch() {
	name, data := c.event, c.data
	c.event, c.data = "", nil
	if data == nil {
		return // no data, no event
	}
	if name == "" {
		name = "message"
	}
	c.count++
	switch {
	case c.ended:
		c.errorf("event %q after the stream's final event", name)
	case c.count == 1 && c.first != "" && name != c.first:
		c.errorf("the first event is %q, want %q", name, c.first)
	}
	if slices.Contains(c.final, name) {
		c.ended = true
	}
	s := c.schemas[name]
	if s == nil {
		c.errorf("event %q is not one of the contract's events (x-sse-events)", name)
		return
	}
	var v any
	if err := json.Unmarshal([]byte(strings.Join(data, "\n")), &v); err != nil {
		c.errorf("event %q: data is not JSON: %v", name, err)
		return
	}
	if err := s.VisitJSON(v, openapi3.VisitAsResponse()); err != nil {
		c.errorf("event %q: data does not match its schema: %v", name, err)
	}
}

// finish checks the end of the stream; clientGone says whether the client
// went away, which may cut a stream short.
func (c *sseChecker) finish(clientGone bool) {
	if clientGone {
		return
	}
	if len(c.line) > 0 || c.data != nil {
		c.errorf("the stream ends in the middle of an event (%s)", fmt.Sprintf("%q", c.line))
	}
	if !c.ended && len(c.final) > 0 {
		c.errorf("the stream ended without a final event (one of %s)", strings.Join(c.final, ", "))
	}
}
