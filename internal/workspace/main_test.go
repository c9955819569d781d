package workspace

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// requiresRoot skips a test that gives files to other users.
func requiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: chown to the sandbox's ids")
	}
}

// testOwners are the sandbox ids when the tests run as root, and the
// test's own otherwise (chown to oneself needs no privilege).
func testOwners() Owners {
	if os.Geteuid() == 0 {
		return Owners{Root: Owner{100000, 100000}, User: Owner{101000, 101000}}
	}
	self := Owner{os.Getuid(), os.Getgid()}
	return Owners{Root: self, User: self}
}

// env is a workspace at base/ws/s1 next to base/outside, a directory that
// no operation on the workspace may touch.
type env struct {
	w       *Local
	base    string
	outside string
	user    Owner
}

func newEnv(t testing.TB) *env {
	t.Helper()
	base := t.TempDir()
	e := &env{base: base, outside: filepath.Join(base, "outside"), user: testOwners().User}
	mustMkdir(t, filepath.Join(e.outside, "sub"))
	mustWrite(t, filepath.Join(e.outside, "secret"), "top secret")
	mustWrite(t, filepath.Join(e.outside, "sub", "f"), "sub secret")
	mustMkdir(t, filepath.Join(base, "ws"))
	w, err := Create(filepath.Join(base, "ws", "s1"), testOwners())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	e.w = w
	return e
}

// escapes are links planted by the sandbox that lead out of the workspace.
var escapes = []struct{ name, target string }{
	{"absdir", "OUTSIDE"},
	{"reldir", "../../outside"},
	{"absfile", "OUTSIDE/secret"},
	{"relfile", "../../outside/secret"},
	{"nested/up", "../../../outside"},
	{"loop", "loop"},
}

// plant makes the escapes, a few honest files, links that stay inside
// and a FIFO.
func (e *env) plant(t testing.TB) {
	t.Helper()
	d := e.w.Dir()
	mustMkdir(t, filepath.Join(d, "nested"))
	mustMkdir(t, filepath.Join(d, "real", "deep"))
	mustWrite(t, filepath.Join(d, "real", "a.txt"), "a")
	mustWrite(t, filepath.Join(d, "real", "deep", "b.txt"), "bb")
	for _, l := range escapes {
		mustSymlink(t, strings.ReplaceAll(l.target, "OUTSIDE", e.outside), filepath.Join(d, l.name))
	}
	mustSymlink(t, "real", filepath.Join(d, "inlink"))
	mustSymlink(t, "real/a.txt", filepath.Join(d, "infile"))
	mustSymlink(t, "../real", filepath.Join(d, "nested", "back"))
	if err := syscall.Mkfifo(filepath.Join(d, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// tree describes everything under dir without following links: type,
// mode, owner and content or link target.
func tree(t testing.TB, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fi.Mode().String() + " " + strconv.Itoa(int(st.Uid)) + ":" + strconv.Itoa(int(st.Gid)) + " "
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			desc += "-> " + l
		}
		m[p] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (e *env) checkOutside(t testing.TB, want map[string]string) {
	t.Helper()
	got := tree(t, e.outside)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("outside changed: %s: %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("outside changed: %d entries, want %d", len(got), len(want))
	}
}

// clientError reports whether err is one the HTTP layer answers with a
// 4xx: what the sandbox provokes must never be an internal error.
func clientError(err error) bool {
	return errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrNotFound) ||
		errors.Is(err, errdefs.ErrResourceExhausted)
}

func mustMkdir(t testing.TB, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t testing.TB, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t testing.TB, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
