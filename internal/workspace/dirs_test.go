package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestStatMakeDirRename(t *testing.T) {
	e := newEnv(t)
	e.plant(t)
	fi, err := e.w.Stat("real/a.txt")
	if err != nil || fi.Size() != 1 || !fi.Mode().IsRegular() {
		t.Fatalf("Stat(real/a.txt) = %v, %v", fi, err)
	}
	if fi, err := e.w.Stat("inlink"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("Stat(inlink) = %v, %v; want the link itself", fi, err)
	}
	if target, err := e.w.Readlink("inlink"); err != nil || target != "real" {
		t.Fatalf("Readlink(inlink) = %q, %v", target, err)
	}
	if _, err := e.w.Stat("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Stat(nope) = %v, want ErrNotFound", err)
	}

	if err := e.w.MakeDir("made/deep/er", e.user); err != nil {
		t.Fatal(err)
	}
	if fi, err := e.w.Stat("made/deep/er"); err != nil || !fi.IsDir() {
		t.Fatalf("Stat(made/deep/er) = %v, %v", fi, err)
	}
	if err := e.w.MakeDir("made/deep", e.user); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("MakeDir(existing) = %v, want ErrAlreadyExists", err)
	}
	if err := e.w.MakeDir("real/a.txt", e.user); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("MakeDir(a file) = %v, want ErrInvalidArgument", err)
	}

	if err := e.w.Rename("real/a.txt", "made/a.txt"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(e.w.Dir(), "made/a.txt")); err != nil || string(b) != "a" {
		t.Fatalf("after Rename: %q, %v", b, err)
	}
	if err := e.w.Rename("real/a.txt", "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Rename(gone) = %v, want ErrNotFound", err)
	}
	for _, bad := range [][2]string{{".", "x"}, {"made", "."}, {"../x", "y"}, {"made", "/etc/x"}} {
		if err := e.w.Rename(bad[0], bad[1]); !errors.Is(err, errdefs.ErrInvalidArgument) {
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
			if err := e.w.MakeDir(p, e.user); err == nil || !clientError(err) {
				t.Errorf("MakeDir(%q) = %v, want a client error", p, err)
			}
			if err := e.w.Rename("real/a.txt", p); err == nil || !clientError(err) {
				t.Errorf("Rename(real/a.txt, %q) = %v, want a client error", p, err)
			}
			if _, err := e.w.Stat(p); err == nil || !clientError(err) {
				t.Errorf("Stat(%q) = %v, want a client error", p, err)
			}
			e.checkOutside(t, want)
		})
	}
	e := newEnv(t)
	e.plant(t)
	want := tree(t, e.outside)
	// Moving a link that leads out moves the link, not its target.
	if err := e.w.Rename("absdir", "moved"); err != nil {
		t.Fatal(err)
	}
	e.checkOutside(t, want)
}
