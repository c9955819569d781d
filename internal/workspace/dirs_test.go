package workspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestStatMakeDirRename(t *testing.T) {
	e := newEnv(t)
	e.plant(t)
	fi, err := e.w.Stat(context.Background(), "real/a.txt")
	if err != nil || fi.Size != 1 || fi.Type != "file" {
		t.Fatalf("Stat(real/a.txt) = %v, %v", fi, err)
	}
	if fi, err := e.w.Stat(context.Background(), "inlink"); err != nil || fi.Type != "symlink" || fi.Target != "real" {
		t.Fatalf("Stat(inlink) = %v, %v; want the link itself, to real", fi, err)
	}
	if _, err := e.w.Stat(context.Background(), "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Stat(nope) = %v, want ErrNotFound", err)
	}

	if err := e.w.MakeDir(context.Background(), "made/deep/er"); err != nil {
		t.Fatal(err)
	}
	if fi, err := e.w.Stat(context.Background(), "made/deep/er"); err != nil || fi.Type != "dir" {
		t.Fatalf("Stat(made/deep/er) = %v, %v", fi, err)
	}
	if err := e.w.MakeDir(context.Background(), "made/deep"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("MakeDir(existing) = %v, want ErrAlreadyExists", err)
	}
	if err := e.w.MakeDir(context.Background(), "real/a.txt"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("MakeDir(a file) = %v, want ErrInvalidArgument", err)
	}

	if err := e.w.Rename(context.Background(), "real/a.txt", "made/a.txt"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(e.w.Dir(), "made/a.txt")); err != nil || string(b) != "a" {
		t.Fatalf("after Rename: %q, %v", b, err)
	}
	if err := e.w.Rename(context.Background(), "real/a.txt", "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Rename(gone) = %v, want ErrNotFound", err)
	}
	for _, bad := range [][2]string{{".", "x"}, {"made", "."}, {"../x", "y"}, {"made", "/etc/x"}} {
		if err := e.w.Rename(context.Background(), bad[0], bad[1]); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Rename(%q, %q) = %v, want ErrInvalidArgument", bad[0], bad[1], err)
		}
	}
}

// TestDirsEscapes: the new operations refuse paths through planted links
// that lead out, and leave the outside as it was.
func TestDirsEscapes(t *testing.T) {
	for _, p := range []string{"absdir/new", "reldir/sub/new", "nested/up/new", "loop/x"} {
		t.Run(p, func(t *testing.T) {
			e := newEnv(t)
			e.plant(t)
			want := tree(t, e.outside)
			if err := e.w.MakeDir(context.Background(), p); err == nil || !clientError(err) {
				t.Errorf("MakeDir(%q) = %v, want a client error", p, err)
			}
			if err := e.w.Rename(context.Background(), "real/a.txt", p); err == nil || !clientError(err) {
				t.Errorf("Rename(real/a.txt, %q) = %v, want a client error", p, err)
			}
			if _, err := e.w.Stat(context.Background(), p); err == nil || !clientError(err) {
				t.Errorf("Stat(%q) = %v, want a client error", p, err)
			}
			e.checkOutside(t, want)
		})
	}
	e := newEnv(t)
	e.plant(t)
	want := tree(t, e.outside)
	// Moving a link that leads out moves the link, not its target.
	if err := e.w.Rename(context.Background(), "absdir", "moved"); err != nil {
		t.Fatal(err)
	}
	e.checkOutside(t, want)
}
