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
	"github.com/sbx-sandbox/sbx/internal/errdefs"
)

// The error codes of the API (api/openapi.yaml, ErrorBody.code).
const (
	CodeInvalidArgument      = "invalid_argument"
	CodeUnauthenticated      = "unauthenticated"
	CodePermissionDenied     = "permission_denied"
	CodeNotFound             = "not_found"
	CodeAlreadyExists        = "already_exists"
	CodeFailedPrecondition   = "failed_precondition"
	CodePayloadTooLarge      = "payload_too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeUnprocessable        = "unprocessable"
	CodeResourceExhausted    = "resource_exhausted"
	CodeInternal             = "internal"
	CodeUnavailable          = "unavailable"
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

// Unwrap gives the error's category as one of the sentinels of
// internal/errdefs, so that errors.Is(err, errdefs.ErrNotFound) holds
// within this module. Outside it, use IsNotFound and IsUnavailable, or
// errors.As and Code.
func (e *APIError) Unwrap() error {
	switch e.Code {
	case CodeInvalidArgument, CodeUnsupportedMediaType:
		return errdefs.ErrInvalidArgument
	case CodeNotFound:
		return errdefs.ErrNotFound
	case CodeAlreadyExists:
		return errdefs.ErrAlreadyExists
	case CodeFailedPrecondition:
		return errdefs.ErrFailedPrecondition
	case CodeResourceExhausted, CodePayloadTooLarge, CodeUnprocessable:
		return errdefs.ErrResourceExhausted
	case CodeUnavailable:
		return errdefs.ErrUnavailable
	}
	return nil
}

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
	e.Code = codeOf(resp.StatusCode)
	e.Message = strings.TrimSpace(string(b))
	if len(e.Message) > 200 {
		e.Message = e.Message[:200] + "..."
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

// codeOf is the code a status stands for.
func codeOf(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestedRangeNotSatisfiable, http.StatusMethodNotAllowed:
		return CodeInvalidArgument
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermissionDenied
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeFailedPrecondition
	case http.StatusRequestEntityTooLarge:
		return CodePayloadTooLarge
	case http.StatusUnsupportedMediaType:
		return CodeUnsupportedMediaType
	case http.StatusUnprocessableEntity:
		return CodeUnprocessable
	case http.StatusTooManyRequests:
		return CodeResourceExhausted
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return CodeUnavailable
	}
	return CodeInternal
}

// statusOf is the status a code stands for.
func statusOf(code string) int {
	switch code {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeAlreadyExists, CodeFailedPrecondition:
		return http.StatusConflict
	case CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeUnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	case CodeUnprocessable:
		return http.StatusUnprocessableEntity
	case CodeResourceExhausted:
		return http.StatusTooManyRequests
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
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
