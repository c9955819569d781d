// Package workspace is a session's files on the host: the directory
// mounted read-write at /workspace in its sandbox, and the file operations
// the control plane does on it (upload, download, list, delete, usage).
//
// Untrusted code in the sandbox can change the tree at any moment: plant
// symbolic links to /etc or to another workspace, FIFOs, deep or huge
// trees, or swap a directory for a link between two of our system calls.
// So every operation goes through an os.Root on the workspace directory,
// never through a path joined onto the host path: os.Root resolves each
// component with openat and O_NOFOLLOW, follows links only while they stay
// inside, and fails with an error for those that lead out (absolute links
// always do). That error, a link loop, or a missing file come out as
// errdefs.ErrInvalidArgument or errdefs.ErrNotFound, never as an internal
// error.
package workspace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Owner is the host uid and gid a file or directory is given.
type Owner struct{ UID, GID int }

// Owners are the host ids of the two users that matter inside a sandbox.
type Owners struct {
	// Root is root inside the sandbox (the uid shift, 100000 say). What it
	// owns with mode 0755/0644 user code can read but not change: the
	// uploads directory and the files users upload into it.
	Root Owner
	// User is the user code runs as (101000 say).
	User Owner
}

// Local is one session's workspace directory on this host. Its methods are safe for
// concurrent use.
type Local struct {
	dir    string
	root   *os.Root
	owners Owners
}

const (
	dirMode     = 0o711 // others may traverse, not list
	uploadsMode = 0o755
)

// Create makes dir (mode 0711, owned by owners.User) unless it exists, and
// opens it. It also makes sure "uploads" is a directory owned by
// owners.Root with mode 0755, so that user code can read the conversation
// uploads below it but not add, change or remove any; whatever the sandbox
// left under that name (a link, a file) is removed first. The parent of dir
// must exist.
//
// User code owns the workspace directory itself, so it can still rename
// "uploads" away and make its own; Save then writes into that, inside the
// workspace still. Call Create again (on every sandbox start, say) to put
// a root-owned one back.
func Create(dir string, owners Owners) (*Local, error) {
	dir, err := hostDir(dir)
	if err != nil {
		return nil, err
	}
	switch err := os.Mkdir(dir, dirMode); {
	case err == nil:
		return Init(dir, owners)
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("workspace %q: parent directory does not exist: %w", dir, errdefs.ErrNotFound)
	case !errors.Is(err, fs.ErrExist):
		return nil, fmt.Errorf("workspace %q: %w", dir, err)
	}
	return openWithUploads(dir, owners)
}

// Init makes dir, a new directory that the caller made (with a disk quota,
// say), a workspace as Create would have made it, and opens it.
func Init(dir string, owners Owners) (*Local, error) {
	// The ids are the sandbox's; the mode is set here, past any umask.
	if err := os.Chmod(dir, dirMode); err != nil {
		return nil, fmt.Errorf("workspace %q: %w", dir, err)
	}
	if err := os.Lchown(dir, owners.User.UID, owners.User.GID); err != nil {
		return nil, fmt.Errorf("workspace %q: %w", dir, err)
	}
	return openWithUploads(dir, owners)
}

// openWithUploads opens the workspace at dir and makes sure it has its
// uploads directory.
func openWithUploads(dir string, owners Owners) (*Local, error) {
	w, err := Open(dir, owners)
	if err != nil {
		return nil, err
	}
	if err := w.ensureUploads(); err != nil {
		w.Close()
		return nil, fmt.Errorf("workspace %q: %w", dir, err)
	}
	return w, nil
}

// Open opens the existing workspace at dir; errdefs.ErrNotFound if there
// is none.
func Open(dir string, owners Owners) (*Local, error) {
	dir, err := hostDir(dir)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("workspace %q: %w", dir, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("workspace %q: %w", dir, err)
	}
	return &Local{dir: dir, root: root, owners: owners}, nil
}

// hostDir checks the host path of a workspace: it is trusted (the server
// chose it), but Destroy removes it, so "/" and the like are refused.
func hostDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("workspace %q: %w", dir, err)
	}
	if filepath.Dir(abs) == abs {
		return "", fmt.Errorf("workspace %q: cannot be a file system root: %w", dir, errdefs.ErrInvalidArgument)
	}
	return abs, nil
}

