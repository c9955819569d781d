package workspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// managedEnv is a workspace with a conversation upload and a resource,
// and what sandboxed code can do to reach them: links to them and into
// them, and (as root, where the sandbox's root is another uid) uploads/
// renamed to "old" with a new one made in its place.
type managedEnv struct {
	*env
	managed []string // host paths of the managed trees
}

func newManagedEnv(t testing.TB) *managedEnv {
	t.Helper()
	e := newEnv(t)
	e.plant(t)
	d := e.w.Dir()
	if _, err := e.w.SaveUpload(context.Background(), "c1", "doc.pdf", strings.NewReader("%PDF"), 0); err != nil {
		t.Fatal(err)
	}
	mustMkdir(t, filepath.Join(d, ResourcesDir, "skills"))
	mustWrite(t, filepath.Join(d, ResourcesDir, "skills", "s.md"), "skill")
	root := testOwners().Root
	for _, p := range []string{ResourcesDir, ResourcesDir + "/skills", ResourcesDir + "/skills/s.md"} {
		if err := os.Lchown(filepath.Join(d, p), root.UID, root.GID); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"x": "uploads", "y": ResourcesDir, "z": "uploads/c1", "real/up": "../uploads", "w": "x",
	} {
		mustSymlink(t, target, filepath.Join(d, link))
	}
	me := &managedEnv{env: e, managed: []string{filepath.Join(d, "uploads"), filepath.Join(d, ResourcesDir)}}
	if os.Geteuid() == 0 {
		// What the sandbox user may do to a directory of its root's at
		// the top: rename it. The next sandbox start puts a new one back.
		if err := os.Rename(filepath.Join(d, "uploads"), filepath.Join(d, "old")); err != nil {
			t.Fatal(err)
		}
		if err := e.w.ensureUploads(); err != nil {
			t.Fatal(err)
		}
		me.managed[0] = filepath.Join(d, "old")
	}
	return me
}

func (me *managedEnv) trees(t testing.TB) map[string]string {
	t.Helper()
	all := map[string]string{}
	for _, m := range me.managed {
		for k, v := range tree(t, m) {
			all[k] = v
		}
	}
	return all
}

func (me *managedEnv) check(t testing.TB, want map[string]string) {
	t.Helper()
	got := me.trees(t)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("managed tree changed: %s: %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("managed trees changed: %d entries, want %d", len(got), len(want))
	}
}

// TestManagedByRealTarget: a client's write, move or remove that would
// land in uploads/ or .resources/ is refused whatever the path says:
// through a planted link, or by the name the sandbox renamed them to.
func TestManagedByRealTarget(t *testing.T) {
	ctx := context.Background()
	prefixes := []string{"x", "y", "z", "w", "real/up", "uploads", ".resources", "x/c1", "y/skills"}
	if os.Geteuid() == 0 {
		prefixes = append(prefixes, "old", "old/c1/temparea")
	}
	for _, p := range prefixes {
		t.Run(p, func(t *testing.T) {
			me := newManagedEnv(t)
			want := me.trees(t)
			refused := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("%s: %v, want refused", op, err)
				}
			}
			_, err := me.w.Save(ctx, p+"/new.txt", strings.NewReader("pwned"), 0)
			refused("Save", err)
			_, err = me.w.Save(ctx, p+"/c1/temparea/doc.pdf", strings.NewReader("pwned"), 0)
			refused("Save over an upload", err)
			refused("MakeDir", me.w.MakeDir(context.Background(), p+"/d"))
			refused("Rename into", me.w.Rename(context.Background(), "real/a.txt", p+"/a.txt"))
			refused("Rename out of", me.w.Rename(context.Background(), p+"/c1", "stolen"))
			refused("Rename out of", me.w.Rename(context.Background(), p+"/skills/s.md", "stolen"))
			refused("Remove below", me.w.Remove(context.Background(), p+"/c1", true))
			refused("Remove below", me.w.Remove(context.Background(), p+"/skills", true))
			if !strings.Contains(p, "/") && (p == "uploads" || p == ".resources" || p == "old") {
				refused("Remove", me.w.Remove(context.Background(), p, true))
				refused("Rename", me.w.Rename(context.Background(), p, "elsewhere"))
				refused("Replace", me.w.Rename(context.Background(), "real", p))
				_, err := me.w.Save(ctx, p, strings.NewReader("pwned"), 0)
				refused("Save over", err)
			}
			me.check(t, want)
		})
	}
	// The links themselves are the user's: moving or removing one
	// changes nothing it points to.
	me := newManagedEnv(t)
	want := me.trees(t)
	if err := me.w.Rename(context.Background(), "x", "x2"); err != nil {
		t.Errorf("moving the link x: %v", err)
	}
	if err := me.w.Remove(context.Background(), "y", true); err != nil {
		t.Errorf("removing the link y: %v", err)
	}
	if _, err := me.w.Save(ctx, "z", strings.NewReader("replaces the link"), 0); err != nil {
		t.Errorf("replacing the link z: %v", err)
	}
	me.check(t, want)
	// sbx's own calls still reach them.
	if err := me.w.RemoveUpload(context.Background(), "uploads/c1", true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("RemoveUpload: %v", err)
	}
}

