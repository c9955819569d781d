package errconnect_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/errdefs/errconnect"
	"github.com/sbx-sandbox/sbx/errdefs/errhttp"
)

// A category's Connect code stands for the same HTTP status as its REST
// answer, but for the two Connect puts apart: failed_precondition, which
// ErrConflict is too (400 in Connect, 409 in REST), and the narrow file
// categories (Connect has no 413 or 415).
func TestCodes(t *testing.T) {
	for cat, want := range map[error]string{
		errdefs.ErrNotFound: "not_found", errdefs.ErrAlreadyExists: "already_exists",
		errdefs.ErrInvalidArgument: "invalid_argument", errdefs.ErrFailedPrecondition: "failed_precondition",
		errdefs.ErrUnavailable: "unavailable", errdefs.ErrResourceExhausted: "resource_exhausted",
		errdefs.ErrUnauthenticated: "unauthenticated", errdefs.ErrPermissionDenied: "permission_denied",
		errdefs.ErrTooLarge: "resource_exhausted", errdefs.ErrUnsupportedType: "invalid_argument",
		errdefs.ErrConflict: "failed_precondition", context.Canceled: "canceled",
		context.DeadlineExceeded: "deadline_exceeded", errors.New("x"): "internal",
	} {
		code := errconnect.Code(fmt.Errorf("wrapped: %w", cat))
		if code != want {
			t.Errorf("%v: %s, want %s", cat, code, want)
		}
		rest, _ := errhttp.ToHTTP(cat)
		switch {
		case cat == errdefs.ErrFailedPrecondition, cat == errdefs.ErrConflict,
			cat == errdefs.ErrTooLarge, cat == errdefs.ErrUnsupportedType,
			cat == context.Canceled, cat == context.DeadlineExceeded:
		case errconnect.HTTPStatus(code) != rest:
			t.Errorf("%v: Connect status %d, REST %d", cat, errconnect.HTTPStatus(code), rest)
		}
	}
}
