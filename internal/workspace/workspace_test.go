package workspace

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// TestEscapeIsInvalidArgument pins the os.Root behaviour errors.go relies
// on: a link out of the root fails with the error captured from a leading
// slash.
func TestEscapeIsInvalidArgument(t *testing.T) {
	e := newEnv(t)
	e.plant(t)
	for _, name := range []string{"absdir/secret", "reldir/secret", "absfile", "relfile", "nested/up/secret"} {
		t.Run(name, func(t *testing.T) {
			_, err := e.w.root.Stat(name)
			if !isEscape(err) {
				t.Fatalf("Root.Stat(%q) = %v, not the escape error", name, err)
			}
			if _, err := e.w.Open(context.Background(), name); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Open(%q) = %v, want ErrInvalidArgument", name, err)
			}
		})
	}
}

// TestEscapes runs every operation through every planted link that leads
// out: each must fail with a client error or act on the link itself, and
// leave the outside as it was.
func TestEscapes(t *testing.T) {
	type op struct {
		name string
		do   func(w *Local, p string) error
	}
	save := op{"save", func(w *Local, p string) error {
		_, err := w.Save(context.Background(), p, strings.NewReader("pwned"), 0)
		return err
	}}
	open := op{"open", func(w *Local, p string) error {
		f, err := w.Open(context.Background(), p)
		if err == nil {
			f.Close()
		}
		return err
	}}
	list := op{"list", func(w *Local, p string) error { _, _, err := w.List(context.Background(), p, false, 0); return err }}
	listR := op{"list recursive", func(w *Local, p string) error { _, _, err := w.List(context.Background(), p, true, 0); return err }}
	remove := op{"remove", func(w *Local, p string) error { return w.Remove(context.Background(), p, false) }}
	removeR := op{"remove recursive", func(w *Local, p string) error { return w.Remove(context.Background(), p, true) }}
	all := []op{save, open, list, listR, remove, removeR}

	cases := []struct {
		path string
		ops  []op
	}{
		// Through a link to a directory outside: refused.
		{"absdir/secret", all},
		{"absdir/sub", all},
		{"absdir/sub/f", all},
		{"absdir/new/deeper/x", []op{save}},
		{"reldir/secret", all},
		{"reldir/sub", all},
		{"reldir/new", []op{save}},
		{"nested/up/secret", all},
		{"nested/up/sub/f", all},
		{"nested/up/new/x", []op{save}},
		{"loop/x", all},
		// The link itself, followed: refused.
		{"absdir", []op{open, list, listR}},
		{"reldir", []op{open, list, listR}},
		{"absfile", []op{open, list, listR}},
		{"relfile", []op{open, list, listR}},
		{"nested/up", []op{open, list, listR}},
		{"loop", []op{open, list, listR}},
	}
	for _, tc := range cases {
		for _, o := range tc.ops {
			t.Run(o.name+" "+tc.path, func(t *testing.T) {
				e := newEnv(t)
				e.plant(t)
				want := tree(t, e.outside)
				err := o.do(e.w, tc.path)
				if err == nil || !clientError(err) {
					t.Errorf("%s %q: %v, want a client error", o.name, tc.path, err)
				}
				e.checkOutside(t, want)
			})
		}
	}

	// Acting on the link itself: allowed, and only the link changes.
	for _, name := range []string{"absdir", "reldir", "absfile", "relfile", "nested/up", "loop"} {
		for _, o := range []op{save, remove, removeR} {
			t.Run(o.name+" link "+name, func(t *testing.T) {
				e := newEnv(t)
				e.plant(t)
				want := tree(t, e.outside)
				if err := o.do(e.w, name); err != nil {
					t.Fatalf("%s %q: %v", o.name, name, err)
				}
				e.checkOutside(t, want)
				fi, err := os.Lstat(filepath.Join(e.w.Dir(), name))
				if o.name == "save" {
					if err != nil || !fi.Mode().IsRegular() || mustRead(t, filepath.Join(e.w.Dir(), name)) != "pwned" {
						t.Errorf("save did not replace the link with a file: %v, %v", fi, err)
					}
				} else if !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("remove left %v, %v", fi, err)
				}
			})
		}
	}
}

