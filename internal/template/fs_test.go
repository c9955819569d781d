package template

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func requiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown to other users, chroot, mount namespaces)")
	}
}

func TestFinishTree(t *testing.T) {
	requiresRoot(t)
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	const shift = 100000
	must(os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755))
	must(os.Mkdir(filepath.Join(root, "home"), 0o755))
	must(syscall.Chmod(filepath.Join(root, "home"), 0o3775))
	su := filepath.Join(root, "usr/bin/su")
	must(os.WriteFile(su, []byte("x"), 0o755))
	must(syscall.Chmod(su, 0o4755))
	sg := filepath.Join(root, "usr/bin/wall")
	must(os.WriteFile(sg, []byte("x"), 0o755))
	must(syscall.Chmod(sg, 0o2755))
	ping := filepath.Join(root, "usr/bin/ping")
	must(os.WriteFile(ping, []byte("x"), 0o755))
	// cap_net_raw+ep, as a v2 security.capability value.
	capNetRaw := []byte{0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	must(unix.Lsetxattr(ping, "security.capability", capNetRaw, 0))
	owned := filepath.Join(root, "home/owned")
	must(os.WriteFile(owned, nil, 0o600))
	must(os.Symlink("/usr/bin/su", filepath.Join(root, "link")))
	must(os.Link(owned, filepath.Join(root, "hardlink")))
	must(filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, shift, shift)
	}))
	must(os.Lchown(owned, shift+1000, shift+1000))
	must(syscall.Chmod(su, 0o4755)) // chown cleared it
	must(syscall.Chmod(sg, 0o2755))
	must(syscall.Chmod(filepath.Join(root, "home"), 0o3775))

	size, err := finishTree(context.Background(), root, shift)
	if err != nil {
		t.Fatal(err)
	}
	if size <= 0 {
		t.Errorf("size = %d", size)
	}
	for p, mode := range map[string]uint32{
		"usr/bin/su":   0o755,
		"usr/bin/wall": 0o755,
		"home":         0o1775, // the sticky bit stays; setgid on a directory goes too
		"home/owned":   0o600,
	} {
		var st syscall.Stat_t
		must(syscall.Lstat(filepath.Join(root, p), &st))
		if st.Mode&0o7777 != mode {
			t.Errorf("%s: mode %o, want %o", p, st.Mode&0o7777, mode)
		}
	}
	if _, err := unix.Lgetxattr(ping, "security.capability", make([]byte, 64)); err != unix.ENODATA {
		t.Errorf("the file capability is still there (%v)", err)
	}
	if target, err := os.Readlink(filepath.Join(root, "link")); err != nil || target != "/usr/bin/su" {
		t.Errorf("symlink target %q, %v", target, err)
	}

	// An owner outside the storage ids: not something a build made.
	for _, uid := range []int{0, shift - 1, shift + 65536} {
		must(os.Lchown(owned, uid, shift))
		if _, err := finishTree(context.Background(), root, shift); err == nil {
			t.Errorf("owner %d was accepted", uid)
		}
	}
}

// TestWriteInRoot: the host writes a spec's files into a rootfs without
// running anything of it, and without following the rootfs's links out
// of it, whatever the template planted.
func TestWriteInRoot(t *testing.T) {
	requiresRoot(t)
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	outside := filepath.Join(dir, "outside")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(rootfs, "usr/bin"), 0o755))
	must(os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755))
	must(os.Mkdir(outside, 0o755))
	must(os.Symlink("usr/bin", filepath.Join(rootfs, "bin")))
	// Links a hostile template could have planted: absolute and relative
	// ones to the host, and a file linked to a host path.
	must(os.Symlink(outside, filepath.Join(rootfs, "abs")))
	must(os.Symlink("../../outside", filepath.Join(rootfs, "etc/rel")))
	must(os.Symlink(filepath.Join(outside, "victim"), filepath.Join(rootfs, "etc/resolv.conf")))
	must(os.Mkdir(filepath.Join(rootfs, "adir"), 0o755))
	s := &Store{UIDShift: 100000}

	must(s.writeInRoot(rootfs, "/bin/tool", []byte("#!/bin/sh\n"), 0o755))
	must(s.writeInRoot(rootfs, "/etc/resolv.conf", []byte("nameserver 10.0.0.1\n"), 0o644))
	must(s.writeInRoot(rootfs, "/new/deep/file", []byte("x"), 0o644))
	for _, p := range []string{"/abs/escape", "/etc/rel/escape"} {
		err := s.writeInRoot(rootfs, p, []byte("x"), 0o644)
		if err == nil {
			t.Errorf("%s: written", p)
		}
	}
	if err := s.writeInRoot(rootfs, "/adir", []byte("x"), 0o644); err == nil {
		t.Error("a directory was replaced by a file")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("files appeared outside the rootfs: %v", ents)
	}
	for p, want := range map[string]struct {
		mode     os.FileMode
		uid, gid uint32
	}{
		"usr/bin/tool":    {0o755, 100000, 100000},
		"etc/resolv.conf": {0o644, 100000, 100000},
		"new":             {0o755 | os.ModeDir, 100000, 100000},
		"new/deep":        {0o755 | os.ModeDir, 100000, 100000},
		"new/deep/file":   {0o644, 100000, 100000},
	} {
		fi, err := os.Lstat(filepath.Join(rootfs, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != want.mode || st.Uid != want.uid || st.Gid != want.gid {
			t.Errorf("%s: %v %d:%d, want %v %d:%d", p, fi.Mode(), st.Uid, st.Gid, want.mode, want.uid, want.gid)
		}
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
