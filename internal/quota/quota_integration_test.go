//go:build integration

package quota_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/quota/quotatest"
)

const limit = 16 << 20

// slack is what a full workspace may cost the host beyond its limit:
// btrfs metadata outside the workspace's own tree (the extent and
// free-space trees). The image is mounted with discard=sync, so freed
// blocks are holes again when their transaction commits; a flood of
// empty files, whose limit is all metadata, measured 16.0 MiB for a 16 MiB
// limit, six times out of six (with async discard: 26 to 56 MiB, varying).
const slack = 8 << 20

// fitrim is FITRIM, _IOWR('X', 121, struct fstrim_range).
const fitrim = 0xc0185879

// imageBytes is the host disk the image uses. Blocks btrfs has freed go
// back to the host by discard, which the mount does asynchronously; FITRIM
// does it now.
func imageBytes(t *testing.T, root string) int64 {
	t.Helper()
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	// Blocks freed in a transaction stay pinned until it commits, and the
	// commit itself frees the tree blocks it replaced: two commits leave
	// no freed block pinned.
	for range 2 {
		if err := unix.Syncfs(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
	}
	r := struct{ start, len, minlen uint64 }{0, ^uint64(0), 0}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fitrim, uintptr(unsafe.Pointer(&r)))
	f.Close()
	if errno != 0 {
		t.Fatalf("FITRIM: %v", errno)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(filepath.Dir(root), "workspaces.img"), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func quotaErr(err error) bool { return errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.ENOSPC) }

// fillers write past the limit in every shape R-72 names; each must stop
// with EDQUOT (or ENOSPC) before the limit is much exceeded.
var fillers = []struct {
	name string
	fill func(dir string) error
}{
	{"big file", func(dir string) error {
		f, err := os.Create(filepath.Join(dir, "big"))
		if err != nil {
			return err
		}
		defer f.Close()
		buf := make([]byte, 1<<20)
		for i := 0; i < 4*limit>>20; i++ {
			if _, err := f.Write(buf); err != nil {
				return err
			}
		}
		return f.Sync()
	}},
	{"many files", func(dir string) error {
		buf := make([]byte, 1<<20)
		for i := 0; i < 4*limit>>20; i++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprint("f", i)), buf, 0o644); err != nil {
				return err
			}
		}
		return nil
	}},
	{"fallocate", func(dir string) error {
		return fallocate(dir, 0)
	}},
	{"fallocate keep size", func(dir string) error {
		return fallocate(dir, unix.FALLOC_FL_KEEP_SIZE)
	}},
	{"sparse then writes", func(dir string) error {
		f, err := os.Create(filepath.Join(dir, "sparse"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Truncate(100 * limit); err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		for off := int64(0); off < 100*limit; off += 7 << 20 {
			if _, err := f.WriteAt(buf, off); err != nil {
				return err
			}
		}
		return f.Sync()
	}},
	{"inode flood", func(dir string) error {
		// A 16 MiB workspace holds about 45,000 empty files; 400,000 is
		// far past it and still affordable.
		for i := 0; i < 400000; i++ {
			if i%1000 == 0 {
				if err := os.Mkdir(filepath.Join(dir, fmt.Sprint("d", i/1000)), 0o755); err != nil {
					return err
				}
			}
			f, err := os.Create(filepath.Join(dir, fmt.Sprint("d", i/1000), fmt.Sprint(i)))
			if err != nil {
				return err
			}
			f.Close()
		}
		return nil
	}},
}

func fallocate(dir string, mode uint32) error {
	f, err := os.Create(filepath.Join(dir, "fa"))
	if err != nil {
		return err
	}
	defer f.Close()
	// In steps, as a patient attacker would: one call past the limit is
	// refused whole, which proves less.
	for off := int64(0); off < 4*limit; off += 1 << 20 {
		if err := unix.Fallocate(int(f.Fd()), mode, off, 1<<20); err != nil {
			return err
		}
	}
	return nil
}

func TestQuotaHoldsAgainstFillers(t *testing.T) {
	q, root := quotatest.Mount(t)
	for _, tc := range fillers {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(root, "ws")
			if err := q.Make(context.Background(), dir, limit); err != nil {
				t.Fatal(err)
			}
			defer q.Remove(context.Background(), dir)
			unix.Sync()
			before := imageBytes(t, root)
			err := tc.fill(dir)
			if !quotaErr(err) {
				t.Fatalf("filler ended with %v, want EDQUOT or ENOSPC", err)
			}
			unix.Sync()
			if grew := imageBytes(t, root) - before; grew > limit+slack {
				t.Errorf("the image grew by %d bytes for a limit of %d", grew, limit)
			} else {
				t.Logf("the image grew by %.1f MiB", float64(grew)/(1<<20))
			}
			// The workspace is usable again once something goes.
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
					t.Fatalf("removing in a full workspace: %v", err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, "again"), make([]byte, limit/2), 0o644); err != nil {
				t.Errorf("writing after cleaning up: %v", err)
			}
		})
	}
}

