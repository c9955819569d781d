package execution

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sbx-sandbox/sbx/api"
)

// What an execution's record keeps. A request may carry 8
// MiB of code and 16 MiB of event, a result 16 MiB of return value and
// the sandbox's output; kept whole, a tenant's history (1,000 executions
// in each of 10,000 sessions) could fill the host's disk through the
// metadata store. So a record keeps:
//
//   - of the request, what identifies it: the code's first 4 KiB, its
//     size and SHA-256, the event if it is small (else its size), the
//     names of the environment variables (never their values). Nothing
//     reads a request back; it is there for whoever looks at the store.
//   - of the result, what GET /executions/{id}/result answers: stdout and
//     stderr up to 1 MiB each (the executor's own default cap), the
//     return value if it is at most 1 MiB, the error's message and
//     traceback up to 64 KiB each, artifacts up to 64 KiB of paths. What
//     is cut is named in the result's "truncated", with its full size.
//
// The answer to the request that ran it (?wait=true, the stream's result
// event, a GET while it runs) has the whole result. Sizes are of the
// record as stored (JSON), so a record is at most MaxRecordBytes however
// its output escapes; and every tenant's records together are held to its
// history_size (Sessions.Limits(tenant).HistoryMB) by deleting its oldest finished
// ones (keepHistorySize).
const (
	maxStoredCode      = 4 << 10
	maxStoredEvent     = 4 << 10
	maxStoredEnvNames  = 4 << 10
	maxStoredOutput    = 1 << 20
	maxStoredReturn    = 1 << 20
	maxStoredError     = 64 << 10
	maxStoredErrorType = 256
	maxStoredArtifacts = 64 << 10
	// MaxRecordBytes bounds one execution's record, request and result
	// together: the caps above and room for the fields around them.
	MaxRecordBytes = 4 << 20
)

// storedRequest is what the store keeps of a request.
type storedRequest struct {
	Code       string          `json:"code"`
	CodeBytes  int             `json:"code_bytes"`
	CodeSHA256 string          `json:"code_sha256"`
	Language   string          `json:"language"`
	TimeoutMs  int64           `json:"timeout_ms"`
	Event      json.RawMessage `json:"event,omitempty"`
	EventBytes int             `json:"event_bytes,omitempty"`
	EnvNames   []string        `json:"env_names,omitempty"`
}

// requestRecord is the record of a request: its code's start, sizes and
// hash, a small event, the variables' names.
func requestRecord(req api.ExecuteRequest, language string, timeoutMs int64) json.RawMessage {
	sum := sha256.Sum256([]byte(req.Code))
	code, _ := cutJSON(req.Code, maxStoredCode)
	r := storedRequest{
		Code: code, CodeBytes: len(req.Code), CodeSHA256: hex.EncodeToString(sum[:]),
		Language: language, TimeoutMs: timeoutMs,
	}
	if len(req.Event) > 0 {
		r.EventBytes = len(req.Event)
		if len(req.Event) <= maxStoredEvent {
			r.Event = req.Event
		}
	}
	left := maxStoredEnvNames
	for k := range req.EnvVars {
		if left -= len(k) + 3; left < 0 { // the name, quoted, and a comma
			break
		}
		r.EnvNames = append(r.EnvNames, k)
	}
	return marshalRecord(r)
}

// resultRecord is the record of a result: x with what passes the caps
// cut, and named in Truncated.
func resultRecord(x *api.Execution) json.RawMessage {
	c := *x
	cut := map[string]int64{}
	str := func(name string, s *string, max int) {
		if t, ok := cutJSON(*s, max); ok {
			cut[name] = int64(len(*s))
			*s = t
		}
	}
	str("stdout", &c.Stdout, maxStoredOutput)
	str("stderr", &c.Stderr, maxStoredOutput)
	if len(c.ReturnValue) > maxStoredReturn {
		cut["return_value"] = int64(len(c.ReturnValue))
		c.ReturnValue = nil
	}
	if x.Error != nil {
		e := *x.Error
		str("error.type", &e.Type, maxStoredErrorType)
		str("error.message", &e.Message, maxStoredError)
		str("error.traceback", &e.Traceback, maxStoredError)
		c.Error = &e
	}
	left := maxStoredArtifacts
	for i, a := range c.Artifacts {
		if left -= jsonLen(a) + 1; left < 0 {
			cut["artifacts"] = int64(len(c.Artifacts))
			c.Artifacts = c.Artifacts[:i]
			break
		}
	}
	for k, v := range x.Truncated { // a record read back and written again
		cut[k] = v
	}
	if len(cut) > 0 {
		c.Truncated = cut
	}
	return marshalRecord(c)
}

