package e2b

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/errdefs/errconnect"
)

// The in-sandbox daemon of E2B (envd) speaks the Connect protocol
// (connectrpc.com) with JSON payloads: a unary call is a POST of a JSON
// object answered by a JSON object, or by an error object with a fitting
// HTTP status; a server-streaming call sends and receives enveloped
// messages (flag byte, 4-byte big-endian length, JSON) and ends with an
// end-of-stream envelope (flag 0x02) that carries {} or the error.

const (
	flagEndStream  = 0x02
	flagCompressed = 0x01
	// maxMessage bounds a request message: envd's requests are small
	// (paths, a command line, environment variables).
	maxMessage = 4 << 20
)

// rpcError is a Connect error: a code from the Connect spec and a
// message.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

// message is what the client is told of err.
func message(err error) string {
	var re *rpcError
	if errors.As(err, &re) {
		return re.Message
	}
	return err.Error()
}

// connectCode maps an error to its Connect code: an rpcError says its
// own, every other error is of a category (errconnect).
func connectCode(err error) string {
	var re *rpcError
	if errors.As(err, &re) {
		return re.Code
	}
	return errconnect.Code(err)
}

// unimplemented is the error of a method sbx does not offer.
func unimplemented(format string, args ...any) error {
	return &rpcError{Code: "unimplemented", Message: fmt.Sprintf(format, args...)}
}

// readUnary decodes the JSON body of a unary call into v. Unknown fields
// are ignored, so that a newer SDK's additions do not break older calls.
func readUnary(r *http.Request, v any) error {
	if ct := mediaType(r.Header.Get("Content-Type")); ct != "application/json" && ct != "" {
		return fmt.Errorf("content type %q: this server speaks Connect with JSON (application/json): %w", ct, errdefs.ErrInvalidArgument)
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxMessage+1))
	if err != nil {
		return fmt.Errorf("reading the request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return decodeMessage(b, v)
}

func decodeMessage(b []byte, v any) error {
	if len(b) > maxMessage {
		return fmt.Errorf("request message larger than %d bytes: %w", maxMessage, errdefs.ErrInvalidArgument)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil // proto3: an empty message
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("request message: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// readStreamRequest decodes the single enveloped message of a
// server-streaming call.
func readStreamRequest(r *http.Request, v any) error {
	if ct := mediaType(r.Header.Get("Content-Type")); ct != "application/connect+json" {
		return fmt.Errorf("content type %q: a streaming call is application/connect+json: %w", ct, errdefs.ErrInvalidArgument)
	}
	flag, msg, err := readEnvelope(io.LimitReader(r.Body, maxMessage+5+1))
	if err != nil {
		return err
	}
	if flag&flagCompressed != 0 {
		return fmt.Errorf("compressed messages are not supported: %w", errdefs.ErrInvalidArgument)
	}
	return decodeMessage(msg, v)
}

// readEnvelope reads one enveloped message.
func readEnvelope(r io.Reader) (flag byte, msg []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, fmt.Errorf("request envelope: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxMessage {
		return 0, nil, fmt.Errorf("request message of %d bytes, more than %d: %w", n, maxMessage, errdefs.ErrInvalidArgument)
	}
	msg = make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return 0, nil, fmt.Errorf("request message: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return hdr[0], msg, nil
}

// envelope frames one message.
func envelope(flag byte, msg []byte) []byte {
	b := make([]byte, 5+len(msg))
	b[0] = flag
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

func mediaType(ct string) string {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

// writeUnary answers a unary call with v.
func writeUnary(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

// writeUnaryError answers a unary call with err.
func writeUnaryError(w http.ResponseWriter, err error) {
	code := connectCode(err)
	b, _ := json.Marshal(rpcError{Code: code, Message: message(err)})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(errconnect.HTTPStatus(code))
	w.Write(b)
}

// stream is the response of a server-streaming call. Send is safe for
// concurrent use (keepalives come from a timer).
type stream struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	rc   *http.ResponseController
	err  error // the first write error: the client is gone
	done bool
}

func newStream(w http.ResponseWriter) *stream {
	w.Header().Set("Content-Type", "application/connect+json")
	w.WriteHeader(http.StatusOK)
	s := &stream{w: w, rc: http.NewResponseController(w)}
	s.rc.Flush()
	return s
}

// Send writes one message and flushes it.
func (s *stream) Send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.write(0, b)
}

func (s *stream) write(flag byte, b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || s.done {
		return s.err
	}
	if _, err := s.w.Write(envelope(flag, b)); err != nil {
		s.err = err
		return err
	}
	if err := s.rc.Flush(); err != nil {
		s.err = err
	}
	return s.err
}

// End ends the stream, with err if it is not nil.
func (s *stream) End(err error) {
	var b []byte
	if err != nil {
		b, _ = json.Marshal(map[string]any{"error": rpcError{Code: connectCode(err), Message: message(err)}})
	} else {
		b = []byte("{}")
	}
	s.write(flagEndStream, b)
	s.mu.Lock()
	s.done = true
	s.mu.Unlock()
}

// connectTimeout is the deadline the client gave the call
// (Connect-Timeout-Ms), or 0.
func connectTimeout(r *http.Request) time.Duration {
	v := r.Header.Get("Connect-Timeout-Ms")
	if v == "" {
		return 0
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}
