package quota

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MoveEntries moves every entry of the directory from into the directory
// to. An entry of to with the same name is replaced if it is an empty
// directory (as rename(2) does). Within one quota an entry is renamed;
// across quotas, where rename fails with EXDEV, it is copied (file data
// by reflink, so nothing is read or written twice) with its mode, owner
// and times, and the source is left for the caller to remove with its
// directory. On an error, what was moved is put back where it can be and
// the copies made are removed: from keeps what it had. After a success,
// undo does the same, for a caller whose next step failed.
func MoveEntries(from, to string) (undo func(), err error) {
	entries, err := os.ReadDir(from)
	if err != nil {
		return nil, err
	}
	var renamed, copied []string
	var cloned int64 // bytes
	undo = func() {
		for _, name := range renamed {
			os.Rename(filepath.Join(to, name), filepath.Join(from, name))
		}
		for _, name := range copied {
			RemoveAll(filepath.Join(to, name))
		}
	}
	for _, de := range entries {
		src, dst := filepath.Join(from, de.Name()), filepath.Join(to, de.Name())
		err := unix.Rename(src, dst)
		if err == nil {
			renamed = append(renamed, de.Name())
			continue
		}
		if !errors.Is(err, unix.EXDEV) {
			undo()
			return nil, err
		}
		if err := unix.Rmdir(dst); err != nil && !errors.Is(err, unix.ENOENT) {
			undo()
			return nil, fmt.Errorf("quota: moving %s: %w", src, err)
		}
		copied = append(copied, de.Name())
		n, err := copyTree(src, dst)
		if err != nil {
			undo()
			return nil, fmt.Errorf("quota: copying %s: %w", src, err)
		}
		cloned += n
	}
	if cloned > 0 {
		if err := commitClones(to); err != nil {
			undo()
			return nil, err
		}
	}
	return undo, nil
}

// The btrfs ioctls that commit the running transaction and wait for it.
const (
	iocStartSync = 0x80089418 // _IOR(0x94, 24, __u64)
	iocWaitSync  = 0x40089416 // _IOW(0x94, 22, __u64)
)

// commitClones makes the quota of dir count the extents cloned into it.
// btrfs charges a clone when its transaction commits; until then the
// copies are free, and code in the sandbox could write up to the limit
// again on top. A commit is cheaper than syncfs, which would first write
// out every workspace's dirty data. Other file systems charge at once.
func commitClones(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || uint32(st.Type) != unix.BTRFS_SUPER_MAGIC {
		return err
	}
	var transid uint64
	if err := ioctl(f, iocStartSync, unsafe.Pointer(&transid)); err != nil {
		return pathErr("commit", dir, err)
	}
	if err := ioctl(f, iocWaitSync, unsafe.Pointer(&transid)); err != nil {
		return pathErr("commit", dir, err)
	}
	return nil
}

// copyTree copies src (not following symbolic links) to dst, which does
// not exist, and returns the bytes of file data it copied. Sockets are
// skipped: nothing can connect to a copy.
func copyTree(src, dst string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return 0, err
	}
	var n int64
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := os.Mkdir(dst, 0o700); err != nil {
			return 0, err
		}
		entries, err := os.ReadDir(src)
		if err != nil {
			return 0, err
		}
		for _, de := range entries {
			m, err := copyTree(filepath.Join(src, de.Name()), filepath.Join(dst, de.Name()))
			n += m
			if err != nil {
				return n, err
			}
		}
	case unix.S_IFREG:
		if err := copyFile(src, dst); err != nil {
			return 0, err
		}
		n = st.Size
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return 0, err
		}
		if err := os.Symlink(target, dst); err != nil {
			return 0, err
		}
	case unix.S_IFIFO:
		if err := unix.Mkfifo(dst, 0o600); err != nil {
			return 0, err
		}
	default:
		return 0, nil // sockets; devices cannot be made in a workspace
	}
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return n, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		// After the chown, which clears setuid and setgid.
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return n, err
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return n, unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// copyFile clones src's data into a new file dst; where the two cannot
// share extents it copies the bytes.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		_, err = io.Copy(out, in)
		if err != nil {
			out.Close()
			return err
		}
	}
	return out.Close()
}
