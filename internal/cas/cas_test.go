package cas

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func TestPut(t *testing.T) {
	s, err := New(t.TempDir(), os.Getuid(), os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n, created, err := s.Put(ctx, "t1", sum("hello"), strings.NewReader("hello"), 100)
	if err != nil || n != 5 || !created {
		t.Fatalf("Put: %d %v %v", n, created, err)
	}
	p, ok := s.Path("t1", sum("hello"))
	if b, _ := os.ReadFile(p); !ok || string(b) != "hello" {
		t.Fatalf("Path: %q %v", b, ok)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o444 {
		t.Fatalf("mode %v", fi.Mode())
	}
	if _, created, err := s.Put(ctx, "t1", sum("hello"), strings.NewReader("hello"), 100); err != nil || created {
		t.Fatalf("second Put: %v %v", created, err)
	}
	// Tenants do not share content: t2 cannot learn that t1 has it.
	if _, ok := s.Path("t2", sum("hello")); ok {
		t.Fatal("t2 sees t1's content")
	}
	if _, _, err := s.Put(ctx, "t1", sum("hello"), strings.NewReader("hellO"), 100); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("wrong content: %v", err)
	}
	if _, _, err := s.Put(ctx, "t1", sum("hello"), strings.NewReader("hello"), 4); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("too large: %v", err)
	}
	for _, bad := range []string{"", "../x", strings.Repeat("A", 64), strings.Repeat("a", 63)} {
		if _, _, err := s.Put(ctx, "t1", bad, strings.NewReader(""), 4); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("hash %q: %v", bad, err)
		}
		if _, ok := s.Path("t1", bad); ok {
			t.Fatalf("Path(%q) ok", bad)
		}
	}
	// No temporary file is left by the failures.
	filepath.WalkDir(s.dir, func(p string, d os.DirEntry, err error) error {
		if strings.HasPrefix(d.Name(), ".tmp-") {
			t.Errorf("left behind: %s", p)
		}
		return nil
	})
}

func TestCollect(t *testing.T) {
	dir := t.TempDir()
	s, _ := New(filepath.Join(dir, "cas"), os.Getuid(), os.Getgid())
	ctx := context.Background()
	for _, c := range []string{"linked", "unused", "fresh"} {
		if _, _, err := s.Put(ctx, "t", sum(c), strings.NewReader(c), 100); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Hour)
	for _, c := range []string{"linked", "unused"} {
		p, _ := s.Path("t", sum(c))
		os.Chtimes(p, old, old)
	}
	linked, _ := s.Path("t", sum("linked"))
	if err := os.Link(linked, filepath.Join(dir, "in-a-workspace")); err != nil {
		t.Fatal(err)
	}
	files, bytes, err := s.Collect(time.Hour)
	if err != nil || files != 1 || bytes != int64(len("unused")) {
		t.Fatalf("Collect: %d files, %d bytes, %v", files, bytes, err)
	}
	for c, want := range map[string]bool{"linked": true, "unused": false, "fresh": true} {
		if _, ok := s.Path("t", sum(c)); ok != want {
			t.Errorf("%s: present %v, want %v", c, ok, want)
		}
	}
	// Sending collected-soon content again protects it for a grace.
	p, _ := s.Path("t", sum("fresh"))
	os.Chtimes(p, old, old)
	s.Put(ctx, "t", sum("fresh"), strings.NewReader("fresh"), 100)
	if files, _, _ := s.Collect(time.Hour); files != 0 {
		t.Fatalf("collected content just sent again")
	}
}
