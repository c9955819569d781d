package workspace

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Stat describes what is at rel without following a link there (a link
// is reported as a link, with its target). errdefs.ErrNotFound if there
// is nothing.
func (w *Local) Stat(ctx context.Context, rel string) (Entry, error) {
	rel, err := CleanPath(rel)
	if err != nil {
		return Entry{}, err
	}
	fi, err := w.root.Lstat(rel)
	if err != nil {
		return Entry{}, classify(rel, err)
	}
	e := w.newEntry(rel, fi)
	if e.Type == "symlink" {
		// Swapped meanwhile: reported as the link it was, without target.
		e.Target, _ = w.root.Readlink(rel)
	}
	return e, nil
}

// MakeDir makes the directory rel and any missing parents, owned by the
// sandbox user with mode 0755. errdefs.ErrAlreadyExists if a directory is there
// already; a file there is errdefs.ErrInvalidArgument. Like Save, it
// follows no link and refuses what sbx manages.
func (w *Local) MakeDir(ctx context.Context, rel string) error {
	owner := w.owners.User
	rel, err := CleanPath(rel)
	if err != nil {
		return err
	}
	p, err := w.resolve(rel, userArea, &mkdirs{owner, 0o755})
	if err != nil {
		return err
	}
	defer p.close()
	if err := unix.Mkdirat(p.fd(), p.name, 0o755); err != nil {
		st, lerr := p.lstat()
		switch {
		case !errors.Is(err, unix.EEXIST) || lerr != nil:
			return classify(rel, err)
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			return fmt.Errorf("path %s: %w", quote(rel), errdefs.ErrAlreadyExists)
		}
		return badPath(rel, "exists and is not a directory")
	}
	d, _, err := openDir(p.dir, p.name, nil)
	if err != nil {
		return w.componentError(rel, rel, err)
	}
	defer d.Close()
	return dirError(rel, w.adoptFile(d, owner, 0o755))
}

// Rename moves what is at from to to, replacing a file there (not a
// non-empty directory). Neither may be the workspace itself; to's parent
// must exist. Like Save, it follows no link on the way to either (a link
// at from is moved itself) and refuses what sbx manages.
func (w *Local) Rename(ctx context.Context, from, to string) error {
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
	src, err := w.resolve(from, userArea, nil)
	if err != nil {
		return err
	}
	defer src.close()
	if _, err := src.lstat(); err != nil {
		return classify(from, err)
	}
	dst, err := w.resolve(to, userArea, nil)
	if err != nil {
		return err
	}
	defer dst.close()
	err = unix.Renameat(src.fd(), src.name, dst.fd(), dst.name)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL):
		return badPath(to, fmt.Sprintf("is inside %s, which cannot be moved into itself", quote(from)))
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST):
		return badPath(to, "is a directory that is not empty")
	case errors.Is(err, unix.EISDIR):
		return badPath(to, "is a directory, and a file cannot replace it")
	case errors.Is(err, unix.ENOTDIR):
		return badPath(to, "is not a directory, and a directory cannot replace it")
	}
	return classify(to, err)
}
