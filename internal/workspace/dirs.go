package workspace

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/sbx-sandbox/sbx/internal/errdefs"
)

// Stat describes what is at rel without following a link there (a link
// is reported as a link). errdefs.ErrNotFound if there is nothing.
func (w *Workspace) Stat(rel string) (fs.FileInfo, error) {
	rel, err := CleanPath(rel)
	if err != nil {
		return nil, err
	}
	fi, err := w.root.Lstat(rel)
	if err != nil {
		return nil, classify(rel, err)
	}
	return fi, nil
}

// Readlink returns the target of the link at rel, as the link holds it.
func (w *Workspace) Readlink(rel string) (string, error) {
	rel, err := CleanPath(rel)
	if err != nil {
		return "", err
	}
	t, err := w.root.Readlink(rel)
	return t, classify(rel, err)
}

// MakeDir makes the directory rel and any missing parents, owned by owner
// with mode 0755. errdefs.ErrAlreadyExists if a directory is there
// already; a file there is errdefs.ErrInvalidArgument.
func (w *Workspace) MakeDir(rel string, owner Owner) error {
	rel, err := CleanPath(rel)
	if err != nil {
		return err
	}
	fi, err := w.root.Lstat(rel)
	switch {
	case err == nil && fi.IsDir():
		return fmt.Errorf("path %s: %w", quote(rel), errdefs.ErrAlreadyExists)
	case err == nil:
		return badPath(rel, "exists and is not a directory")
	case !errors.Is(err, fs.ErrNotExist):
		return dirError(rel, err)
	}
	return w.ensureDir(rel, owner, 0o755)
}

// Rename moves what is at from to to, replacing a file there (not a
// non-empty directory). Neither may be the workspace itself; to's parent
// must exist.
func (w *Workspace) Rename(from, to string) error {
	from, err := CleanPath(from)
	if err != nil {
		return err
	}
	if to, err = CleanPath(to); err != nil {
		return err
	}
	if from == "." || to == "." {
		return badPath(".", "the workspace itself cannot be moved or replaced")
	}
	if _, err := w.root.Lstat(from); err != nil {
		return classify(from, err)
	}
	return classify(to, w.root.Rename(from, to))
}
