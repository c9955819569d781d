package quota

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The btrfs ioctls used here, from linux/btrfs.h (_IOW/_IOR/_IOWR of magic
// 0x94 and the size of the argument struct).
const (
	iocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	iocSnapDestroy  = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	iocQuotaCtl     = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	iocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)

	quotaCtlEnable = 1      // BTRFS_QUOTA_CTL_ENABLE
	limitMaxRfer   = 1 << 0 // BTRFS_QGROUP_LIMIT_MAX_RFER

	// The root directory of every subvolume has this inode number
	// (BTRFS_FIRST_FREE_OBJECTID).
	subvolRootIno = 256
)

// volArgs is struct btrfs_ioctl_vol_args: 4096 bytes.
type volArgs struct {
	fd   int64
	name [4088]byte
}

// quotaCtlArgs is struct btrfs_ioctl_quota_ctl_args.
type quotaCtlArgs struct {
	cmd    uint64
	status uint64
}

// qgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args, with struct
// btrfs_qgroup_limit inlined.
type qgroupLimitArgs struct {
	qgroupid uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

// Btrfs makes each directory a btrfs subvolume whose qgroup limits the
// bytes it references. Metadata (inodes, directory entries, extent trees)
// counts as well, so a flood of empty files stops at the limit too.
type Btrfs struct{ root string }

var _ Dirs = (*Btrfs)(nil)

// OpenBtrfs checks that root is on btrfs and turns quotas on for its file
// system (once; a no-op when they are on). Directories are then made
// anywhere under root. Quotas need CAP_SYS_ADMIN.
func OpenBtrfs(root string) (*Btrfs, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return nil, pathErr("statfs", root, err)
	}
	if uint32(st.Type) != unix.BTRFS_SUPER_MAGIC {
		return nil, fmt.Errorf("quota: %s is not on btrfs (file system magic %#x): %w", root, st.Type, ErrUnsupported)
	}
	f, err := os.Open(root)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	args := quotaCtlArgs{cmd: quotaCtlEnable}
	if err := ioctl(f, iocQuotaCtl, unsafe.Pointer(&args)); err != nil {
		return nil, fmt.Errorf("quota: enabling btrfs quotas on %s: %w (%w)", root, err, ErrUnsupported)
	}
	return &Btrfs{root: root}, nil
}

// Kind is "btrfs".
func (b *Btrfs) Kind() string { return "btrfs" }

// Make creates dir as a subvolume with a limit.
func (b *Btrfs) Make(_ context.Context, dir string, limit int64) error {
	parent, name := filepath.Split(filepath.Clean(dir))
	args, err := newVolArgs(name)
	if err != nil {
		return pathErr("make", dir, err)
	}
	pf, err := os.Open(parent)
	if err != nil {
		return pathErr("make", dir, err)
	}
	err = ioctl(pf, iocSubvolCreate, unsafe.Pointer(args))
	pf.Close()
	if err != nil {
		return pathErr("make", dir, err)
	}
	// The subvolume's root takes the creator's umask; workspaces are
	// chmodded by their owner anyway, but nothing sees it wider until then.
	if err := os.Chmod(dir, 0o700); err != nil {
		b.Remove(context.Background(), dir)
		return pathErr("make", dir, err)
	}
	if err := b.SetLimit(context.Background(), dir, limit); err != nil {
		b.Remove(context.Background(), dir)
		return err
	}
	return nil
}

// SetLimit sets the subvolume's limit on referenced bytes.
func (b *Btrfs) SetLimit(_ context.Context, dir string, limit int64) error {
	if limit <= 0 {
		return pathErr("limit", dir, fmt.Errorf("limit %d: want > 0", limit))
	}
	f, err := os.Open(dir)
	if err != nil {
		return pathErr("limit", dir, err)
	}
	defer f.Close()
	if ok, err := isSubvolume(f); err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("not a subvolume: %w", ErrUnsupported)
		}
		return pathErr("limit", dir, err)
	}
	// qgroupid 0: the qgroup of the subvolume the descriptor is in.
	args := qgroupLimitArgs{flags: limitMaxRfer, maxRfer: uint64(limit)}
	if err := ioctl(f, iocQgroupLimit, unsafe.Pointer(&args)); err != nil {
		return pathErr("limit", dir, err)
	}
	return nil
}

// Remove deletes the subvolume at dir in one call (btrfs frees its blocks
// in the background, and drops its qgroup once they are); a plain
// directory there (one made before quotas were on) is removed file by
// file.
func (b *Btrfs) Remove(ctx context.Context, dir string) error {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return RemoveAll(dir)
	}
	ok, err := isSubvolume(f)
	f.Close()
	if err != nil || !ok {
		return RemoveAll(dir)
	}
	parent, name := filepath.Split(filepath.Clean(dir))
	args, err := newVolArgs(name)
	if err != nil {
		return pathErr("remove", dir, err)
	}
	pf, err := os.Open(parent)
	if err != nil {
		return pathErr("remove", dir, err)
	}
	err = ioctl(pf, iocSnapDestroy, unsafe.Pointer(args))
	pf.Close()
	if err != nil {
		// ENOTEMPTY: it holds a subvolume of its own (which the sandbox's
		// seccomp filter refuses to make); rmdir deletes empty ones.
		if rerr := RemoveAll(dir); rerr != nil {
			return pathErr("remove", dir, errors.Join(err, rerr))
		}
	}
	return nil
}

// isSubvolume reports whether f is the root directory of a btrfs
// subvolume.
func isSubvolume(f *os.File) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false, err
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &sfs); err != nil {
		return false, err
	}
	return uint32(sfs.Type) == unix.BTRFS_SUPER_MAGIC && st.Ino == subvolRootIno && st.Mode&unix.S_IFMT == unix.S_IFDIR, nil
}

func newVolArgs(name string) (*volArgs, error) {
	a := &volArgs{}
	if name == "" || name == "." || name == ".." || len(name) >= len(a.name) {
		return nil, fmt.Errorf("bad subvolume name %q", name)
	}
	copy(a.name[:], name)
	return a, nil
}

func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	conn, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := conn.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}