// marshalRecord is v as the store keeps it: JSON without HTML escapes, so
// that "<" in an output takes one byte, as cutJSON counts it.
func marshalRecord(v any) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// cutJSON returns the longest start of s, cut between characters, whose
// JSON string (quotes excepted) takes at most max bytes, and whether it
// had to cut.
func cutJSON(s string, max int) (string, bool) {
	if len(s) <= max/6 { // every character takes at most six times its bytes
		return s, false
	}
	n := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if n += runeJSONLen(r, size); n > max {
			return s[:i], true
		}
		i += size
	}
	return s, false
}

// jsonLen is what s takes as a JSON string, quotes included.
func jsonLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		n += runeJSONLen(r, size)
		i += size
	}
	return n
}

// runeJSONLen is what the character r (size bytes of a string) takes in
// a JSON string written without HTML escapes, at most.
func runeJSONLen(r rune, size int) int {
	switch {
	case r == utf8.RuneError && size == 1:
		return 6 // \ufffd
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20:
		return 6 // \u00XX (or \b, \f: two)
	case r == '\u2028' || r == '\u2029':
		return 6
	}
	return size
}

// historySizes holds each tenant's records to its history_size: what this
// process knows of the bytes they take, from the store's last count and
// what it wrote since.
type historySizes struct {
	mu sync.Mutex
	t  map[string]*historySize
}

type historySize struct {
	bytes    int64 // -1: not counted yet
	counting bool
	during   int64 // written while a count was under way
}

// keepHistorySize counts a tenant's new record of added bytes and, when
// the tenant may be past its history_size, has the store count its
// records and delete the oldest finished ones past it. The store reads
// every record's size to count, so it is asked once per tenant per
// process, and then only when what this process wrote may have taken the
// tenant past its bound; then it trims to three quarters of it, so that
// the next count waits for a quarter of the bound. Deletions elsewhere
// (sessions, the per-session history) only make the estimate high: the
// next count comes sooner. With several replicas each counts what it
// writes: the store may hold up to the bound once per replica between two
// counts.
func (s *Service) keepHistorySize(tenant string, added int64) {
	limit := s.opt.Sessions.Limits(tenant).HistoryMB << 20
	if limit <= 0 {
		return
	}
	h := &s.hist
	h.mu.Lock()
	if h.t == nil {
		h.t = map[string]*historySize{}
	}
	e := h.t[tenant]
	if e == nil {
		e = &historySize{bytes: -1}
		h.t[tenant] = e
	}
	if e.counting {
		e.during += added
		h.mu.Unlock()
		return
	}
	known := e.bytes >= 0
	if known {
		if e.bytes += added; e.bytes <= limit {
			h.mu.Unlock()
			return
		}
	}
	e.counting, e.during = true, 0
	h.mu.Unlock()

	keep := limit
	if known {
		keep = limit / 4 * 3
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	removed, kept, err := s.opt.Store.TrimTenantExecutions(ctx, tenant, keep)
	cancel()
	h.mu.Lock()
	e.counting = false
	if err != nil {
		e.bytes = -1 // counted again next time
	} else {
		e.bytes = kept + e.during
	}
	h.mu.Unlock()
	switch {
	case err != nil:
		s.log.Warn("holding a tenant's execution history to its size", "tenant", tenant, "err", err)
	case removed > 0:
		s.log.Info("a tenant's execution history at its size: the oldest went", "tenant", tenant, "removed", removed,
			"kept_bytes", kept, "history_size_bytes", limit)
	}
}
