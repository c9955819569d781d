package errhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/errdefs/errhttp"
)

// Every category goes to the wire and comes back as itself (or, for a
// narrow one without a code of its own, as its broad one), and the
// status a code stands for is the status it went out with.
func TestRoundTrip(t *testing.T) {
	for _, cat := range []error{
		errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrInvalidArgument,
		errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrResourceExhausted,
		errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied, errdefs.ErrTooLarge, errdefs.ErrUnsupportedType,
		errdefs.ErrConflict,
	} {
		err := fmt.Errorf("session %q: %w", "s", cat)
		status, code := errhttp.ToHTTP(err)
		want := cat
		if cat == errdefs.ErrConflict {
			want = errdefs.ErrFailedPrecondition
			if status != http.StatusConflict || code != errhttp.CodeFailedPrecondition {
				t.Errorf("%v: %d %s, want 409 %s", cat, status, code, errhttp.CodeFailedPrecondition)
			}
		}
		if back := errhttp.FromCode(code); !errors.Is(back, want) {
			t.Errorf("%v: code %s comes back as %v", cat, code, back)
		}
		if errhttp.StatusOf(code) != status || errhttp.CodeOf(status) != code && status != http.StatusConflict {
			t.Errorf("%v: %d %s, StatusOf %d, CodeOf %s", cat, status, code, errhttp.StatusOf(code), errhttp.CodeOf(status))
		}
	}
	// The narrow categories keep their broad ones.
	if !errors.Is(errhttp.FromCode(errhttp.CodePayloadTooLarge), errdefs.ErrResourceExhausted) ||
		!errors.Is(errhttp.FromCode(errhttp.CodeUnsupportedMediaType), errdefs.ErrInvalidArgument) {
		t.Error("a narrow category lost its broad one")
	}
	if s, c := errhttp.ToHTTP(context.DeadlineExceeded); s != 503 || c != errhttp.CodeUnavailable {
		t.Errorf("deadline: %d %s", s, c)
	}
	if s, c := errhttp.ToHTTP(errors.New("boom")); s != 500 || c != errhttp.CodeInternal || errhttp.FromCode(c) != nil {
		t.Errorf("uncategorized: %d %s", s, c)
	}
}
