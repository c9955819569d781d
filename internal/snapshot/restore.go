package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Restore recreates the tree of the manifest at key as dir, which must not
// exist. The tree is built in a sibling directory and renamed into place.
func (s *Store) Restore(ctx context.Context, key, dir string) (*Manifest, error) {
	return s.restore(ctx, key, func(ctx context.Context, o *opened) error {
		if _, err := os.Lstat(dir); err == nil {
			return fmt.Errorf("restore into %s: %w", dir, errdefs.ErrAlreadyExists)
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		tmp, err := os.MkdirTemp(filepath.Dir(dir), ".restore-")
		if err != nil {
			return err
		}
		if err := s.build(ctx, o, tmp); err != nil {
			os.RemoveAll(tmp)
			return err
		}
		if err := os.Rename(tmp, dir); err != nil {
			os.RemoveAll(tmp)
			return err
		}
		return nil
	})
}

// RestoreInto recreates the tree of the manifest at key in dir, an empty
// directory the caller made (one with a disk quota, which a sibling made
// here would lack). dir takes the mode, owner and time of the tree's root.
// The owners of a manifest saved from an archive are translated to the
// host ids given to MapIDs; its directories keep the time of the restore
// (an archive has none for them).
// On an error dir is left with what was written so far, for the caller to
// remove.
func (s *Store) RestoreInto(ctx context.Context, key, dir string) (*Manifest, error) {
	return s.restore(ctx, key, func(ctx context.Context, o *opened) error { return s.build(ctx, o, dir) })
}

// restore opens the manifest at key and has write build its tree, within
// the restore time limit.
func (s *Store) restore(ctx context.Context, key string, write func(context.Context, *opened) error) (*Manifest, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.lim.Timeout,
		exhausted("the restore took longer than its limit of %v", s.lim.Timeout))
	defer cancel()
	if err := s.gc.RLock(ctx); err != nil {
		return nil, err
	}
	defer s.gc.RUnlock()
	var m Manifest
	o, err := s.openManifest(ctx, key, &m)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	// A manifest is restored whatever the limits were when it was
	// written: lowering them must not lose a hibernated session. Only the
	// depth is bounded (a descriptor per level), generously.
	o.check.lim = Limits{MaxDepth: max(s.lim.MaxDepth, restoreDepth), MaxPath: math.MaxInt, MaxEntries: math.MaxInt}
	if err := write(ctx, o); err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() == context.DeadlineExceeded {
			err = cause
		}
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			return nil, err
		}
		return nil, fmt.Errorf("restore %s: %w", key, err)
	}
	return &m, nil
}

// restoreDepth is the least depth a restore accepts.
const restoreDepth = 4096

// openDir is a directory being restored: its mode and times are set when
// the walk leaves it, since creating its entries changes its mtime and its
// mode may forbid creating them.
type openDir struct {
	fd   int
	path string
	e    Entry
	// untimed is a directory of an archive-saved manifest, which has no
	// time to set.
	untimed bool
}

// build writes the tree of o into root, which exists and is empty. It
// works relative to open directories, never by path, so no path is ever
// longer than a name, and holds one descriptor per level.
func (s *Store) build(ctx context.Context, o *opened, root string) error {
	if o.sandbox && s.ids == nil {
		return noIDs("a manifest saved from an archive")
	}
	var stack []openDir
	defer func() {
		for _, d := range stack {
			unix.Close(d.fd)
		}
	}()
	// leave closes the directory on top of the stack, setting its mode
	// and times.
	leave := func() error {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		defer unix.Close(d.fd)
		if err := unix.Fchmod(d.fd, d.e.Mode); err != nil {
			return fmt.Errorf("%s: %w", d.path, err)
		}
		if d.untimed {
			return nil
		}
		ts := []unix.Timespec{unix.NsecToTimespec(d.e.MTime), unix.NsecToTimespec(d.e.MTime)}
		if err := unix.UtimesNanoAt(d.fd, ".", ts, 0); err != nil {
			return fmt.Errorf("%s: %w", d.path, err)
		}
		return nil
	}
	buf := make([]byte, ChunkSize)
	var e Entry
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := o.next(&e)
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if o.sandbox {
			id := s.ids.hostID(e.UID)
			e.UID, e.GID = id.UID, id.GID
		}
		if e.Path == "." {
			fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			stack = append(stack, openDir{fd: fd, path: ".", e: e, untimed: o.sandbox})
			if err := unix.Fchown(fd, e.UID, e.GID); err != nil {
				return err
			}
			continue
		}
		// The checker made sure the parent is on the stack.
		for stack[len(stack)-1].path != path.Dir(e.Path) {
			if err := leave(); err != nil {
				return err
			}
		}
		if err := s.create(ctx, stack[len(stack)-1].fd, o, &e, buf, &stack); err != nil {
			return fmt.Errorf("%s: %w", e.Path, err)
		}
	}
	for len(stack) > 0 {
		if err := leave(); err != nil {
			return err
		}
	}
	return nil
}

