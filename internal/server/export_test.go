package server

// What the tests of the stream caps (streams_test.go) reach inside.

// StreamKind is a kind of long-lived request.
type StreamKind = streamKind

// The kinds.
const (
	EventStreams = eventStreams
	ExecStreams  = execStreams
	LogFollows   = logFollows
	E2BStreams   = e2bStreams
	ChatTurns    = chatTurns
)

// OpenStream takes one of the tenant's slots of kind, as a request does.
func (s *Server) OpenStream(tenant string, kind StreamKind) (release func(), err error) {
	return s.openStream(tenant, kind)
}

// OpenStreams is how many streams are counted open, of every tenant and
// kind.
func (s *Server) OpenStreams() int {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	n := 0
	for _, c := range s.streams {
		n += c
	}
	return n
}
