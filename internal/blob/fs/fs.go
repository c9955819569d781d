// Package fs is the blob store on a local directory: one file per blob,
// written to a temporary name and renamed into place.
package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

// Store keeps blobs under a directory.
type Store struct {
	dir string
	// reserve is the free space a Put leaves its file system: the blob
	// store shares the host's disk (R-72, the host's disk is not a
	// tenant's to fill), so writes stop before it is full.
	reserve int64
}

// Reserve is the free space Put leaves on the store's file system: 5% of
// it, at most 2 GiB.
func Reserve(fsSize int64) int64 { return min(fsSize/20, 2<<30) }

var (
	_ blob.Store = (*Store)(nil)
	_ blob.Mover = (*Store)(nil)
)

// New makes dir (0700) if needed and returns a store on it.
func New(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	return &Store{dir: dir, reserve: Reserve(int64(st.Blocks) * st.Bsize)}, nil
}

// room fails when f's file system has less than the reserve free.
func (s *Store) room(f *os.File) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return err
	}
	if free := int64(st.Bavail) * st.Bsize; free < s.reserve {
		return fmt.Errorf("the blob store's disk has %d MiB free, less than the %d MiB kept free: %w",
			free>>20, s.reserve>>20, errdefs.ErrResourceExhausted)
	}
	return nil
}

// Open returns the store at rawURL, file:///DIR (DIR absolute), as New
// does: the URL form beside the s3 backend's s3:// URLs.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "file" || (u.Host != "" && u.Host != "localhost") || u.User != nil ||
		u.Opaque != "" || u.RawQuery != "" || u.Fragment != "" || !filepath.IsAbs(u.Path) {
		return nil, fmt.Errorf("blob store URL %q: not file:///DIR with DIR absolute: %w", rawURL, errdefs.ErrInvalidArgument)
	}
	return New(filepath.Clean(u.Path))
}

func (s *Store) path(key string) (string, error) {
	if !blob.ValidKey(key) {
		return "", fmt.Errorf("blob key %q: %w", key, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(s.dir, filepath.FromSlash(key)), nil
}

// Put implements blob.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader) (int64, error) {
	p, err := s.path(key)
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return 0, err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return 0, err
	}
	n, err := copySparse(f, ctxReader{ctx, r}, func() error { return s.room(f) })
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
		return 0, fmt.Errorf("blob %s: %w", key, err)
	}
	return n, nil
}

// Move implements blob.Mover.
func (s *Store) Move(ctx context.Context, from, to string) error {
	src, err := s.path(from)
	if err != nil {
		return err
	}
	dst, err := s.path(to)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	if err := os.Rename(src, dst); err != nil {
		return notFound(from, err)
	}
	return nil
}

type fileReader struct {
	*os.File
	info blob.Info
}

func (f fileReader) Info() blob.Info { return f.info }

// Open implements blob.Store.
func (s *Store) Open(ctx context.Context, key string) (blob.Reader, error) {
	p, err := s.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, notFound(key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return fileReader{f, blob.Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}}, nil
}

// Stat implements blob.Store.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	p, err := s.path(key)
	if err != nil {
		return blob.Info{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return blob.Info{}, notFound(key, err)
	}
	return blob.Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// Delete implements blob.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("blob %s: %w", key, err)
	}
	return nil
}

// List implements blob.Store. A directory walk is not in the order of
// keys ("a-b" and "a.b" sort before "a/b"), so each directory's names are
// sorted as keys, a directory's with its "/"; the walk holds the names of
// the directories it is in, never the whole listing. Names that cannot be
// keys (a Put's temporary ".tmp-*" files) are skipped.
func (s *Store) List(ctx context.Context, prefix string, fn func(blob.Info) error) error {
	if !blob.ValidPrefix(prefix) {
		return nil
	}
	dir, first := "", prefix
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		dir, first = prefix[:i], prefix[i+1:]
	}
	return s.walk(ctx, dir, first, fn)
}

// walk calls fn for the blobs under the directory of key dir ("" for the
// root) whose names there start with first.
func (s *Store) walk(ctx context.Context, dir, first string, fn func(blob.Info) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	entries, err := os.ReadDir(filepath.Join(s.dir, filepath.FromSlash(dir)))
	if err != nil {
		if dir != "" && (errors.Is(err, iofs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) {
			return nil // removed meanwhile, or the prefix names no directory
		}
		return fmt.Errorf("blob store: %w", err)
	}
	sortKey := func(e iofs.DirEntry) string {
		if e.IsDir() {
			return e.Name() + "/"
		}
		return e.Name()
	}
	slices.SortFunc(entries, func(a, b iofs.DirEntry) int { return strings.Compare(sortKey(a), sortKey(b)) })
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, first) || !blob.ValidKey(name) {
			continue
		}
		key := name
		if dir != "" {
			key = dir + "/" + name
		}
		if e.IsDir() {
			if err := s.walk(ctx, key, "", fn); err != nil {
				return err
			}
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		if err := fn(blob.Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}); err != nil {
			return err
		}
	}
	return nil
}

func notFound(key string, err error) error {
	if errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("blob %s: %w", key, errdefs.ErrNotFound)
	}
	return fmt.Errorf("blob %s: %w", key, err)
}

// copySparse copies r into f, a new file, leaving blocks of zeros as
// holes: a sparse file from a workspace (a presigned download of a
// 100 GB file that is mostly holes) does not become 100 GB on disk.
// room is asked before the first block of data and then every
// roomEvery bytes of it.
func copySparse(f *os.File, r io.Reader, room func() error) (int64, error) {
	const block = 64 << 10
	buf := make([]byte, block)
	var zero [block]byte
	var n, data int64
	for {
		k, err := io.ReadFull(r, buf)
		if k > 0 {
			if bytes.Equal(buf[:k], zero[:k]) {
				if _, err := f.Seek(int64(k), io.SeekCurrent); err != nil {
					return n, err
				}
			} else {
				if data%roomEvery == 0 {
					if err := room(); err != nil {
						return n, err
					}
				}
				if _, err := f.Write(buf[:k]); err != nil {
					return n, err
				}
				data += int64(k)
			}
			n += int64(k)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			// A file that ends in a hole gets its size here.
			return n, f.Truncate(n)
		}
		if err != nil {
			return n, err
		}
	}
}

// roomEvery is how much data Put writes between looks at the free space:
// a multiple of copySparse's block.
const roomEvery = 16 << 20

// ctxReader stops a long copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
