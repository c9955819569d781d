package app

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// The two directories sbx keeps on the host, and who may reach them.
//
// The data directory (database, signing key, templates, workspaces, blobs)
// is the server's alone: 0700, root's. Sandboxes never reach into it by
// path: the template rootfs and the workspace each sandbox sees are bind
// mounts the server makes (as root) into the sandbox's bundle, under the
// state directory (internal/runtime/oci, rootfs.go). Before it was 0711,
// and every workspace file (0644) could be read by any local user who
// guessed its path.
//
// The state directory holds the bundles, and the runtime enters a bundle
// as the sandbox's own host user (runc binds the rootfs from inside the
// sandbox's user namespace; runsc's gofer and sentry run there), so every
// directory from / down to it must let any user pass (x for others); the
// bundle itself lets in only its sandbox's root (oci, shareBundle). A
// directory on the way that does not (a 0700 `mktemp -d`, or the data
// directory) made every sandbox start fail with runc's bare "permission
// denied"; the server now says which directory and what to run at start,
// and does not start.

// sandboxProbeUID stands for every sandbox's host user when the state
// directory is checked: the first id of the first sandbox's range (oci's
// default IDBase). Sandboxes have no supplementary groups, and none of
// their ids owns anything on the way.
const sandboxProbeUID = 1 << 24

// prepareDataDir makes the data directory 0700, tightening one an
// earlier sbx made 0711 (or a package 0755).
func prepareDataDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("data directory %s: making it private (0700): %w", dir, err)
		}
		log.Info("data directory made private", "dir", dir, "mode_was", fmt.Sprintf("%04o", fi.Mode().Perm()))
	}
	return nil
}

// checkStateDir makes the state directory if it is missing and checks
// that a sandbox's host user can pass through every directory down to
// it. It needs root (it takes a sandbox's user for a moment, on a thread
// of its own); without root there are no sandboxes, and it checks
// nothing.
func checkStateDir(state, data string) error {
	if err := os.MkdirAll(state, 0o711); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if os.Geteuid() != 0 {
		return nil
	}
	abs, err := filepath.Abs(state)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	// The kernel follows links on the way: the directories that count
	// are the real ones.
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	// Every directory above the state directory; the runtime sets the
	// state directory's own mode (0711) itself.
	var above []string
	for d := filepath.Dir(real); ; d = filepath.Dir(d) {
		above = append([]string{d}, above...)
		if d == filepath.Dir(d) {
			break
		}
	}
	blocked, err := passable(above, sandboxProbeUID)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EACCES) {
		return fmt.Errorf("state directory %s: checking that sandboxes can reach it: %s: %w", state, blocked, err)
	}
	if dataReal, derr := filepath.EvalSymlinks(data); derr == nil && within(blocked, dataReal) {
		return fmt.Errorf("state directory %s is inside the data directory %s, which only the server may enter (0700), but sandboxes must reach their bundles in it: serve with a --state-dir outside the data directory (default /run/sbx): %w",
			state, data, errdefs.ErrFailedPrecondition)
	}
	what := blocked
	var st unix.Stat_t
	if unix.Stat(blocked, &st) == nil {
		what = fmt.Sprintf("%s (mode %04o, owner %d, group %d)", blocked, st.Mode&0o7777, st.Uid, st.Gid)
	}
	return fmt.Errorf("state directory %s: sandboxes cannot reach it: %s does not let other users pass, and every sandbox runs as a host user of its own; run `chmod o+x %s` (and the same for any directory above it that refuses), or serve with a --state-dir under directories every user may pass through (default /run/sbx): %w",
		state, what, blocked, errdefs.ErrFailedPrecondition)
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// passable walks dirs (each the parent of the next) as uid would: with
// its file system ids and no groups, on a thread that takes them and ends
// with its goroutine, so no other goroutine ever runs with them. It
// returns the first directory uid cannot pass through, and why.
func passable(dirs []string, uid int) (string, error) {
	type answer struct {
		dir string
		err error
	}
	done := make(chan answer, 1)
	go func() {
		// Never unlocked: the thread exits with this goroutine, and the
		// ids it took go with it.
		runtime.LockOSThread()
		// Raw system calls change this thread only; the syscall package's
		// would change every thread of the process.
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			done <- answer{"", fmt.Errorf("setgroups: %w", e)}
			return
		}
		unix.RawSyscall(unix.SYS_SETFSGID, uintptr(uid), 0, 0)
		unix.RawSyscall(unix.SYS_SETFSUID, uintptr(uid), 0, 0)
		// An id that is not valid changes nothing and returns the current
		// one: the check that the switch took.
		if cur, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); int(cur) != uid {
			done <- answer{"", fmt.Errorf("setfsuid %d did not take (file system uid %d)", uid, cur)}
			return
		}
		for _, d := range dirs {
			// "d/." is looked up in d: passing through it, as a path
			// below it needs.
			var st unix.Stat_t
			if err := unix.Stat(strings.TrimSuffix(d, "/")+"/.", &st); err != nil {
				done <- answer{d, err}
				return
			}
		}
		done <- answer{}
	}()
	a := <-done
	return a.dir, a.err
}
