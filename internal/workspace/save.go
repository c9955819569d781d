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
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// tempPrefix starts the name of a file Save is still writing.
const tempPrefix = ".sbx-upload-"

// SavedFile describes a file Save wrote.
type SavedFile struct {
	// Path is the workspace path, cleaned.
	Path string `json:"path"`
	// Size is the number of bytes written.
	Size int64 `json:"size"`
	// SHA256 is the hex digest of the content.
	SHA256 string `json:"sha256"`
}

// Save streams r into the file at rel, the sandbox user's with mode 0644. It never holds the content
// in memory: it writes a hidden temporary file (".sbx-upload-<random>")
// next to the target, syncs it, gives it owner and mode and renames it
// into place, so a reader sees the old file or the new one, never a part.
//
// If maxBytes > 0 and r has more, Save stops, removes the temporary file
// and returns errdefs.ErrTooLarge naming the limit. Missing parent
// directories are made the sandbox user's with mode 0755. A file, link or FIFO
// at rel is replaced (a link itself, never written through); a directory
// is errdefs.ErrInvalidArgument.
//
// Save is a client's write: a link on the way to rel is refused, not
// followed, and what sbx manages (uploads/, .resources/, under any name
// the sandbox gave them) is refused too (see resolve.go).
//
// In a directory the sandbox can write to, the sandbox can of course
// replace the file again once Save is done; what is under uploads/, owned
// by the sandbox's root, is out of its reach.
func (w *Local) Save(ctx context.Context, rel string, r io.Reader, maxBytes int64) (SavedFile, error) {
	return w.save(ctx, rel, userArea, r, maxBytes, w.owners.User, 0o644)
}

// SaveUpload saves a file a user uploaded in conversation cid, at rel in
// the conversation's temp area (ConversationDir), owned by the sandbox's
// root with mode 0644: code can read it but not change it. The returned
// path is the workspace path. Otherwise as Save.
func (w *Local) SaveUpload(ctx context.Context, cid, rel string, r io.Reader, maxBytes int64) (SavedFile, error) {
	if !ValidID(cid) {
		return SavedFile{}, fmt.Errorf("conversation id %s: want 1-128 of [A-Za-z0-9._-], not starting with . _ - and without \"..\": %w", quote(cid), errdefs.ErrInvalidArgument)
	}
	rel, err := CleanPath(rel)
	if err != nil {
		return SavedFile{}, err
	}
	if rel == "." {
		return SavedFile{}, badPath(rel, "names no file")
	}
	return w.save(ctx, path.Join(ConversationDir(cid), rel), uploadsArea, r, maxBytes, w.owners.Root, 0o644)
}

func (w *Local) save(ctx context.Context, rel string, a area, r io.Reader, maxBytes int64, owner Owner, mode fs.FileMode) (SavedFile, error) {
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
	p, err := w.resolve(rel, a, &mkdirs{owner, 0o700 | mode | (mode&0o444)>>2})
	if err != nil {
		return SavedFile{}, err
	}
	defer p.close()
	// Fail before the upload is read, not after.
	if st, err := p.lstat(); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return SavedFile{}, badPath(rel, "is a directory")
	}

	// Everything happens in the directory resolve opened, by name.
	tmp := tempPrefix + rand.Text()
	fd, err := unix.Openat(p.fd(), tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return SavedFile{}, classify(rel, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	renamed := false
	defer func() {
		if f != nil {
			f.Close()
		}
		if !renamed {
			unix.Unlinkat(p.fd(), tmp, 0)
		}
	}()

	h := sha256.New()
	n, err := writeLimited(ctx, f, h, r, maxBytes)
	var rerr readError
	switch {
	case errors.As(err, &rerr):
		// The client's or the context's doing, not the workspace's.
		return SavedFile{}, fmt.Errorf("path %s: reading the upload: %w", quote(rel), rerr.err)
	case errors.Is(err, errdefs.ErrTooLarge):
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
	// A resource is a copy of content the store keeps; SyncResources
	// makes its whole change durable at once (a sync per file costs a
	// transaction commit each on a workspace with its own quota).
	durable := a != resourcesArea
	if durable {
		if err := f.Sync(); err != nil {
			return SavedFile{}, classify(rel, err)
		}
	}
	err = f.Close()
	f = nil
	if err != nil {
		return SavedFile{}, classify(rel, err)
	}
	// renameat replaces whatever non-directory is at the name, a link
	// included, without following it.
	if err := unix.Renameat(p.fd(), tmp, p.fd(), p.name); err != nil {
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) {
			return SavedFile{}, badPath(rel, "is a directory")
		}
		return SavedFile{}, classify(rel, err)
	}
	renamed = true
	// Make the rename durable too; the data is already.
	if durable {
		p.dir.Sync()
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
		return n, fmt.Errorf("file is larger than the limit of %s: %w", formatBytes(maxBytes), errdefs.ErrTooLarge)
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

// dirError classifies an error making or opening the parent directory
// dirRel of a file to save.
func dirError(dirRel string, err error) error {
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
		return badPath(dirRel, "is not a directory")
	}
	return classify(dirRel, err)
}
