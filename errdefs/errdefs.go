// Package errdefs holds the few error categories every layer of sbx wraps
// its errors in. A caller tests a category with errors.Is; the edges map
// each category to a status once, in errhttp (REST, E2B's JSON APIs, and
// the Go client back from the wire) and errconnect (E2B's Connect APIs).
// Never compare error strings. The package is public so that users of the
// Go client can test the categories of its errors.
package errdefs

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound: the thing asked for does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: the thing to create exists already.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalidArgument: the request is malformed or out of range.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrFailedPrecondition: the request is well formed but the thing is in
	// the wrong state for it (pausing a stopped sandbox, say).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrUnavailable: a dependency (the OCI runtime, the executor, the
	// network) cannot do it now; retrying later may work.
	ErrUnavailable = errors.New("unavailable")
	// ErrResourceExhausted: a limit was reached.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrUnauthenticated: the caller did not say who it is, or its
	// credential (API key, access token) is not good.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the credential is good but not for this (a
	// presigned URL whose signature does not hold).
	ErrPermissionDenied = errors.New("permission denied")

	// Narrower categories. Each is also its broad category (errors.Is
	// holds for both), so a layer that knows only the broad ones still
	// maps them.

	// ErrConflict: the record changed since it was read (another server
	// wrote it between the read and the write); read it again and retry.
	// Also ErrFailedPrecondition. It has no wire code of its own: a client
	// gets ErrFailedPrecondition back.
	ErrConflict = fmt.Errorf("conflict: %w", ErrFailedPrecondition)

	// Two of the file limits a client can hit through any front door.

	// ErrTooLarge: the thing is over a size limit (a file over the
	// session's max_file_size). Also ErrResourceExhausted.
	ErrTooLarge = fmt.Errorf("too large: %w", ErrResourceExhausted)
	// ErrUnsupportedType: the thing is of a type not allowed here (a file
	// outside the session's allowed_file_types). Also ErrInvalidArgument.
	ErrUnsupportedType = fmt.Errorf("unsupported type: %w", ErrInvalidArgument)
)
