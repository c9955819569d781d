package server

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs/errhttp"
)

// statusError is an error that must reach the client with a status more
// precise than its category gives (422 of uploads).
type statusError struct {
	status int
	code   string
	err    error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

func withStatus(status int, code string, err error) error {
	return &statusError{status: status, code: code, err: err}
}

// retryError is a 429 or 503 that knows when to try again, better than
// the default Retry-After of 5 s.
type retryError struct {
	after time.Duration
	err   error
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

func retryAfter(err error, after time.Duration) error { return &retryError{after: after, err: err} }

// status maps an error to its HTTP status and wire code: a statusError
// says its own, every other error is of a category (errhttp).
func status(err error) (int, string) {
	var se *statusError
	if errors.As(err, &se) {
		return se.status, se.code
	}
	return errhttp.ToHTTP(err)
}

// writeError answers with {"error":{"code","message"}}. Internal errors
// are logged with the request id and shown without their details.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code, name := status(err)
	msg := err.Error()
	// A client that went away mid-request (left a page, say) reads no
	// answer, and nothing failed that the log should show as an error.
	gone := r.Context().Err() != nil && errors.Is(err, context.Canceled)
	switch {
	case gone:
		s.log.Debug("request cancelled by its client", "request_id", requestID(r.Context()), "path", r.URL.Path)
	case code == http.StatusInternalServerError:
		s.log.Error("internal error", "request_id", requestID(r.Context()), "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if code == http.StatusInternalServerError {
		msg = "internal error (request " + requestID(r.Context()) + "; the server log has the details)"
	}
	if code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests {
		after := "5"
		var re *retryError
		if errors.As(err, &re) {
			after = strconv.Itoa(max(1, int(math.Ceil(re.after.Seconds()))))
		}
		w.Header().Set("Retry-After", after)
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sbx"`)
	}
	s.opt.Metrics.apiErrors.WithLabelValues(name).Inc()
	writeJSON(w, code, api.Error{Error: api.ErrorBody{Code: name, Message: msg}})
}