// TestInsideLinks: links that stay inside are followed by reads at the top
// of a path and on the way, and listed (not followed) below a listed
// directory.
func TestInsideLinks(t *testing.T) {
	e := newEnv(t)
	e.plant(t)
	ctx := context.Background()

	f, err := e.w.Open(context.Background(), "infile")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "a" || f.Info().Size != 1 {
		t.Errorf("Open(infile) = %q, size %d", b, f.Info().Size)
	}
	// A write is different: it names the real path (resolve.go).
	if _, err := e.w.Save(ctx, "nested/back/new.txt", strings.NewReader("via link"), 0); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("Save through nested/back = %v, want refused as a link", err)
	}
	if _, err := os.Lstat(filepath.Join(e.w.Dir(), "real", "new.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("saved through nested/back: %v", err)
	}
	ents, _, err := e.w.List(context.Background(), "inlink", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(ents); got != "inlink/a.txt inlink/deep" {
		t.Errorf("List(inlink) = %s", got)
	}
}

func paths(ents []Entry) string {
	var p []string
	for _, e := range ents {
		p = append(p, e.Path)
	}
	return strings.Join(p, " ")
}

// TestFIFO: a FIFO planted by the sandbox never blocks an operation.
func TestFIFO(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.plant(t)
	mustSymlink(t, "fifo", filepath.Join(e.w.Dir(), "tofifo"))

	for _, p := range []string{"fifo", "tofifo"} {
		t.Run("open "+p, func(t *testing.T) {
			f, err := e.w.Open(context.Background(), p)
			if err == nil {
				f.Close()
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "not a regular file") {
				t.Fatalf("Open(%s) = %v, want not a regular file", p, err)
			}
		})
	}
	t.Run("save under", func(t *testing.T) {
		_, err := e.w.Save(ctx, "fifo/x", strings.NewReader("x"), 0)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("Save(fifo/x) = %v, want ErrInvalidArgument", err)
		}
	})
	t.Run("list", func(t *testing.T) {
		ents, _, err := e.w.List(context.Background(), "fifo", false, 0)
		if err != nil || len(ents) != 1 || ents[0].Type != "other" {
			t.Fatalf("List(fifo) = %v, %v", ents, err)
		}
		if _, _, err := e.w.List(context.Background(), "fifo/x", false, 0); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("List(fifo/x) = %v, want ErrNotFound", err)
		}
	})
	t.Run("usage", func(t *testing.T) {
		if _, _, err := e.w.Usage(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("save over", func(t *testing.T) {
		if _, err := e.w.Save(ctx, "fifo", strings.NewReader("now a file"), 0); err != nil {
			t.Fatal(err)
		}
		if got := mustRead(t, filepath.Join(e.w.Dir(), "fifo")); got != "now a file" {
			t.Errorf("content %q", got)
		}
	})
}

func TestOpen(t *testing.T) {
	e := newEnv(t)
	e.plant(t)
	for _, tc := range []struct {
		path string
		err  error
		msg  string
	}{
		{"real/a.txt", nil, ""},
		{"./real//a.txt", nil, ""},
		{".", errdefs.ErrInvalidArgument, "is a directory"},
		{"real", errdefs.ErrInvalidArgument, "is a directory"},
		{"inlink", errdefs.ErrInvalidArgument, "is a directory"},
		{"missing", errdefs.ErrNotFound, "no such file"},
		{"real/a.txt/x", errdefs.ErrNotFound, "not a directory"},
		{"../ws/s1/real/a.txt", errdefs.ErrInvalidArgument, `contains ".."`},
		{e.w.Dir() + "/real/a.txt", errdefs.ErrInvalidArgument, "must be relative"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			f, err := e.w.Open(context.Background(), tc.path)
			if tc.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if b, _ := io.ReadAll(f); string(b) != "a" || f.Info().Type != "file" {
					t.Errorf("read %q, type %v", b, f.Info().Type)
				}
				return
			}
			if err == nil {
				f.Close()
			}
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Open(%q) = %v, want %v saying %q", tc.path, err, tc.err, tc.msg)
			}
		})
	}
}

