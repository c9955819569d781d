package quota

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/internal/mountinfo"

	"golang.org/x/sys/unix"
)

// MountImage makes dir a btrfs file system that lives in the file image:
// it creates the image (sparse, size bytes, formatted with mkfs.btrfs) if
// there is none, attaches it to a free loop device and mounts it at dir. A
// dir that is already that mount (a restarted server) is left as it is.
// The loop device goes away by itself when the file system is unmounted
// (LO_FLAGS_AUTOCLEAR); the mount stays when the server stops, because
// sandboxes that outlive the server have their workspaces in it.
//
// dir must be empty but for what a server leaves with nothing to keep
// (.trash, .pool): a mount over workspaces would hide them.
//
// Replicas sharing a data directory may start at the same moment: an
// flock on image.lock makes one of them make and mount the image, and the
// others find it mounted.
func MountImage(ctx context.Context, image, dir string, size int64) error {
	lock, err := os.OpenFile(image+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close() // drops the flock
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return pathErr("flock", image+".lock", err)
	}
	if mounted, err := mountedFrom(dir, image); err != nil || mounted {
		return err
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	if err := checkEmpty(dir); err != nil {
		return err
	}
	if _, err := os.Stat(image); errors.Is(err, os.ErrNotExist) {
		if err := makeImage(ctx, image, size); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	return attachAndMount(image, dir)
}

// Unmount unmounts the image mounted at dir (lazily: a sandbox still
// running keeps its bind of a workspace until it ends); its loop device
// goes with the last user. Tests use it; the server leaves the mount.
func Unmount(dir string) error {
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return pathErr("unmount", dir, err)
	}
	return nil
}

// checkEmpty refuses to mount over workspaces.
func checkEmpty(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		switch e.Name() {
		case ".trash", ".pool":
			if err := RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		default:
			return fmt.Errorf("quota: %s holds workspaces made without quotas (%s, ...); mounting the quota image over them would hide them: move them away, or serve with --workspace-quota=off", dir, e.Name())
		}
	}
	return nil
}

func makeImage(ctx context.Context, image string, size int64) error {
	mkfs, err := exec.LookPath("mkfs.btrfs")
	if err != nil {
		return fmt.Errorf("quota: making the workspace image needs mkfs.btrfs (Debian package btrfs-progs; scripts/setup.sh installs it): %w", ErrUnsupported)
	}
	tmp := image + ".new"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size) // sparse: the host's disk is used as it fills
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	// Single copies of metadata: the image sits on one disk, and DUP would
	// double what a flood of empty files costs the host.
	out, err := exec.CommandContext(ctx, mkfs, "-q", "-f", "-m", "single", "-d", "single", "-L", "sbx-workspaces", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("quota: mkfs.btrfs %s: %w: %s", tmp, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, image); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// attachAndMount attaches image to a free loop device and mounts it at
// dir. Another process may take the free device between the question and
// the claim (EBUSY): then it asks again.
func attachAndMount(image, dir string) error {
	img, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("quota: loop devices: %w (%w)", err, ErrUnsupported)
	}
	defer ctl.Close()
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("quota: finding a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lf, err := openLoop(dev)
		if err != nil {
			return err
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], image)
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) && attempt < 20 {
			lf.Close()
			continue
		}
		if err != nil {
			lf.Close()
			return fmt.Errorf("quota: attaching %s to %s: %w", image, dev, err)
		}
		// discard=sync: a freed extent becomes a hole in the image when its
		// transaction commits. With the kernel's default (async) discard,
		// and even after FITRIM, freed metadata of a flood of empty files
		// stayed in the image, 1-2.5 times the workspace's quota and
		// different every time; synchronously the host's disk follows what
		// the workspaces hold.
		err = unix.Mount(dev, dir, "btrfs", unix.MS_NOATIME|unix.MS_NODEV|unix.MS_NOSUID, "discard=sync")
		// With AUTOCLEAR, closing the last descriptor of an unused device
		// detaches it: after a failed mount, this close cleans up.
		lf.Close()
		if err != nil {
			return fmt.Errorf("quota: mounting %s (%s) at %s: %w", image, dev, dir, err)
		}
		return nil
	}
}

// openLoop opens a loop device, waiting a moment for udev (or devtmpfs)
// to make its node.
func openLoop(dev string) (*os.File, error) {
	for i := 0; ; i++ {
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err == nil || !errors.Is(err, os.ErrNotExist) || i == 50 {
			return f, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mountedFrom reports whether dir is a mount point whose source is a loop
// device backed by image.
func mountedFrom(dir, image string) (bool, error) {
	// The kernel names both without symbolic links.
	dir, err := realPath(dir)
	if err != nil {
		return false, err
	}
	if image, err = realPath(image); err != nil {
		return false, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var source string
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || mountinfo.Unescape(fields[4]) != dir {
			continue
		}
		for i, f := range fields {
			if f == "-" && i+2 < len(fields) {
				source = fields[i+2] // the last mount at dir wins
			}
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	if !strings.HasPrefix(source, "/dev/loop") {
		return false, nil
	}
	backing, err := os.ReadFile("/sys/block/" + filepath.Base(source) + "/loop/backing_file")
	if err != nil {
		return false, nil
	}
	return strings.TrimSpace(string(backing)) == image, nil
}

// realPath is path absolute and with its symbolic links resolved, as far
// as it exists.
func realPath(path string) (string, error) {
	path, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r, nil
	}
	return path, nil
}