// ensureUploads makes "uploads" a directory of the sandbox's root.
func (w *Local) ensureUploads() error {
	fi, err := w.root.Lstat(uploadsDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case !fi.IsDir():
		if err := w.root.Remove(uploadsDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := w.root.Mkdir(uploadsDir, uploadsMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// Through a descriptor: the name may have been swapped since; the
	// worst that does is hand the sandbox's own directory to its root.
	// O_DIRECTORY also keeps a FIFO swapped in from blocking the open.
	f, err := w.root.OpenFile(uploadsDir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Chown(w.owners.Root.UID, w.owners.Root.GID); err != nil {
		return err
	}
	return f.Chmod(uploadsMode)
}

// Close releases the workspace's directory descriptor. The files stay.
func (w *Local) Close() error {
	return w.root.Close()
}

// Dir returns the workspace's host directory.
func (w *Local) Dir() string {
	return w.dir
}

// Destroy closes the workspace and removes its directory with everything
// in it (the session is gone). Links planted inside are removed, never
// followed. Stop the sandbox first: files it keeps writing can make the
// removal fail.
func (w *Local) Destroy() error {
	w.root.Close()
	parent, err := os.OpenRoot(filepath.Dir(w.dir))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("workspace %q: %w", w.dir, err)
	}
	defer parent.Close()
	// Root.RemoveAll walks with openat and O_NOFOLLOW from the parent's
	// descriptor, and does nothing if the directory is gone already.
	if err := parent.RemoveAll(filepath.Base(w.dir)); err != nil {
		return fmt.Errorf("workspace %q: %w", w.dir, err)
	}
	return nil
}

// Open opens the regular file at rel for reading (a download; the caller
// may serve ranges of it with http.ServeContent). Links that stay inside
// the workspace are followed. Directories, FIFOs, sockets and devices are
// errdefs.ErrInvalidArgument; a FIFO is opened non-blocking, so that no
// writer is waited for.
func (w *Local) Open(ctx context.Context, rel string) (File, error) {
	rel, err := CleanPath(rel)
	if err != nil {
		return nil, err
	}
	// Refuse what is not a regular file before opening it: opening has
	// side effects on some special files.
	fi, err := w.root.Stat(rel)
	if err != nil {
		return nil, classify(rel, err)
	}
	if err := regular(rel, fi); err != nil {
		return nil, err
	}
	// It may have been swapped for a FIFO since: O_NONBLOCK keeps the open
	// from waiting for a writer, and the descriptor is checked again. On a
	// regular file O_NONBLOCK changes nothing.
	f, err := w.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, classify(rel, err)
	}
	fi, err = f.Stat()
	if err == nil {
		err = regular(rel, fi)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &localFile{File: f, info: w.newEntry(rel, fi)}, nil
}

// localFile is a Local's File: the descriptor, and what it was opened as.
type localFile struct {
	*os.File
	info Entry
}

func (f *localFile) Info() Entry { return f.info }

func regular(rel string, fi fs.FileInfo) error {
	switch {
	case fi.IsDir():
		return badPath(rel, "is a directory")
	case !fi.Mode().IsRegular():
		return badPath(rel, "not a regular file")
	}
	return nil
}

// Remove removes the file, link or special file at rel (a link itself,
// never what it points to). A directory is removed, with everything in
// it, only if recursive is set. errdefs.ErrNotFound if there is nothing at
// rel. Like Save, it follows no link on the way and refuses what sbx
// manages.
func (w *Local) Remove(ctx context.Context, rel string, recursive bool) error {
	return w.remove(rel, userArea, recursive)
}

// RemoveUpload removes a conversation's upload, or a directory of them,
// at rel below uploads/ (the workspace path SaveUpload returned).
func (w *Local) RemoveUpload(ctx context.Context, rel string, recursive bool) error {
	return w.remove(rel, uploadsArea, recursive)
}

func (w *Local) remove(rel string, a area, recursive bool) error {
	rel, err := CleanPath(rel)
	if err != nil {
		return err
	}
	if rel == "." {
		return badPath(rel, "the workspace itself cannot be removed")
	}
	p, err := w.resolve(rel, a, nil)
	if err != nil {
		return err
	}
	defer p.close()
	st, err := p.lstat()
	if err != nil {
		return classify(rel, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if !recursive {
			return badPath(rel, "is a directory; remove it recursively")
		}
		// It may be a link by now: removeAt removes a link at the name
		// itself and opens nothing below it without O_NOFOLLOW.
		return classify(rel, removeAt(p.dir, p.name))
	}
	err = unix.Unlinkat(p.fd(), p.name, 0)
	if errors.Is(err, unix.EISDIR) {
		// It has become a directory since: removed only if empty.
		err = unix.Unlinkat(p.fd(), p.name, unix.AT_REMOVEDIR)
		if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return badPath(rel, "is a directory; remove it recursively")
		}
	}
	return classify(rel, err)
}

// RemoveConversation deletes everything kept for conversation cid
// (uploads/<cid>). It is not an error if there is nothing.
func (w *Local) RemoveConversation(ctx context.Context, cid string) error {
	if !ValidID(cid) {
		return fmt.Errorf("conversation id %s: want 1-128 of [A-Za-z0-9._-], not starting with . _ - and without \"..\": %w", quote(cid), errdefs.ErrInvalidArgument)
	}
	err := w.remove(path.Join(uploadsDir, cid), uploadsArea, true)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return err
}