func TestRemove(t *testing.T) {
	for _, tc := range []struct {
		path      string
		recursive bool
		err       error
		gone      string // host path relative to the workspace that must be gone
		stays     string // and one that must stay
	}{
		{"real/a.txt", false, nil, "real/a.txt", "real/deep/b.txt"},
		{"real", false, errdefs.ErrInvalidArgument, "", "real/a.txt"},
		{"real", true, nil, "real", "nested"},
		{"inlink", true, nil, "inlink", "real/a.txt"},
		{"infile", false, nil, "infile", "real/a.txt"},
		{"nested/back", false, nil, "nested/back", "real/a.txt"},
		{"fifo", false, nil, "fifo", ""},
		{"missing", false, errdefs.ErrNotFound, "", ""},
		{"missing/deeper", true, errdefs.ErrNotFound, "", ""},
		{".", true, errdefs.ErrInvalidArgument, "", "real"},
		{"", true, errdefs.ErrInvalidArgument, "", "real"},
		{"../s1", true, errdefs.ErrInvalidArgument, "", "real"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			e := newEnv(t)
			e.plant(t)
			err := e.w.Remove(context.Background(), tc.path, tc.recursive)
			if tc.err == nil && err != nil || tc.err != nil && !errors.Is(err, tc.err) {
				t.Fatalf("Remove(%q, %v) = %v, want %v", tc.path, tc.recursive, err, tc.err)
			}
			if tc.gone != "" {
				if _, err := os.Lstat(filepath.Join(e.w.Dir(), tc.gone)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s still there: %v", tc.gone, err)
				}
			}
			if tc.stays != "" {
				if _, err := os.Lstat(filepath.Join(e.w.Dir(), tc.stays)); err != nil {
					t.Errorf("%s gone: %v", tc.stays, err)
				}
			}
		})
	}
}

func TestRemoveConversation(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	for _, cid := range []string{"c1", "c2"} {
		if _, err := e.w.SaveUpload(ctx, cid, "doc.pdf", strings.NewReader(cid), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.w.RemoveConversation(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(e.w.Dir(), "uploads", "c1")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("uploads/c1 still there: %v", err)
	}
	if got := mustRead(t, filepath.Join(e.w.Dir(), "uploads", "c2", "temparea", "doc.pdf")); got != "c2" {
		t.Errorf("c2's upload: %q", got)
	}
	if err := e.w.RemoveConversation(context.Background(), "c1"); err != nil {
		t.Errorf("second removal: %v", err)
	}
	for _, bad := range []string{"", "..", "../s1", "a/b", ".x", "c1\x00"} {
		t.Run(bad, func(t *testing.T) {
			if err := e.w.RemoveConversation(context.Background(), bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("RemoveConversation(%q) = %v, want ErrInvalidArgument", bad, err)
			}
		})
	}
}

func TestCreateOpen(t *testing.T) {
	base := t.TempDir()
	if _, err := Open(filepath.Join(base, "nope"), testOwners()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open(missing) = %v, want ErrNotFound", err)
	}
	if _, err := Create(filepath.Join(base, "no", "parent"), testOwners()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Create(no parent) = %v, want ErrNotFound", err)
	}
	if _, err := Create("/", testOwners()); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf(`Create("/") = %v, want ErrInvalidArgument`, err)
	}
	dir := filepath.Join(base, "ws")
	w, err := Create(dir, testOwners())
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	// Again, over what the sandbox may have planted as "uploads".
	os.Remove(filepath.Join(dir, "uploads"))
	outside := filepath.Join(base, "outside")
	mustMkdir(t, outside)
	mustSymlink(t, outside, filepath.Join(dir, "uploads"))
	w, err = Create(dir, testOwners())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if fi, err := os.Lstat(filepath.Join(dir, "uploads")); err != nil || !fi.IsDir() {
		t.Errorf("uploads not repaired: %v, %v", fi, err)
	}
	if fi, err := os.Stat(outside); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("outside changed: %v, %v", fi, err)
	}
	w2, err := Open(dir, testOwners())
	if err != nil {
		t.Fatal(err)
	}
	w2.Close()
	if w.Dir() != dir {
		t.Errorf("Dir() = %q, want %q", w.Dir(), dir)
	}
}

