package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// temps lists the temporary files Save left anywhere in the workspace.
func temps(t *testing.T, dir string) []string {
	t.Helper()
	var left []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), tempPrefix) {
			left = append(left, p)
		}
		return nil
	})
	return left
}

func TestSave(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.plant(t)
	content := strings.Repeat("0123456789", 100_000)
	sum := sha256.Sum256([]byte(content))

	got, err := e.w.Save(ctx, "./out//data.csv", strings.NewReader(content), int64(len(content)))
	if err != nil {
		t.Fatal(err)
	}
	want := SavedFile{Path: "out/data.csv", Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:])}
	if got != want {
		t.Errorf("Save = %+v, want %+v", got, want)
	}
	if mustRead(t, filepath.Join(e.w.Dir(), "out", "data.csv")) != content {
		t.Error("content differs")
	}
	fi, _ := os.Stat(filepath.Join(e.w.Dir(), "out", "data.csv"))
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("default mode %v", fi.Mode())
	}

	for _, tc := range []struct {
		name, path string
		err        error
		msg        string
	}{
		{"workspace root", ".", errdefs.ErrInvalidArgument, "is a directory"},
		{"directory", "real", errdefs.ErrInvalidArgument, "is a directory"},
		{"under a file", "real/a.txt/x", errdefs.ErrInvalidArgument, "not a directory"},
		{"under a file, deeper", "real/a.txt/x/y", errdefs.ErrInvalidArgument, "not a directory"},
		{"absolute", "/etc/passwd", errdefs.ErrInvalidArgument, "must be relative"},
		{"dotdot", "../s2/x", errdefs.ErrInvalidArgument, `".."`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.w.Save(ctx, tc.path, strings.NewReader("x"), 0)
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Save(%q) = %v, want %v saying %q", tc.path, err, tc.err, tc.msg)
			}
		})
	}
	t.Run("link to directory is replaced", func(t *testing.T) {
		if _, err := e.w.Save(ctx, "inlink", strings.NewReader("x"), 0); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(filepath.Join(e.w.Dir(), "inlink")); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("inlink: %v, %v", fi, err)
		}
		if fi, err := os.Stat(filepath.Join(e.w.Dir(), "real")); err != nil || !fi.IsDir() {
			t.Errorf("real: %v, %v", fi, err)
		}
	})
	if left := temps(t, e.w.Dir()); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestSaveLimit(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		size int
		max  int64
		err  error
	}{
		{"under", 9, 10, nil},
		{"at", 10, 10, nil},
		{"one over", 11, 10, errdefs.ErrResourceExhausted},
		{"far over", 5 << 20, 1 << 20, errdefs.ErrResourceExhausted},
		{"no limit", 3 << 20, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			target := filepath.Join(e.w.Dir(), "dir", "f")
			mustMkdir(t, filepath.Dir(target))
			mustWrite(t, target, "old")
			_, err := e.w.Save(ctx, "dir/f", bytes.NewReader(make([]byte, tc.size)), tc.max)
			if tc.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				if fi, _ := os.Stat(target); fi.Size() != int64(tc.size) {
					t.Errorf("size %d, want %d", fi.Size(), tc.size)
				}
				return
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("Save = %v, want %v", err, tc.err)
			}
			if tc.max == 1<<20 && !strings.Contains(err.Error(), "limit of 1 MiB (1048576 bytes)") {
				t.Errorf("error does not name the limit: %v", err)
			}
			if got := mustRead(t, target); got != "old" {
				t.Errorf("target is %d bytes, want the old content", len(got))
			}
			if left := temps(t, e.w.Dir()); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// cancelReader cancels its context after the first read.
type cancelReader struct {
	cancel context.CancelFunc
	n      int
}

func (r *cancelReader) Read(p []byte) (int, error) {
	r.n++
	if r.n > 1 {
		r.cancel()
	}
	return len(p), nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("client went away") }

func TestSaveAborted(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := e.w.Save(ctx, "a/f", &cancelReader{cancel: cancel}, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Save = %v, want context.Canceled", err)
	}
	_, err := e.w.Save(context.Background(), "a/f", io.MultiReader(strings.NewReader("part"), errReader{}), 0)
	if err == nil || !strings.Contains(err.Error(), "reading the upload: client went away") {
		t.Errorf("Save of a failing reader = %v", err)
	}
	if _, err := os.Lstat(filepath.Join(e.w.Dir(), "a", "f")); !os.IsNotExist(err) {
		t.Errorf("target exists: %v", err)
	}
	if left := temps(t, e.w.Dir()); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestSaveAtomic: a reader racing with Saves of the same file sees one
// whole version or the other, never a mix or a part.
func TestSaveAtomic(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	const size = 256 << 10
	versions := [][]byte{bytes.Repeat([]byte{'a'}, size), bytes.Repeat([]byte{'b'}, size)}
	if _, err := e.w.Save(ctx, "f", bytes.NewReader(versions[0]), 0); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad []string
	var reads int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			f, err := e.w.Open(context.Background(), "f")
			if err != nil {
				bad = append(bad, err.Error())
				continue
			}
			b, err := io.ReadAll(f)
			f.Close()
			reads++
			if err != nil || !bytes.Equal(b, versions[0]) && !bytes.Equal(b, versions[1]) {
				bad = append(bad, fmt.Sprintf("read %d bytes starting %q: %v", len(b), b[:min(len(b), 1)], err))
			}
		}
	}()
	for i := range 200 {
		if _, err := e.w.Save(ctx, "f", bytes.NewReader(versions[i%2]), 0); err != nil {
			t.Error(err)
			break
		}
	}
	close(stop)
	wg.Wait()
	if len(bad) > 0 {
		t.Errorf("%d of %d reads saw a partial or mixed file, first: %s", len(bad), reads, bad[0])
	}
}
