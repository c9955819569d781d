// Package cas is a content-addressed file store on the local disk: files
// named by the SHA-256 of their content, one directory per tenant, so that
// content a tenant sends once is stored once however many of its sessions
// use it, and one tenant cannot learn what another has stored. It keeps
// the content of session resources, which workspaces hard-link.
//
// Layout under Dir: TENANT/XX/SHA256, TENANT being the first 32 hex digits
// of the SHA-256 of the tenant's name (any name is safe as a path), XX the
// first two digits of the content's hash. Files are read-only and belong
// to the owner given to New, which is what a workspace's hard link to them
// shows.
package cas

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Store is a content-addressed store. Its methods are safe for concurrent
// use, by several processes too: every file appears by an atomic rename.
type Store struct {
	dir      string
	uid, gid int
}

// New opens (making it if needed) the store at dir, whose files will
// belong to uid:gid.
func New(dir string, uid, gid int) (*Store, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("content store: %w", err)
	}
	return &Store{dir: dir, uid: uid, gid: gid}, nil
}

func tenantDir(tenant string) string {
	h := sha256.Sum256([]byte(tenant))
	return hex.EncodeToString(h[:16])
}

// ValidSum says whether s is a SHA-256 in lower-case hex.
func ValidSum(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

func (s *Store) path(tenant, sum string) string {
	return filepath.Join(s.dir, tenantDir(tenant), sum[:2], sum)
}

// Path returns the file holding the content with hash sum for tenant, and
// whether there is one.
func (s *Store) Path(tenant, sum string) (string, bool) {
	if !ValidSum(sum) {
		return "", false
	}
	p := s.path(tenant, sum)
	fi, err := os.Lstat(p)
	return p, err == nil && fi.Mode().IsRegular()
}

// Put stores what r gives, at most max bytes, if its SHA-256 is sum. It
// returns the size and whether the content is new; content already there
// is read to the end (to check it) and dropped. A wrong hash is
// errdefs.ErrInvalidArgument, more than max bytes
// errdefs.ErrResourceExhausted.
func (s *Store) Put(ctx context.Context, tenant, sum string, r io.Reader, max int64) (size int64, created bool, err error) {
	if !ValidSum(sum) {
		return 0, false, fmt.Errorf("content hash %q: want 64 lower-case hex digits: %w", sum, errdefs.ErrInvalidArgument)
	}
	final := s.path(tenant, sum)
	dir := filepath.Dir(final)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return 0, false, err
	}
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return 0, false, err
	}
	tmp := f.Name()
	defer func() {
		if f != nil {
			f.Close()
		}
		if tmp != "" {
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, r}, max+1))
	if err != nil {
		return n, false, fmt.Errorf("content %s: %w", sum, err)
	}
	if n > max {
		return n, false, fmt.Errorf("content %s: larger than the limit of %d bytes: %w", sum, max, errdefs.ErrResourceExhausted)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return n, false, fmt.Errorf("content of %d bytes has SHA-256 %s, not %s: %w", n, got, sum, errdefs.ErrInvalidArgument)
	}
	if p, ok := s.Path(tenant, sum); ok {
		// Sent again: it is wanted, so Collect leaves it for another grace.
		now := time.Now()
		os.Chtimes(p, now, now)
		return n, false, nil
	}
	if err := f.Chown(s.uid, s.gid); err != nil {
		return n, false, err
	}
	if err := f.Chmod(0o444); err != nil {
		return n, false, err
	}
	if err := f.Sync(); err != nil {
		return n, false, err
	}
	err = f.Close()
	f = nil
	if err != nil {
		return n, false, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return n, false, err
	}
	tmp = ""
	return n, true, nil
}

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

// Collect removes content nothing links to any more (a link count of
// one) that is older than grace, and temporary files older than grace, and
// returns how many files and bytes went. Content a workspace holds a copy
// of rather than a link (another file system) is removed too; the
// workspace's record still says it is in place, so nothing asks for it
// again until its manifest changes.
func (s *Store) Collect(grace time.Duration) (files int, bytes int64, err error) {
	cutoff := time.Now().Add(-grace)
	err = filepath.WalkDir(s.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil // gone since
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || st.Nlink > 1 || fi.ModTime().After(cutoff) {
			return nil
		}
		if os.Remove(p) == nil {
			files++
			bytes += fi.Size()
		}
		return nil
	})
	return files, bytes, err
}
