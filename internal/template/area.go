package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// A build grows its rootfs in an area: a tmpfs of its own, mounted on the
// build's temporary directory (tmp/NAME/area), whose size is the most a
// build may take. A build that would pass it fails with ENOSPC where it
// writes, not afterwards; its pages count against the build's memory
// (they are charged to the job that writes them). The finished rootfs is
// copied to disk and the area unmounted.

// DefaultMaxBuildBytes is Store.MaxBuildBytes' default.
const DefaultMaxBuildBytes = 4 << 30

// DefaultMaxBuildTime is Store.MaxBuildTime's default: builds queue, so
// one that never ends would hold up every tenant's.
const DefaultMaxBuildTime = 30 * time.Minute

func (s *Store) maxBuildTime() time.Duration {
	if s.MaxBuildTime > 0 {
		return s.MaxBuildTime
	}
	return DefaultMaxBuildTime
}

// areaInodes bounds the files of a build's area.
const areaInodes = 1 << 20

// BuildLimit is the most a build may take: MaxBuildBytes or its default.
func (s *Store) BuildLimit() int64 {
	if s.MaxBuildBytes > 0 {
		return s.MaxBuildBytes
	}
	return DefaultMaxBuildBytes
}

// jobMemoryMB is what each build command may use: its processes, and the
// area it fills.
func (s *Store) jobMemoryMB() int64 { return s.BuildLimit()>>20 + 2048 }

// makeArea mounts a build's area on tmp/area and returns its path.
func (s *Store) makeArea(tmp string) (string, error) {
	area := filepath.Join(tmp, "area")
	if err := os.Mkdir(area, 0o700); err != nil {
		return "", err
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", s.BuildLimit(), areaInodes)
	if err := unix.Mount("sbx-build", area, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return "", fmt.Errorf("the build's area (a tmpfs of %d MiB): %w", s.BuildLimit()>>20, err)
	}
	return area, nil
}

// removeArea unmounts tmp/area and removes its mount point.
func removeArea(tmp string) error {
	area := filepath.Join(tmp, "area")
	if err := unmountUnder(area); err != nil {
		return err
	}
	return os.Remove(area)
}

// areaError says that a build passed its size limit when what failed found
// no space (ENOSPC) or its area is full, since the command that failed
// says only that it found no space.
func (s *Store) areaError(area, what string, err error) error {
	var st unix.Statfs_t
	if errors.Is(err, unix.ENOSPC) || unix.Statfs(area, &st) == nil && (st.Bavail*uint64(st.Bsize) < 1<<20 || st.Ffree < 16) {
		return fmt.Errorf("%s: the build passed the most a template may take (%d MiB, %d files): %w",
			what, s.BuildLimit()>>20, areaInodes, errdefs.ErrResourceExhausted)
	}
	return err
}

// copyTree copies the tree src to dst (which must not exist) with every
// owner, mode, link and extended attribute kept. cp never follows a link
// of the tree it copies (-a is -dR), so a tree a build shaped reaches
// nothing outside itself.
func copyTree(ctx context.Context, src, dst string) error {
	cmd := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", "--", src, dst)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if strings.Contains(string(out), "No space left on device") {
			err = unix.ENOSPC
		}
		return fmt.Errorf("copy %s: %w: %s", filepath.Base(src), err, strings.TrimSpace(limitString(string(out), 2048)))
	}
	return nil
}

func limitString(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// writeInRoot writes a file into a rootfs from the host, through os.Root:
// every link on the way is resolved inside the rootfs, whatever is at the
// path is replaced rather than written through, directories it makes and
// the file belong to the rootfs's root (the first storage id), and no
// command of the rootfs runs. It refuses to replace a directory.
func (s *Store) writeInRoot(rootfs, p string, data []byte, mode os.FileMode) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	owner := int(s.shift())
	rel := strings.TrimPrefix(path.Clean("/"+p), "/")
	if rel == "" {
		return fmt.Errorf("%s: the root directory: %w", p, errdefs.ErrInvalidArgument)
	}
	if dir := path.Dir(rel); dir != "." {
		if err := mkdirsInRoot(root, dir, owner); err != nil {
			return err
		}
	}
	if fi, err := root.Lstat(rel); err == nil && fi.IsDir() {
		return fmt.Errorf("%s: the template has a directory there: %w", p, errdefs.ErrInvalidArgument)
	}
	if err := root.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Chmod(rel, mode) // not the umask's idea of it
	}
	if err == nil {
		err = root.Lchown(rel, owner, owner)
	}
	return err
}