// create makes one entry in the directory open at dirfd; a directory is
// pushed on the stack.
func (s *Store) create(ctx context.Context, dirfd int, o *opened, e *Entry, buf []byte, stack *[]openDir) error {
	name := path.Base(e.Path)
	ts := []unix.Timespec{unix.NsecToTimespec(e.MTime), unix.NsecToTimespec(e.MTime)}
	switch e.Type {
	case "dir":
		if err := unix.Mkdirat(dirfd, name, 0o700); err != nil {
			return err
		}
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		*stack = append(*stack, openDir{fd: fd, path: e.Path, e: *e, untimed: o.sandbox})
		return unix.Fchown(fd, e.UID, e.GID)
	case "symlink":
		if err := unix.Symlinkat(e.Target, dirfd, name); err != nil {
			return err
		}
		if err := unix.Fchownat(dirfd, name, e.UID, e.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	case "file":
		fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), e.Path)
		defer f.Close()
		if err := s.writeFile(ctx, f, o.area, e, buf); err != nil {
			return err
		}
		// The mode after the chown. No file comes back setuid or setgid:
		// a workspace is what sandboxed code made, and such a bit left on
		// the host would be one more way for it to reach beyond.
		if err := f.Chown(e.UID, e.GID); err != nil {
			return err
		}
		if err := unix.Fchmod(fd, e.Mode&^(unix.S_ISUID|unix.S_ISGID)); err != nil {
			return err
		}
		if err := unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return f.Close()
	}
	return nil
}

// writeFile writes a file's chunks where they go, skipping its runs of
// zeros, and gives it its size: the holes of the file saved are holes
// again.
func (s *Store) writeFile(ctx context.Context, f *os.File, area string, e *Entry, buf []byte) error {
	off := int64(0)
	for _, sum := range e.Chunks {
		if err := ctx.Err(); err != nil {
			return err
		}
		if z, ok := parseZeroRun(sum); ok {
			off += z * ChunkSize // the checker bounded the sum
			continue
		}
		n, err := s.readChunk(ctx, area, sum, min(e.Size-off, ChunkSize), buf)
		if err != nil {
			return err
		}
		if _, err := f.WriteAt(buf[:n], off); err != nil {
			return err
		}
		off += int64(n)
	}
	return f.Truncate(e.Size)
}

// readChunk reads the chunk sum of area into buf and checks it: its hash,
// and its size, want.
func (s *Store) readChunk(ctx context.Context, area, sum string, want int64, buf []byte) (int, error) {
	r, err := s.blobs.Open(ctx, chunkKey(area, sum))
	if err != nil {
		return 0, fmt.Errorf("chunk %s: %w", sum, err)
	}
	n, err := io.ReadFull(r, buf)
	r.Close()
	if err != nil && err != io.ErrUnexpectedEOF {
		return 0, fmt.Errorf("chunk %s: %w", sum, err)
	}
	if h := sha256.Sum256(buf[:n]); hex.EncodeToString(h[:]) != sum {
		return 0, fmt.Errorf("chunk %s is corrupt: its content hashes otherwise", sum)
	}
	if int64(n) != want {
		return 0, fmt.Errorf("chunk %s has %d bytes, want %d", sum, n, want)
	}
	return n, nil
}