// FuzzManagedPaths sends arbitrary paths through every operation that
// changes files, on a workspace where links lead into uploads/ and
// .resources/ (and, as root, uploads/ has been renamed): the managed
// trees must stay as they were, and every failure must be a client error.
func FuzzManagedPaths(f *testing.F) {
	for _, s := range []string{
		"x/c1/temparea/doc.pdf", "y/skills/s.md", "z/temparea", "w/c1", "real/up/c1", "old/c1/temparea/doc.pdf",
		"old", "uploads", ".resources/skills", "real/a.txt", "x", "inlink/a.txt", "fifo/x", "absdir/x",
	} {
		f.Add(s, "real/a.txt", uint8(0))
	}
	f.Add("real/a.txt", "x/c1/moved", uint8(1))
	f.Add("real", "old", uint8(1))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, p, q string, flags uint8) {
		me := newManagedEnv(t)
		want := me.trees(t)
		outside := tree(t, me.outside)
		check := func(op string, err error) {
			if err != nil && !clientError(err) && !errors.Is(err, errdefs.ErrAlreadyExists) {
				t.Errorf("%s %q %q: internal error %v", op, p, q, err)
			}
		}
		_, err := me.w.Save(ctx, p, strings.NewReader("pwned"), 1<<10)
		check("save", err)
		check("mkdir", me.w.MakeDir(context.Background(), p))
		check("rename", me.w.Rename(context.Background(), p, q))
		check("rename back", me.w.Rename(context.Background(), q, p))
		check("remove", me.w.Remove(context.Background(), p, flags&1 != 0))
		me.check(t, want)
		me.checkOutside(t, outside)
	})
}

// TestRefusedWriteMakesNothing: a write to uploads/x while the sandbox has
// renamed uploads/ away is refused before it makes a directory of that
// name (which would be the user's).
func TestRefusedWriteMakesNothing(t *testing.T) {
	e := newEnv(t)
	d := e.w.Dir()
	if err := os.Rename(filepath.Join(d, "uploads"), filepath.Join(d, "gone")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"uploads/c1/temparea/x", ".resources/x"} {
		if _, err := e.w.Save(context.Background(), p, strings.NewReader("x"), 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Save(%q) = %v, want refused", p, err)
		}
		if err := e.w.MakeDir(context.Background(), p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("MakeDir(%q) = %v, want refused", p, err)
		}
	}
	for _, name := range []string{"uploads", ".resources"} {
		if _, err := os.Lstat(filepath.Join(d, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was made: %v", name, err)
		}
	}
}