// Entries of one workspace move into another (a warm-pool claim) although
// rename(2) cannot cross subvolumes, keep their owners, modes and links,
// and count against the quota they land in.
func TestMoveEntriesAcrossQuotas(t *testing.T) {
	q, root := quotatest.Mount(t)
	ctx := context.Background()
	from, to := filepath.Join(root, "from"), filepath.Join(root, "to")
	for _, d := range []string{from, to} {
		if err := q.Make(ctx, d, limit); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(d, "uploads"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(from, "uploads", "a.csv"), []byte("a,b\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(from, "uploads", "a.csv"), 101000, 101000); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(from, "big"), make([]byte, limit*3/4), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("uploads/a.csv", filepath.Join(from, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := quota.MoveEntries(from, to); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(to, "uploads", "a.csv"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 101000 || st.Mode&0o777 != 0o640 {
		t.Errorf("moved file: uid %d mode %o, want 101000 and 640", st.Uid, st.Mode&0o777)
	}
	if got, err := os.Readlink(filepath.Join(to, "link")); err != nil || got != "uploads/a.csv" {
		t.Errorf("moved link: %q, %v", got, err)
	}
	if err := q.Remove(ctx, from); err != nil {
		t.Fatal(err)
	}
	// 3/4 of the limit is in to now: another half does not fit.
	err := os.WriteFile(filepath.Join(to, "more"), make([]byte, limit/2), 0o600)
	if !quotaErr(err) {
		t.Errorf("writing past the limit after a move: %v, want EDQUOT", err)
	}
}

// Workspace directories rename as the session layer renames them: into
// the trash, and exchanged with a sibling, with their limits.
func TestWorkspacesRename(t *testing.T) {
	q, root := quotatest.Mount(t)
	ctx := context.Background()
	a, b := filepath.Join(root, "t", "a"), filepath.Join(root, ".trash", "b")
	for _, d := range []string{a, b} {
		if err := os.MkdirAll(filepath.Dir(d), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := q.Make(ctx, d, limit); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(b, "marker"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, b, unix.AT_FDCWD, a, unix.RENAME_EXCHANGE); err != nil {
		t.Fatalf("exchanging two workspaces: %v", err)
	}
	if _, err := os.Stat(filepath.Join(a, "marker")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(a, filepath.Join(root, ".trash", "c")); err != nil {
		t.Fatalf("moving a workspace to the trash: %v", err)
	}
	if err := q.Remove(ctx, filepath.Join(root, ".trash", "c")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, ".trash", "c")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed workspace: %v", err)
	}
}

// A restarted server finds the image mounted and keeps it; after an
// unmount (a reboot) it mounts it again, and the limits are still there.
func TestImageSurvivesRestart(t *testing.T) {
	q, root := quotatest.Mount(t)
	ctx := context.Background()
	dir := filepath.Join(root, "ws")
	if err := q.Make(ctx, dir, limit); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(filepath.Dir(root), "workspaces.img")
	if _, err := quota.Open(ctx, quota.ModeAuto, root, image, quotatest.ImageSize); err != nil {
		t.Fatalf("adopting the mounted image: %v", err)
	}
	if err := quota.Unmount(root); err != nil {
		t.Fatal(err)
	}
	if _, err := quota.Open(ctx, quota.ModeAuto, root, image, quotatest.ImageSize); err != nil {
		t.Fatalf("mounting the image again: %v", err)
	}
	err := os.WriteFile(filepath.Join(dir, "big"), make([]byte, 2*limit), 0o600)
	if !quotaErr(err) {
		t.Errorf("writing past the limit after a remount: %v, want EDQUOT", err)
	}
}

// Open refuses to hide workspaces made without quotas.
func TestImageRefusesToHideWorkspaces(t *testing.T) {
	quotatest.Require(t)
	base := t.TempDir()
	root := filepath.Join(base, "workspaces")
	if err := os.MkdirAll(filepath.Join(root, "default", "s1"), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := quota.Open(context.Background(), quota.ModeAuto, root, filepath.Join(base, "workspaces.img"), quotatest.ImageSize)
	if err == nil {
		quota.Unmount(root)
		t.Fatal("mounted over existing workspaces")
	}
}

// Usage reads a workspace's bytes as its quota counts them, without a
// walk: a file written shows at once (reserved, not yet committed), the
// limit is the one set, a removal shows once its transaction commits, and
// a directory that is no subvolume, or no quota at all, cannot say.
func TestUsage(t *testing.T) {
	q, root := quotatest.Mount(t)
	ctx := context.Background()
	dir := filepath.Join(root, "ws")
	if err := q.Make(ctx, dir, limit); err != nil {
		t.Fatal(err)
	}
	used, lim, err := q.Usage(ctx, dir)
	if err != nil || lim != limit || used < 0 || used > 1<<20 {
		t.Fatalf("empty workspace: used %d, limit %d, %v; want little, %d", used, lim, err, limit)
	}
	const size = 8 << 20
	if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	if used, _, err = q.Usage(ctx, dir); err != nil || used < size {
		t.Errorf("after writing %d bytes: used %d, %v; want at least that", size, used, err)
	}
	unix.Sync()
	if used, _, err = q.Usage(ctx, dir); err != nil || used < size || used > size+1<<20 {
		t.Errorf("after a sync: used %d, %v; want about %d", used, err, size)
	}
	if err := os.Remove(filepath.Join(dir, "f")); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	if used, _, err = q.Usage(ctx, dir); err != nil || used > 1<<20 {
		t.Errorf("after removing it and a sync: used %d, %v; want under 1 MiB", used, err)
	}
	if err := q.SetLimit(ctx, dir, 2*limit); err != nil {
		t.Fatal(err)
	}
	if _, lim, err = q.Usage(ctx, dir); err != nil || lim != 2*limit {
		t.Errorf("after SetLimit: limit %d, %v; want %d", lim, err, 2*limit)
	}

	plain := filepath.Join(root, "plain")
	if err := os.Mkdir(plain, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := q.Usage(ctx, plain); !errors.Is(err, quota.ErrUnsupported) {
		t.Errorf("a plain directory: %v, want ErrUnsupported", err)
	}
	if _, _, err := (quota.None{}).Usage(ctx, dir); !errors.Is(err, quota.ErrUnsupported) {
		t.Errorf("quota.None: %v, want ErrUnsupported", err)
	}
}
