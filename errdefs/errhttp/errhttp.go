// Package errhttp translates the error categories of errdefs to HTTP
// statuses and wire codes and back: the one table the REST API, E2B's
// JSON APIs and the Go client share.
package errhttp

import (
	"context"
	"errors"
	"net/http"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// The wire codes of the REST API (api/openapi.yaml, ErrorBody.code).
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

// ToHTTP is the status and wire code of err: the narrow categories before
// the broad ones they belong to, context.DeadlineExceeded as unavailable,
// anything else internal (500).
func ToHTTP(err error) (status int, code string) {
	switch {
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized, CodeUnauthenticated
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden, CodePermissionDenied
	case errors.Is(err, errdefs.ErrTooLarge):
		return http.StatusRequestEntityTooLarge, CodePayloadTooLarge
	case errors.Is(err, errdefs.ErrUnsupportedType):
		return http.StatusUnsupportedMediaType, CodeUnsupportedMediaType
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest, CodeInvalidArgument
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound, CodeNotFound
	case errors.Is(err, errdefs.ErrAlreadyExists):
		return http.StatusConflict, CodeAlreadyExists
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict, CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusTooManyRequests, CodeResourceExhausted
	case errors.Is(err, errdefs.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, CodeUnavailable
	}
	return http.StatusInternalServerError, CodeInternal
}

// FromCode is the category a wire code stands for (nil for internal and
// codes it does not know): what a client wraps the server's answer in. A
// narrow category without a code of its own (errdefs.ErrConflict) comes
// back as its broad one (errdefs.ErrFailedPrecondition).
func FromCode(code string) error {
	switch code {
	case CodeInvalidArgument:
		return errdefs.ErrInvalidArgument
	case CodeUnsupportedMediaType:
		return errdefs.ErrUnsupportedType
	case CodeUnauthenticated:
		return errdefs.ErrUnauthenticated
	case CodePermissionDenied:
		return errdefs.ErrPermissionDenied
	case CodeNotFound:
		return errdefs.ErrNotFound
	case CodeAlreadyExists:
		return errdefs.ErrAlreadyExists
	case CodeFailedPrecondition:
		return errdefs.ErrFailedPrecondition
	case CodePayloadTooLarge:
		return errdefs.ErrTooLarge
	case CodeResourceExhausted, CodeUnprocessable:
		return errdefs.ErrResourceExhausted
	case CodeUnavailable:
		return errdefs.ErrUnavailable
	}
	return nil
}

// StatusOf is the status a wire code stands for.
func StatusOf(code string) int {
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

// CodeOf is the wire code a status stands for, for answers without the
// API's error body (a proxy's 502, a Range the file server refused).
func CodeOf(status int) string {
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
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		return CodeUnavailable
	}
	return CodeInternal
}
