// Package errconnect translates the error categories of errdefs to
// Connect error codes and those to HTTP statuses, as the Connect protocol
// has them: the table of E2B's envd APIs.
package errconnect

import (
	"context"
	"errors"
	"net/http"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Code is the Connect code of err: the narrow categories before the broad
// ones, context.Canceled and DeadlineExceeded as Connect has them,
// anything else internal.
func Code(err error) string {
	switch {
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return "unauthenticated"
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return "permission_denied"
	case errors.Is(err, errdefs.ErrNotFound):
		return "not_found"
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, errdefs.ErrAlreadyExists):
		return "already_exists"
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return "failed_precondition"
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return "resource_exhausted"
	case errors.Is(err, errdefs.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	return "internal"
}

// HTTPStatus is the HTTP status of a unary call that failed with code.
func HTTPStatus(code string) int {
	switch code {
	case "canceled":
		return 499
	case "invalid_argument", "failed_precondition", "out_of_range":
		return http.StatusBadRequest
	case "deadline_exceeded":
		return http.StatusGatewayTimeout
	case "not_found":
		return http.StatusNotFound
	case "already_exists", "aborted":
		return http.StatusConflict
	case "permission_denied":
		return http.StatusForbidden
	case "resource_exhausted":
		return http.StatusTooManyRequests
	case "unimplemented":
		return http.StatusNotImplemented
	case "unavailable":
		return http.StatusServiceUnavailable
	case "unauthenticated":
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}
