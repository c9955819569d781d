package quota_test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/quota"
)

// A tree deeper than the descriptors a process may hold, with files,
// symlinks and directories at every level, goes; what its symlinks point
// at does not.
func TestRemoveAllDeep(t *testing.T) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = 200 // os.RemoveAll needs one per level
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)

	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.WriteFile(outside, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "tree")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	const depth = 1000
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range depth {
		for _, name := range []string{"d", "side"} {
			if err := unix.Mkdirat(fd, name, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := unix.Symlinkat(outside, fd, "link"); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			f, err := unix.Openat(fd, "file", unix.O_CREAT|unix.O_WRONLY, 0o000)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(f)
			if err := unix.Fchmodat(fd, "side", 0o000, 0); err != nil {
				t.Fatal(err)
			}
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	if err := quota.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(root); !os.IsNotExist(err) {
		t.Errorf("the tree after RemoveAll: %v", err)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "keep" {
		t.Errorf("what a symlink pointed at: %q %v", b, err)
	}
	// Absent, and a file, are fine too.
	if err := quota.RemoveAll(root); err != nil {
		t.Errorf("absent: %v", err)
	}
	if err := quota.RemoveAll(outside); err != nil {
		t.Errorf("a file: %v", err)
	}
}
