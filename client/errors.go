package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/errdefs/errhttp"
)

// The error codes of the API (api/openapi.yaml, ErrorBody.code).
const (
	CodeInvalidArgument      = errhttp.CodeInvalidArgument
	CodeUnauthenticated      = errhttp.CodeUnauthenticated
	CodePermissionDenied     = errhttp.CodePermissionDenied
	CodeNotFound             = errhttp.CodeNotFound
	CodeAlreadyExists        = errhttp.CodeAlreadyExists
	CodeFailedPrecondition   = errhttp.CodeFailedPrecondition
	CodePayloadTooLarge      = errhttp.CodePayloadTooLarge
	CodeUnsupportedMediaType = errhttp.CodeUnsupportedMediaType
	CodeUnprocessable        = errhttp.CodeUnprocessable
	CodeResourceExhausted    = errhttp.CodeResourceExhausted
	CodeInternal             = errhttp.CodeInternal
	CodeUnavailable          = errhttp.CodeUnavailable
)

// APIError is an error the server answered with.
type APIError struct {
	// StatusCode is the HTTP status. For an error event of a stream (which
	// arrives with 200) it is the status that Code stands for.
	StatusCode int
	// Code is the error's category, one of the Code constants; for an
	// answer without the API's error body, the one its status stands for.
	Code    string
	Message string
	// RetryAfter is how long the server asked to wait before trying again
	// (429, 503); zero if it did not say.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	return fmt.Sprintf("sbx: %d %s: %s", e.StatusCode, e.Code, e.Message)
}

// Unwrap gives the error's category, one of the sentinels of errdefs
// (errhttp.FromCode), so that errors.Is(err, errdefs.ErrNotFound) holds.
func (e *APIError) Unwrap() error { return errhttp.FromCode(e.Code) }

// IsNotFound reports whether err says that the session, execution or file
// does not exist.
func IsNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }

// IsUnavailable reports whether err is the server saying it cannot do it
// now (no sandbox can be had, say): the request may succeed when repeated
// after the error's RetryAfter.
func IsUnavailable(err error) bool { return errors.Is(err, errdefs.ErrUnavailable) }

// readError makes the error of a response whose status is not the one
// wanted.
func readError(resp *http.Response) *APIError {
	e := &APIError{StatusCode: resp.StatusCode, RetryAfter: retryAfter(resp.Header.Get("Retry-After"))}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body api.Error
	if err := json.Unmarshal(b, &body); err == nil && body.Error.Code != "" {
		e.Code, e.Message = body.Error.Code, body.Error.Message
		return e
	}
	// Not the API's error body: a proxy's page, say, or a Range refused by
	// the file server.
	e.Code = errhttp.CodeOf(resp.StatusCode)
	e.Message = strings.TrimSpace(string(b))
	if len(e.Message) > 200 {
		e.Message = e.Message[:200] + "..."
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

// retryAfter reads a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}
