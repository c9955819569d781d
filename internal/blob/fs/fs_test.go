package fs_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/blob/blobtest"
	"github.com/sbx-sandbox/sbx/internal/blob/fs"
)

func TestConformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store {
		s, err := fs.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// A blob of 1 GiB that is zeros but for its ends takes its ends on disk
// (a presigned copy of a sparse file stays sparse).
func TestPutSparse(t *testing.T) {
	dir := t.TempDir()
	s, err := fs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 30
	r := io.MultiReader(strings.NewReader("head"), io.LimitReader(zeroReader{}, size-8), strings.NewReader("tail"))
	n, err := s.Put(context.Background(), "k", r)
	if err != nil || n != size {
		t.Fatalf("Put = %d, %v", n, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "k"), &st); err != nil || st.Size != size || st.Blocks*512 > 1<<20 {
		t.Errorf("the blob: %d bytes, %d allocated, %v", st.Size, st.Blocks*512, err)
	}
	b, _ := s.Open(context.Background(), "k")
	defer b.Close()
	end := make([]byte, 4)
	b.Seek(size-4, io.SeekStart)
	io.ReadFull(b, end)
	if string(end) != "tail" {
		t.Errorf("its end: %q", end)
	}
}

type onesReader struct{}

func (onesReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 1
	}
	return len(p), nil
}

// A Put stops before the disk's free space falls under the reserve, and
// leaves nothing behind: no tenant's snapshot fills the host's disk.
func TestPutKeepsReserve(t *testing.T) {
	dir := t.TempDir()
	s, err := fs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	// 20 MiB may be written; the blob is 1 GiB of data.
	fs.SetReserve(s, int64(st.Bavail)*st.Bsize-20<<20)
	_, err = s.Put(context.Background(), "big", io.LimitReader(onesReader{}, 1<<30))
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "kept free") {
		t.Fatalf("Put past the reserve: %v", err)
	}
	if _, err := s.Stat(context.Background(), "big"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the blob after a refused Put: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".tmp-*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	// A blob of holes takes no room and is not refused.
	if _, err := s.Put(context.Background(), "holes", io.LimitReader(zeroReader{}, 1<<30)); err != nil {
		t.Errorf("a Put of holes: %v", err)
	}
}

func TestOpenURL(t *testing.T) {
	dir := t.TempDir()
	for _, u := range []string{"file://" + dir + "/blobs", "file://localhost" + dir + "/blobs%20two"} {
		if _, err := fs.Open(context.Background(), u); err != nil {
			t.Errorf("Open(%s): %v", u, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "blobs two")); err != nil {
		t.Errorf("the escaped path: %v", err)
	}
	for _, u := range []string{"", "/abs/path", "file://host/x", "file:relative", "file:///x?y=1", "s3://bucket", "file://u:p@/x"} {
		if _, err := fs.Open(context.Background(), u); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Open(%q) = %v, want ErrInvalidArgument", u, err)
		}
	}
}
