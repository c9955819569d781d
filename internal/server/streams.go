package server

import (
	"fmt"
	"sync"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// A request that stays open (a stream, a long poll, a chat turn) holds a
// goroutine and a connection for as long as its client likes, and some
// poll the store or hold a model call on the operator's key: a tenant
// must not hold thousands. Each kind is counted apart per tenant, so that
// a tenant's event streams do not starve its executions' streams, and
// capped by a limit of --limits (streams, or chats for chat turns); past
// it the request is 429 before it does anything. Counts are this
// process's: with replicas each counts what it serves.

// streamKind is a kind of long-lived request.
type streamKind int

const (
	eventStreams streamKind = iota // GET /events, /sessions/{id}/events as SSE
	execStreams                    // execute as SSE or ?wait=true, result ?wait=true
	logFollows                     // a build's log as SSE or ?follow=true
	e2bStreams                     // E2B process Start and Connect, interpreter cells
	chatTurns                      // POST /agents/{id}/chat
)

// streamKinds name each kind and the limit that caps it.
var streamKinds = [...]struct{ name, limit string }{
	eventStreams: {"event streams", "streams"},
	execStreams:  {"execution streams and long polls", "streams"},
	logFollows:   {"build-log follows", "streams"},
	e2bStreams:   {"E2B streams", "streams"},
	chatTurns:    {"chat turns", "chats"},
}

type streamKey struct {
	tenant string
	kind   streamKind
}

// streamLimit is the tenant's cap on streams of kind (0: none).
func (s *Server) streamLimit(tenant string, kind streamKind) int {
	if s.opt.Limits == nil {
		return 0
	}
	l := s.opt.Limits(tenant)
	if kind == chatTurns {
		return l.Chats
	}
	return l.Streams
}

// openStream counts a tenant's new stream of kind, refusing one past its
// limit; release, safe to call more than once, uncounts it.
func (s *Server) openStream(tenant string, kind streamKind) (release func(), err error) {
	limit := s.streamLimit(tenant, kind)
	k := streamKey{tenant, kind}
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if limit > 0 && s.streams[k] >= limit {
		what := streamKinds[kind]
		return nil, fmt.Errorf("tenant %q: %s open at once (limit %s): %d in use, 1 more asked, the limit is %d; end one first: %w",
			tenant, what.name, what.limit, s.streams[k], limit, errdefs.ErrResourceExhausted)
	}
	s.streams[k]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.streamsMu.Lock()
			defer s.streamsMu.Unlock()
			if s.streams[k]--; s.streams[k] == 0 {
				delete(s.streams, k)
			}
		})
	}, nil
}
