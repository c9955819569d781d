package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The template rootfs is shared by every sandbox of the template, across
// tenants, so no sandbox may be able to write to it, whatever code gains
// the sandbox's root. runc's own read-only root is a remount made inside
// the sandbox's user namespace: root there (which holds CAP_SYS_ADMIN in
// that namespace, as the executor and zygote do) can remount it read-write,
// and the rootfs files are owned by the sandbox's mapped root. So each
// sandbox's root is a read-only bind mount made here, on the host, before
// the container exists: when the runtime copies the host's mounts into the
// sandbox's mount namespace, which a less privileged user namespace owns,
// the kernel locks their flags (MNT_LOCK_READONLY, NOSUID, NODEV), and every
// bind or clone made from them inside keeps the lock. A remount read-write,
// by mount(2) or mount_setattr(2), is then EPERM inside the sandbox.
//
// The workspace gets the same treatment, read-write: nosuid and nodev are
// locked inside, and on the host the sandbox's files are reached only
// through its own idmapped mount (ids.go).
//
// The mounts are made with the new mount API (open_tree, mount_setattr,
// move_mount), so they have their flags from the moment they appear: there
// is no window in which a writable bind of the template sits in the bundle.

// bindMount makes dst (an empty directory) a nosuid, nodev bind mount of
// the directory src that shows storage ids as the ids of the user
// namespace usernsFD maps them to (ids.go); read-only if ro. src itself is
// mounted, not what may be mounted below it.
func bindMount(src, dst string, usernsFD int, ro bool) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(usernsFD)}
	if ro {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return idmapError("mount_setattr", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount to %s: %w", dst, err)
	}
	return nil
}

// unmount removes what bindMount mounted at dst; a dst with no mount (or
// no dst) is fine. It must succeed before the bundle is removed: a
// recursive removal through a mount would reach the template or the
// workspace.
func unmount(dst string) error {
	for range 8 {
		err := unix.Unmount(dst, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue // a second mount stacked on the first would show now
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point (any more)
		default:
			return fmt.Errorf("unmount %s: %w", dst, err)
		}
	}
	return fmt.Errorf("%s is still mounted after 8 unmounts", dst)
}

// removeBundle removes a sandbox's bundle directory, after making sure
// its mounts (mountPoints) are gone.
func removeBundle(b string) error {
	for _, name := range mountPoints {
		p := filepath.Join(b, name)
		if err := unmount(p); err != nil {
			return err
		}
		// The mount point must now be an empty directory of the bundle's
		// own file system; anything else means a mount is still there.
		if entries, err := os.ReadDir(p); err == nil && len(entries) > 0 {
			return fmt.Errorf("%s is not empty after unmounting; leaving the bundle in place", p)
		}
	}
	return os.RemoveAll(b)
}

// mountPoints are the bundle's directories that Create mounts on.
var mountPoints = []string{"rootfs", "workspace", "ctl"}

// The control directory's own tmpfs (mountControlDir): room for the
// executor's socket, the zygote's scripts and the inner filter (about 100
// KiB), the user variables (env.json, at most a few MiB of JSON) and the
// executor's rotating log (executorLogMax twice).
const (
	controlDirBytes  = 8 << 20
	controlDirInodes = 64
	// executorLogName is the log the executor keeps in the control
	// directory, rotated at executorLogMax to one older file.
	executorLogName = "executor.log"
	executorLogMax  = 256 << 10
)

// mountControlDir mounts a tmpfs of its own on a sandbox's control
// directory, before the sandbox starts: what the sandbox's root writes
// there (its socket, its log) fills that and no more, not the host's /run,
// which is RAM every sandbox and the host share. It is the sandbox's root's
// (owner), mode 0700, and nothing there is executable or a device.
func mountControlDir(dir string, owner int) error {
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", controlDirBytes, controlDirInodes, owner, owner)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mount the control directory's tmpfs: %w", err)
	}
	return nil
}
