package quota

import (
	"testing"
	"unsafe"
)

// The ioctl and quotactl argument structs must have the kernel's sizes
// (the sizes are also in the request numbers).
func TestStructSizes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"btrfs_ioctl_vol_args", unsafe.Sizeof(volArgs{}), 4096},
		{"btrfs_ioctl_quota_ctl_args", unsafe.Sizeof(quotaCtlArgs{}), 16},
		{"btrfs_ioctl_qgroup_limit_args", unsafe.Sizeof(qgroupLimitArgs{}), 48},
		{"btrfs_ioctl_ino_lookup_args", unsafe.Sizeof(inoLookupArgs{}), 4096},
		{"btrfs_ioctl_fs_info_args", unsafe.Sizeof(fsInfoArgs{}), 1024},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %d bytes, want %d", tc.name, tc.got, tc.want)
		}
	}
}