func TestOwners(t *testing.T) {
	requiresRoot(t)
	ctx := context.Background()
	owners := testOwners()
	e := newEnv(t)
	d := e.w.Dir()
	check := func(t *testing.T, rel string, o Owner, mode fs.FileMode) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(d, rel))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != o.UID || int(st.Gid) != o.GID || fi.Mode() != mode {
			t.Errorf("%s: %d:%d %v, want %d:%d %v", rel, st.Uid, st.Gid, fi.Mode(), o.UID, o.GID, mode)
		}
	}
	t.Run("create", func(t *testing.T) {
		check(t, ".", owners.User, fs.ModeDir|0o711)
		check(t, "uploads", owners.Root, fs.ModeDir|0o755)
	})
	t.Run("user file", func(t *testing.T) {
		if _, err := e.w.save(ctx, "x/y/z.txt", userArea, strings.NewReader("z"), 0, owners.User, 0o640); err != nil {
			t.Fatal(err)
		}
		check(t, "x", owners.User, fs.ModeDir|0o750)
		check(t, "x/y", owners.User, fs.ModeDir|0o750)
		check(t, "x/y/z.txt", owners.User, 0o640)
	})
	t.Run("conversation upload", func(t *testing.T) {
		if _, err := e.w.SaveUpload(ctx, "c1", "report.pdf", strings.NewReader("%PDF"), 0); err != nil {
			t.Fatal(err)
		}
		check(t, "uploads", owners.Root, fs.ModeDir|0o755)
		check(t, "uploads/c1", owners.Root, fs.ModeDir|0o755)
		check(t, "uploads/c1/temparea", owners.Root, fs.ModeDir|0o755)
		check(t, "uploads/c1/temparea/report.pdf", owners.Root, 0o644)
	})
	t.Run("existing parent kept", func(t *testing.T) {
		mustMkdir(t, filepath.Join(d, "mine"))
		if err := os.Chown(filepath.Join(d, "mine"), 4242, 4242); err != nil {
			t.Fatal(err)
		}
		if _, err := e.w.save(ctx, "mine/f", userArea, strings.NewReader("f"), 0, owners.Root, 0o600|fs.ModeSetuid); err != nil {
			t.Fatal(err)
		}
		check(t, "mine", Owner{4242, 4242}, fs.ModeDir|0o755)
		check(t, "mine/f", owners.Root, 0o600) // set-id bits dropped
	})
}

func TestDestroy(t *testing.T) {
	e := newEnv(t)
	e.plant(t)
	// Also a link to the workspaces' parent and one to the workspace's
	// own host path.
	mustSymlink(t, e.base, filepath.Join(e.w.Dir(), "base"))
	mustSymlink(t, e.w.Dir(), filepath.Join(e.w.Dir(), "real", "deep", "self"))
	want := tree(t, e.outside)
	if err := e.w.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(e.w.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("workspace still there: %v", err)
	}
	e.checkOutside(t, want)
	if _, err := os.Stat(filepath.Join(e.base, "ws")); err != nil {
		t.Errorf("parent of the workspace gone: %v", err)
	}
	if err := e.w.Destroy(); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
}