// mkdirsInRoot makes dir and its missing parents in root, 0755, owned by
// owner. Existing links on the way are followed, within root.
func mkdirsInRoot(root *os.Root, dir string, owner int) error {
	parts := strings.Split(dir, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		fi, err := root.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("/%s: not a directory in the template: %w", p, errdefs.ErrInvalidArgument)
			}
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := root.Mkdir(p, 0o755); err != nil {
			return err
		}
		if err := root.Chmod(p, 0o755); err != nil {
			return err
		}
		if err := root.Lchown(p, owner, owner); err != nil {
			return err
		}
	}
	return nil
}

// makeTools makes the root of debootstrap's first stage at dir: the
// host's /usr, read-only, and nothing else of the host but its CA
// certificates (for a mirror over https). The job sees the host's files
// as owned by nobody, and writes only its /target.
func makeTools(dir string) (string, []runtime.Bind, error) {
	for _, d := range []string{"", "usr", "etc", "etc/ssl", "proc", "dev", "tmp", "target", "root", "var", "var/tmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return "", nil, err
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":    "root:x:0:\n",
		"etc/hostname": "sbx-build\n",
		// debootstrap downloads with wget, whose own defaults (a 900 s
		// read timeout, 20 tries) would let a stalled mirror hold a
		// build for hours.
		"etc/wgetrc": "timeout = 30\ntries = 3\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return "", nil, err
		}
	}
	// Merged /usr: what lives in /bin, /sbin and /lib is under /usr.
	for _, l := range []string{"bin", "sbin", "lib", "lib64", "lib32", "libx32"} {
		if _, err := os.Stat(filepath.Join("/usr", l)); err == nil {
			if err := os.Symlink("usr/"+l, filepath.Join(dir, l)); err != nil {
				return "", nil, err
			}
		}
	}
	binds := []runtime.Bind{{Source: "/usr", Dest: "/usr", ReadOnly: true}}
	if fi, err := os.Stat("/etc/ssl"); err == nil && fi.IsDir() {
		binds = append(binds, runtime.Bind{Source: "/etc/ssl", Dest: "/etc/ssl", ReadOnly: true})
	}
	return dir, binds, nil
}

// finishTree checks a built rootfs and makes it safe to keep on the host,
// and returns the disk space it uses (allocated blocks, each inode once,
// as du counts). Every entry must belong to the storage ids (what a job
// writes does; an owner outside them means the tree was not made by the
// build). Setuid and setgid bits and file capabilities are removed: in a
// sandbox they would do nothing (no_new_privs, nosuid), and on the host's
// disk a setuid file of the storage root is a way into every template.
func finishTree(ctx context.Context, root string, shift uint32) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var size int64
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n%1024 == 0 && ctx.Err() != nil {
			return context.Cause(ctx)
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		if st.Uid < shift || st.Uid-shift >= idsPerSandbox || st.Gid < shift || st.Gid-shift >= idsPerSandbox {
			return fmt.Errorf("%s: owner %d:%d is not a storage id (%d and up)", p, st.Uid, st.Gid, shift)
		}
		typ := st.Mode & syscall.S_IFMT
		if st.Nlink > 1 && typ != syscall.S_IFDIR {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		size += st.Blocks * 512
		if typ == syscall.S_IFLNK {
			return nil
		}
		if st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
			if err := syscall.Chmod(p, st.Mode&0o777|st.Mode&syscall.S_ISVTX); err != nil {
				return &fs.PathError{Op: "chmod", Path: p, Err: err}
			}
		}
		if typ == syscall.S_IFREG {
			if err := unix.Lremovexattr(p, "security.capability"); err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EOPNOTSUPP) {
				return &fs.PathError{Op: "removexattr", Path: p, Err: err}
			}
		}
		return nil
	})
	return size, err
}

// idsPerSandbox is the size of the storage id range: container ids
// 0..65535 are storage ids shift..shift+65535.
const idsPerSandbox = 65536
