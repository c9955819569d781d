package template

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
)

// idsPerSandbox is the size of a sandbox's uid (and gid) mapping: container
// ids 0..65535 are host ids shift..shift+65535.
const idsPerSandbox = 65536

// shiftOwnership adds shift to the owner and group of every file under
// root and returns the disk space the tree uses (allocated blocks, each
// inode once, as du counts).
//
// Sandboxes map container uid 0 to host uid shift, so a rootfs owned by
// host root would look owned by "nobody" from inside; shifted, root's files
// are root's again and user's (uid 1000) are user's.
//
// chown clears the setuid and setgid bits, so those are restored
// afterwards (symlinks have no mode of their own). It also drops file
// capabilities (the security.capability xattr); they are not restored:
// sandboxes run with no capabilities and no_new_privs, so a file
// capability could never take effect anyway. Hard links are shifted once:
// a second pass over the same inode would shift it twice.
func shiftOwnership(ctx context.Context, root string, shift uint32) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var size int64
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: path, Err: err}
		}
		if st.Nlink > 1 && st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		size += st.Blocks * 512
		if st.Uid >= idsPerSandbox || st.Gid >= idsPerSandbox {
			return fmt.Errorf("%s: owner %d:%d is outside the %d ids a sandbox maps", path, st.Uid, st.Gid, idsPerSandbox)
		}
		if err := syscall.Lchown(path, int(st.Uid+shift), int(st.Gid+shift)); err != nil {
			return &fs.PathError{Op: "lchown", Path: path, Err: err}
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFLNK && st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
			if err := syscall.Chmod(path, st.Mode&0o7777); err != nil {
				return &fs.PathError{Op: "chmod", Path: path, Err: err}
			}
		}
		return nil
	})
	return size, err
}
