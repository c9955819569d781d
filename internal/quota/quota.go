// Package quota gives every workspace directory a disk quota of its own
// a cap on the bytes, and with them the inodes, that the code in a
// sandbox can put under it, whatever the shape of the writes (many files,
// one big file, fallocate with or without KEEP_SIZE, sparse files filled
// in, millions of empty files). Writes past it fail with EDQUOT inside the
// sandbox; nothing reaches the host's disk beyond the quota.
//
// The mechanism is btrfs: each workspace is a subvolume with a qgroup
// limit on the bytes it references. It runs on a btrfs file system the
// data directory already is on, or on a btrfs image file attached to a loop
// device and mounted at the workspaces directory (MountImage), because this
// kernel has neither ext4 nor XFS quota support (CONFIG_QFMT_V2 and
// CONFIG_XFS_QUOTA are off; see docs/ARCHITECTURE.md). XFS and ext4
// project quotas are not used: they could not be tested here, and the
// image works on any file system.
//
// Two consequences shape the callers:
//   - Entries cannot be renamed from one workspace into another (EXDEV: a
//     subvolume is its own inode space); MoveEntries copies them instead,
//     with reflinks, so no data is read or written twice.
//   - Workspace directories themselves rename freely (into the trash, a
//     restored sibling into place, RENAME_EXCHANGE of two), as long as they
//     stay on the one file system.
package quota

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// Dirs makes and removes directories with a quota each: Btrfs, and None,
// the loud fallback for machines that cannot have it.
type Dirs interface {
	// Make creates dir, which must not exist and whose parent must, as an
	// empty directory (mode 0700, owned by the caller) whose content may
	// use at most limit bytes.
	Make(ctx context.Context, dir string, limit int64) error
	// SetLimit changes the limit of a directory Make made. A limit below
	// what the directory uses already is allowed: writes fail until enough
	// is removed.
	SetLimit(ctx context.Context, dir string, limit int64) error
	// Remove removes dir and everything under it; absent is not an error.
	Remove(ctx context.Context, dir string) error
	// Usage reports the bytes dir (made by Make) holds, as its quota
	// counts them, and its limit; ErrUnsupported where the mechanism
	// cannot say cheaply (None).
	Usage(ctx context.Context, dir string) (used, limit int64, err error)
	// Kind names the mechanism ("btrfs", "none") for logs and errors.
	Kind() string
}

// ErrUnsupported says that a directory's file system cannot hold quotas.
var ErrUnsupported = errors.New("disk quotas are not supported here")

// None makes plain directories: no quota at all. It is what `sbx serve
// --workspace-quota=off` uses, and says so in its Kind.
type None struct{}

var _ Dirs = None{}

// Make creates dir.
func (None) Make(_ context.Context, dir string, _ int64) error { return os.Mkdir(dir, 0o700) }

// SetLimit does nothing.
func (None) SetLimit(context.Context, string, int64) error { return nil }

// Remove removes dir.
func (None) Remove(_ context.Context, dir string) error { return RemoveAll(dir) }

// Kind is "none".
func (None) Kind() string { return "none" }

// MB is a limit of n MiB, the unit of a session's resources.disk.
func MB(n int64) int64 { return n << 20 }

func pathErr(op, path string, err error) error {
	return fmt.Errorf("quota: %s %s: %w", op, path, err)
}

// Modes of Open.
const (
	// ModeAuto uses the file system root is on if it is btrfs, or else a
	// btrfs image mounted at root.
	ModeAuto = "auto"
	// ModeOff gives no quotas (None): for development machines that
	// cannot have any. The server says so loudly at start.
	ModeOff = "off"
)

// Open returns the quota mechanism for workspaces under root. In ModeAuto
// a root on btrfs is used as it is; otherwise the btrfs image file image
// (made with size bytes if missing) is mounted at root.
// An error says why quotas cannot be had.
func Open(ctx context.Context, mode, root, image string, size int64) (Dirs, error) {
	switch mode {
	case ModeOff:
		if err := os.MkdirAll(root, 0o711); err != nil {
			return nil, err
		}
		return None{}, nil
	case ModeAuto, "":
	default:
		return nil, fmt.Errorf("quota: mode %q: want %q or %q", mode, ModeAuto, ModeOff)
	}
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, err
	}
	if b, err := OpenBtrfs(root); err == nil {
		return b, nil
	} else if !errors.Is(err, ErrUnsupported) {
		return nil, err
	}
	if err := MountImage(ctx, image, root, size); err != nil {
		return nil, err
	}
	return OpenBtrfs(root)
}
