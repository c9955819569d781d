package workspace

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/sbx-sandbox/sbx/internal/errdefs"
)

// tempPrefix starts the name of a file Save is still writing.
const tempPrefix = ".sbx-upload-"

// SavedFile describes a file Save wrote. (Not FileInfo: Open returns an
// fs.FileInfo, and the two should not be confused.)
type SavedFile struct {
	// Path is the workspace path, cleaned.
	Path string `json:"path"`
	// Size is the number of bytes written.
	Size int64 `json:"size"`
	// SHA256 is the hex digest of the content.
	SHA256 string `json:"sha256"`
}

// Save streams r into the file at rel, with owner and permission bits
// mode (0644 if zero; other bits are dropped). It never holds the content
// in memory: it writes a hidden temporary file (".sbx-upload-<random>")
// next to the target, syncs it, gives it owner and mode and renames it
// into place, so a reader sees the old file or the new one, never a part.
//
// If maxBytes > 0 and r has more, Save stops, removes the temporary file
// and returns errdefs.ErrResourceExhausted naming the limit. Missing parent
// directories are made with owner and mode plus x where mode has r, and
// rwx for the owner (0755 for 0644, 0700 for 0600). A file, link or FIFO at rel is replaced (a link itself, never
// written through); a directory is errdefs.ErrInvalidArgument.
//
// In a directory the sandbox can write to, the sandbox can of course
// replace the file again once Save is done; what is under uploads/, owned
// by the sandbox's root, is out of its reach.
func (w *Workspace) Save(ctx context.Context, rel string, r io.Reader, maxBytes int64, owner Owner, mode fs.FileMode) (SavedFile, error) {
	rel, err := CleanPath(rel)
	if err != nil {
		return SavedFile{}, err
	}
	if rel == "." {
		return SavedFile{}, badPath(rel, "is a directory")
	}
	if err := ctx.Err(); err != nil {
		return SavedFile{}, err
	}
	mode = mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	dirRel := path.Dir(rel)
	if err := w.ensureDir(dirRel, owner, 0o700|mode|(mode&0o444)>>2); err != nil {
		return SavedFile{}, err
	}
	// Fail before the upload is read, not after.
	if fi, err := w.root.Lstat(rel); err == nil && fi.IsDir() {
		return SavedFile{}, badPath(rel, "is a directory")
	}

	// Every step names its file by its path from the workspace root, and
	// os.Root resolves it afresh: a sub-Root of the directory would be
	// one descriptor, but Root.OpenRoot opens its last component without
	// O_DIRECTORY or O_NONBLOCK and so hangs on a FIFO planted there.
	tmp := path.Join(dirRel, tempPrefix+rand.Text())
	f, err := w.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return SavedFile{}, classify(rel, err)
	}
	renamed := false
	defer func() {
		if f != nil {
			f.Close()
		}
		if !renamed {
			w.root.Remove(tmp)
		}
	}()

	h := sha256.New()
	n, err := writeLimited(ctx, f, h, r, maxBytes)
	var rerr readError
	switch {
	case errors.As(err, &rerr):
		// The client's or the context's doing, not the workspace's.
		return SavedFile{}, fmt.Errorf("path %s: reading the upload: %w", quote(rel), rerr.err)
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return SavedFile{}, fmt.Errorf("path %s: %w", quote(rel), err)
	case err != nil:
		return SavedFile{}, classify(rel, err)
	}
	// Owner, then mode (a chown clears set-id bits). Both go through the
	// descriptor, so nothing swapped in at tmp can redirect them.
	if err := f.Chown(owner.UID, owner.GID); err != nil {
		return SavedFile{}, classify(rel, err)
	}
	if err := f.Chmod(mode); err != nil {
		return SavedFile{}, classify(rel, err)
	}
	if err := f.Sync(); err != nil {
		return SavedFile{}, classify(rel, err)
	}
	err = f.Close()
	f = nil
	if err != nil {
		return SavedFile{}, classify(rel, err)
	}
	// renameat replaces whatever non-directory is at rel, a link
	// included, without following it.
	if err := w.root.Rename(tmp, rel); err != nil {
		if errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.ENOTEMPTY) {
			return SavedFile{}, badPath(rel, "is a directory")
		}
		return SavedFile{}, classify(rel, err)
	}
	renamed = true
	// Make the rename durable too; the data is already.
	if d, err := w.root.OpenFile(dirRel, os.O_RDONLY|syscall.O_DIRECTORY, 0); err == nil {
		d.Sync()
		d.Close()
	}
	return SavedFile{Path: rel, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// writeLimited copies r to f and h, at most maxBytes (if > 0), checking ctx
// between reads.
func writeLimited(ctx context.Context, f *os.File, h hash.Hash, r io.Reader, maxBytes int64) (int64, error) {
	src := io.Reader(ctxReader{ctx, r})
	if maxBytes > 0 {
		src = io.LimitReader(src, maxBytes+1)
	}
	buf := make([]byte, 256<<10)
	n, err := io.CopyBuffer(io.MultiWriter(f, h), src, buf)
	if err != nil {
		return n, err
	}
	if maxBytes > 0 && n > maxBytes {
		return n, fmt.Errorf("file is larger than the limit of %s: %w", formatBytes(maxBytes), errdefs.ErrResourceExhausted)
	}
	return n, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

// Read fails with a readError, so that Save can tell a failed read (a
// client gone, a malformed multipart body) from a failed write.
func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, readError{err}
	}
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF {
		err = readError{err}
	}
	return n, err
}

type readError struct{ err error }

func (e readError) Error() string { return e.err.Error() }
func (e readError) Unwrap() error { return e.err }

// formatBytes says n in the largest binary unit it is a whole multiple of,
// and in bytes when that is not bytes already.
func formatBytes(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d %s (%d bytes)", n/u.size, u.name, n)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

// ensureDir makes sure dirRel (cleaned) is a directory, making missing
// components with owner and perm. Links on the way are followed while they
// stay inside the workspace, like everywhere else.
func (w *Workspace) ensureDir(dirRel string, owner Owner, perm fs.FileMode) error {
	if dirRel == "." {
		return nil
	}
	fi, err := w.root.Stat(dirRel)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return badPath(dirRel, "is not a directory")
	case !errors.Is(err, fs.ErrNotExist):
		return dirError(dirRel, err)
	}
	var prefix string
	for c := range strings.SplitSeq(dirRel, "/") {
		prefix = path.Join(prefix, c)
		err := w.root.Mkdir(prefix, perm)
		if errors.Is(err, fs.ErrExist) {
			continue // made by a concurrent Save, or a file: the next step says
		}
		if err != nil {
			return dirError(prefix, err)
		}
		if err := w.adopt(prefix, owner, perm); err != nil {
			return dirError(prefix, err)
		}
	}
	return nil
}

// adopt gives the directory Save just made at rel its owner and mode,
// through a descriptor. If the sandbox swapped the name in the meantime,
// the descriptor is of a directory we did not make (not owned by us); that
// one is left alone rather than handed to owner.
func (w *Workspace) adopt(rel string, owner Owner, perm fs.FileMode) error {
	f, err := w.root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return nil
	}
	if err := f.Chown(owner.UID, owner.GID); err != nil {
		return err
	}
	return f.Chmod(perm)
}

// dirError classifies an error making or opening the parent directory
// dirRel of a file to save.
func dirError(dirRel string, err error) error {
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
		return badPath(dirRel, "is not a directory")
	}
	return classify(dirRel, err)
}
