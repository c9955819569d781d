package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"syscall"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// errEscapes is the error os.Root gives when a path, or a symbolic link on
// it, leads out of the root. The os package does not export it, so it is
// taken from the one case that yields it without touching the file system:
// a path with a leading slash. TestEscapeIsInvalidArgument notices if a Go
// release stops returning it for planted links.
var errEscapes = sync.OnceValue(func() error {
	r, err := os.OpenRoot("/")
	if err != nil {
		return nil
	}
	defer r.Close()
	_, err = r.Lstat("/")
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return nil
})

func isEscape(err error) bool {
	e := errEscapes()
	return e != nil && errors.Is(err, e)
}

// classify turns an error of an os.Root operation on rel into one a client
// can act on. What the sandbox can provoke by planting links and special
// files (escapes, loops, a file where a directory should be) comes out as
// a client error, never as an internal one.
func classify(rel string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("path %s: no such file or directory: %w", quote(rel), errdefs.ErrNotFound)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("path %s: a parent is not a directory: %w", quote(rel), errdefs.ErrNotFound)
	case isEscape(err):
		return fmt.Errorf("path %s: a symbolic link on it leads out of the workspace: %w", quote(rel), errdefs.ErrInvalidArgument)
	case errors.Is(err, syscall.ELOOP):
		return fmt.Errorf("path %s: too many levels of symbolic links: %w", quote(rel), errdefs.ErrInvalidArgument)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return fmt.Errorf("path %s: name too long: %w", quote(rel), errdefs.ErrInvalidArgument)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("path %s: workspace disk is full: %w", quote(rel), errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("path %s: %w", quote(rel), err)
}
