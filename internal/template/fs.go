package template

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/sbx-sandbox/sbx/internal/mountinfo"
)

// lockFile takes an exclusive flock on path, waiting for it as long as ctx
// allows. flock, not a lock file's existence, so that a process that dies
// releases its locks with it. Locks conflict between open files, so two
// goroutines of one process exclude each other as two processes do.
func lockFile(ctx context.Context, path string) (*os.File, error) {
	for {
		f, ok, err := tryLockFile(path)
		if err != nil || ok {
			return f, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tryLockFile takes the lock on path if it is free.
func tryLockFile(path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, err
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil {
		return f, true, nil
	}
	f.Close()
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("lock %s: %w", path, err)
}

// unlockFile releases a lock taken by lockFile (closing drops the flock).
func unlockFile(f *os.File) {
	if f != nil {
		f.Close()
	}
}

// tmpName names a temporary directory of the build with lock key key:
// KEY.PID.RANDOM, so that a sweep can tell whose it is (see sweepTmp).
func tmpName(key string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s.%d.%s", key, os.Getpid(), hex.EncodeToString(b))
}

// sweepTmp removes what crashed builds left in dir: every entry whose
// owner's lock (locks/KEY.lock) is free. An owner holds its lock until its
// temporary directory is gone or renamed into place, so a free lock means a
// dead owner. Entries whose lock is busy (including our own builds) stay.
func sweepTmp(dir, locks string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range entries {
		key, _, _ := strings.Cut(e.Name(), ".")
		f, ok, err := tryLockFile(filepath.Join(locks, key+".lock"))
		if err != nil || !ok {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, removeTree(filepath.Join(dir, e.Name())))
		unlockFile(f)
	}
	return errors.Join(errs...)
}

// removeStale removes the temporary directories of key in dir. Only for
// the holder of key's lock, to whom all of them are stale: sweepTmp cannot
// see that, since the lock it would try is its caller's own.
func removeStale(dir, key string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), key+".") {
			errs = append(errs, removeTree(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// removeTree removes a build directory, but never one that has something
// mounted in it: removing through a mount of /proc or /dev would reach
// into the host. Builds mount only in private namespaces, so this finds
// mounts only if something else put them there; it detaches them first.
func removeTree(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// mountsUnder lists the mount points at or below dir in this process's
// mount namespace, deepest first.
func mountsUnder(dir string) ([]string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := mountinfo.Unescape(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, sc.Err()
}

// unmountUnder detaches every mount at or below dir, and fails if any is
// still there afterwards.
func unmountUnder(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil || len(mps) == 0 {
		return err
	}
	for _, mp := range mps {
		syscall.Unmount(mp, syscall.MNT_DETACH)
	}
	if mps, err = mountsUnder(dir); err != nil {
		return err
	}
	if len(mps) > 0 {
		return fmt.Errorf("%s: still mounted, not removing: %s", dir, strings.Join(mps, ", "))
	}
	return nil
}

// writeFileAtomic writes path through a temporary file and a rename, so
// that readers see the old content or the new, never a part.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+"."+tmpName("w"))
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
