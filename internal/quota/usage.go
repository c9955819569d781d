package quota

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The ioctls Usage adds to btrfs.go's.
const (
	iocInoLookup = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	iocFsInfo    = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
)

// inoLookupArgs is struct btrfs_ioctl_ino_lookup_args: 4096 bytes. With
// treeid 0 the kernel answers the id of the subvolume the descriptor is
// in.
type inoLookupArgs struct {
	treeid   uint64
	objectid uint64
	name     [4080]byte
}

// fsInfoArgs is struct btrfs_ioctl_fs_info_args (1024 bytes), of which
// only the file system's id is read.
type fsInfoArgs struct {
	maxID      uint64
	numDevices uint64
	fsid       [16]byte
	rest       [992]byte
}

// sysfsBtrfs is where the kernel shows each btrfs file system, its
// qgroups included (Linux 5.9 and later).
const sysfsBtrfs = "/sys/fs/btrfs"

// Usage reports what dir's subvolume holds as its quota counts it and
// its limit (0: none). Used is what committed transactions account to its
// qgroup plus what writes in flight have reserved, metadata included:
// the sum the kernel holds against the limit, so a file just written
// counts at once, while a removal shows once its transaction commits
// (within 30 s). It reads the counters the kernel keeps (a lookup of the
// subvolume's id and a few small sysfs files), never the tree, so it costs
// the same for a million files as for one.
func (b *Btrfs) Usage(_ context.Context, dir string) (used, limit int64, err error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, 0, pathErr("usage", dir, err)
	}
	defer f.Close()
	if ok, err := isSubvolume(f); err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("not a subvolume (made before quotas were on): %w", ErrUnsupported)
		}
		return 0, 0, pathErr("usage", dir, err)
	}
	var lookup inoLookupArgs
	lookup.objectid = subvolRootIno
	if err := ioctl(f, iocInoLookup, unsafe.Pointer(&lookup)); err != nil {
		return 0, 0, pathErr("usage: subvolume id", dir, err)
	}
	var info fsInfoArgs
	if err := ioctl(f, iocFsInfo, unsafe.Pointer(&info)); err != nil {
		return 0, 0, pathErr("usage: file system id", dir, err)
	}
	qg := filepath.Join(sysfsBtrfs, uuidString(info.fsid), "qgroups", fmt.Sprintf("0_%d", lookup.treeid))
	var v [5]int64
	for i, name := range []string{"referenced", "rsv_data", "rsv_meta_pertrans", "rsv_meta_prealloc", "max_referenced"} {
		if v[i], err = readSysfsInt(filepath.Join(qg, name)); err != nil {
			return 0, 0, pathErr("usage", dir, fmt.Errorf("%w (%w)", err, ErrUnsupported))
		}
	}
	return v[0] + v[1] + v[2] + v[3], v[4], nil
}

// Usage is ErrUnsupported: without quotas only a walk of the tree could
// tell, which is not worth its cost every few seconds.
func (None) Usage(_ context.Context, dir string) (int64, int64, error) {
	return 0, 0, pathErr("usage", dir, ErrUnsupported)
}

func uuidString(b [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func readSysfsInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}
