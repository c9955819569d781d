package template

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func requiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown to other users, chroot, mount namespaces)")
	}
}

func TestShiftOwnership(t *testing.T) {
	requiresRoot(t)
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755))
	must(os.Mkdir(filepath.Join(root, "home"), 0o755))
	must(syscall.Chmod(filepath.Join(root, "home"), 0o2775))
	su := filepath.Join(root, "usr/bin/su")
	must(os.WriteFile(su, []byte("x"), 0o755))
	must(syscall.Chmod(su, 0o4755))
	sg := filepath.Join(root, "usr/bin/wall")
	must(os.WriteFile(sg, []byte("x"), 0o755))
	must(os.Chown(sg, 0, 5))
	must(syscall.Chmod(sg, 0o2755))
	owned := filepath.Join(root, "home/owned")
	must(os.WriteFile(owned, nil, 0o600))
	must(os.Chown(owned, 1000, 1000))
	must(os.Symlink("/usr/bin/su", filepath.Join(root, "link")))
	must(os.Link(owned, filepath.Join(root, "hardlink")))

	size, err := shiftOwnership(context.Background(), root, 100000)
	if err != nil {
		t.Fatal(err)
	}
	if size <= 0 {
		t.Errorf("size = %d", size)
	}
	want := map[string]struct {
		uid, gid uint32
		mode     uint32
	}{
		"":             {100000, 100000, 0},
		"usr/bin/su":   {100000, 100000, 0o4755},
		"usr/bin/wall": {100000, 100005, 0o2755},
		"home":         {100000, 100000, 0o2775},
		"home/owned":   {101000, 101000, 0o600},
		"hardlink":     {101000, 101000, 0o600}, // shifted once, not twice
		"link":         {100000, 100000, 0},
	}
	for p, w := range want {
		var st syscall.Stat_t
		must(syscall.Lstat(filepath.Join(root, p), &st))
		if st.Uid != w.uid || st.Gid != w.gid {
			t.Errorf("%s: owner %d:%d, want %d:%d", p, st.Uid, st.Gid, w.uid, w.gid)
		}
		if w.mode != 0 && st.Mode&0o7777 != w.mode {
			t.Errorf("%s: mode %o, want %o", p, st.Mode&0o7777, w.mode)
		}
	}
	if target, err := os.Readlink(filepath.Join(root, "link")); err != nil || target != "/usr/bin/su" {
		t.Errorf("symlink target %q, %v", target, err)
	}

	// An owner outside the mapped range would be unreachable from inside.
	must(os.Chown(owned, 70000, 0))
	if _, err := shiftOwnership(context.Background(), root, 100000); err == nil {
		t.Error("an owner beyond 65535 was shifted")
	}
}

func TestSweepTmp(t *testing.T) {
	dir := t.TempDir()
	tmp, locks := filepath.Join(dir, "tmp"), filepath.Join(dir, "locks")
	for _, d := range []string{tmp, locks} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A dead build's directory (its lock is free) and a live one's.
	dead := filepath.Join(tmp, "aaaa.99999999.00000000")
	live := filepath.Join(tmp, tmpName("bbbb"))
	for _, d := range []string{dead, live} {
		if err := os.MkdirAll(filepath.Join(d, "rootfs/etc"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lock, err := lockFile(context.Background(), filepath.Join(locks, "bbbb.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlockFile(lock)
	if err := sweepTmp(tmp, locks); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("dead build's directory is still there (%v)", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("live build's directory was removed: %v", err)
	}
}

func TestRemoveStale(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"aaaa.1.x", "aaaa.2.y", "aaaab.1.z", "bbbb.1.x"} {
		if err := os.MkdirAll(filepath.Join(dir, name, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := removeStale(dir, "aaaa"); err != nil {
		t.Fatal(err)
	}
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if strings.Join(left, " ") != "aaaab.1.z bbbb.1.x" {
		t.Errorf("left %v", left)
	}
}

func TestLockExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	a, err := lockFile(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := tryLockFile(path); ok || err != nil {
		t.Fatalf("a second lock was granted (%v)", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := lockFile(ctx, path); err != context.Canceled {
		t.Errorf("waiting with a cancelled context: %v", err)
	}
	unlockFile(a)
	b, ok, err := tryLockFile(path)
	if !ok || err != nil {
		t.Fatalf("lock not granted after release: %v", err)
	}
	unlockFile(b)
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:            "/plain",
		`/with\040space`:    "/with space",
		`/tab\011and\134bs`: "/tab\tand\\bs",
		`/trailing\04`:      `/trailing\04`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMountsUnder(t *testing.T) {
	mps, err := mountsUnder("/")
	if err != nil || len(mps) == 0 || mps[len(mps)-1] != "/" {
		t.Fatalf("mountsUnder(/) = %v, %v; want / last", mps, err)
	}
	if mps, err := mountsUnder(t.TempDir()); err != nil || len(mps) != 0 {
		t.Errorf("mountsUnder(a fresh dir) = %v, %v", mps, err)
	}
}

func TestLineWriter(t *testing.T) {
	var out strings.Builder
	w := &lineWriter{p: newProgress(&out, 1)}
	io.WriteString(w, "one\ntw")
	io.WriteString(w, "o\r\n\nthree")
	w.flush()
	if got := out.String(); got != "    one\n    two\n    three\n" {
		t.Errorf("output %q", got)
	}
	for i := 0; i < 40; i++ {
		io.WriteString(w, "line\n")
	}
	if len(w.tail) != tailLines {
		t.Errorf("tail keeps %d lines", len(w.tail))
	}
}
