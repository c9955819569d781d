package oci

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// cgroupMounts lists the mount points of every cgroup hierarchy: one per v1
// controller (plus the unified cgroup2 mount on a hybrid host), or the single
// cgroup2 mount.
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts... - fstype source superopts
		fields := strings.Fields(sc.Text())
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) && i >= 5 {
				if t := fields[i+1]; t == "cgroup" || t == "cgroup2" {
					out = append(out, fields[4])
				}
				break
			}
		}
	}
	return out, sc.Err()
}

// removeCgroups removes whatever cgroups of the sandbox the runtime left
// behind, in every hierarchy. The runtime's own delete normally does this;
// after a crash it may not have.
func removeCgroups(parent, id string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		dir := filepath.Join(m, parent, id)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		if err := removeCgroupDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroupDir removes a cgroup directory and any children, deepest
// first. A cgroup whose last process is still being torn down answers EBUSY
// for a moment, so that is retried briefly.
func removeCgroupDir(dir string) error {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		var err error
		for try := 0; try < 50; try++ {
			if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
				err = nil
				break
			}
			if !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("remove cgroup %s: %w", dirs[i], err)
		}
	}
	return nil
}

// frozen reports whether the sandbox's freezer cgroup is frozen (v1
// freezer.state, or v2 cgroup.events).
func frozen(parent, id string) bool {
	mounts, err := cgroupMounts()
	if err != nil {
		return false
	}
	for _, m := range mounts {
		dir := filepath.Join(m, parent, id)
		if b, err := os.ReadFile(filepath.Join(dir, "freezer.state")); err == nil {
			return strings.TrimSpace(string(b)) != "THAWED"
		}
		if readKey(filepath.Join(dir, "cgroup.events"), "frozen") == 1 {
			return true
		}
	}
	return false
}

// setFrozen freezes or thaws the sandbox's cgroup directly, as `runc
// pause` and `runc resume` do (and `runc state` reads back): the v1
// freezer where the host has one, else cgroup v2's cgroup.freeze. It waits
// until the kernel reports the new state (freezing is asynchronous). It
// reports false if the sandbox has no freezer cgroup to write.
func setFrozen(ctx context.Context, parent, id string, on bool) (bool, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return false, err
	}
	file, value := "", ""
	for _, m := range mounts {
		dir := filepath.Join(m, parent, id)
		if _, err := os.Stat(filepath.Join(dir, "freezer.state")); err == nil {
			file, value = filepath.Join(dir, "freezer.state"), map[bool]string{true: "FROZEN", false: "THAWED"}[on]
			break
		}
		if _, err := os.Stat(filepath.Join(dir, "cgroup.freeze")); err == nil && file == "" {
			file, value = filepath.Join(dir, "cgroup.freeze"), map[bool]string{true: "1", false: "0"}[on]
		}
	}
	if file == "" {
		return false, nil
	}
	if err := os.WriteFile(file, []byte(value), 0); err != nil {
		return true, err
	}
	done := func() bool {
		if strings.HasSuffix(file, "freezer.state") {
			b, _ := os.ReadFile(file)
			return strings.TrimSpace(string(b)) == value
		}
		return (readKey(filepath.Join(filepath.Dir(file), "cgroup.events"), "frozen") == 1) == on
	}
	for delay := 50 * time.Microsecond; !done(); delay = min(2*delay, 5*time.Millisecond) {
		if on && strings.HasSuffix(file, "freezer.state") {
			// A v1 freeze that meets a task in an uninterruptible sleep
			// stays FREEZING; writing FROZEN again retries it.
			os.WriteFile(file, []byte(value), 0)
		}
		select {
		case <-ctx.Done():
			return true, fmt.Errorf("waiting for the freezer: %w", ctx.Err())
		case <-time.After(delay):
		}
	}
	return true, nil
}

// statMounts keeps cgroupMounts for readCgroupStats, once it found some:
// hierarchies are mounted at boot, while mountinfo grows with the
// sandboxes' own mounts, and Stats is called for every sandbox every few
// seconds.
var statMounts struct {
	sync.Mutex
	mounts []string
}

func cachedCgroupMounts() ([]string, error) {
	statMounts.Lock()
	defer statMounts.Unlock()
	if statMounts.mounts != nil {
		return statMounts.mounts, nil
	}
	m, err := cgroupMounts()
	if err == nil && len(m) > 0 {
		statMounts.mounts = m
	}
	return m, err
}

// readCgroupStats reads a sandbox's usage from its cgroups (v1 or v2).
func readCgroupStats(parent, id string) (*runtime.Stats, error) {
	mounts, err := cachedCgroupMounts()
	if err != nil {
		return nil, err
	}
	var st runtime.Stats
	for _, m := range mounts {
		dir := filepath.Join(m, parent, id)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		read := func(name string) uint64 { return readUint(filepath.Join(dir, name)) }
		if _, err := os.Stat(filepath.Join(dir, "cgroup.controllers")); err == nil {
			// cgroup v2. On a hybrid host this directory may hold no
			// controllers; only fill what v1 did not.
			if st.MemoryBytes == 0 {
				st.MemoryBytes = read("memory.current")
				st.MemoryPeakBytes = read("memory.peak")
				st.MemoryCacheBytes = readKey(filepath.Join(dir, "memory.stat"), "file")
				st.OOMKills = readKey(filepath.Join(dir, "memory.events"), "oom_kill")
			}
			if st.CPUNanos == 0 {
				st.CPUNanos = readKey(filepath.Join(dir, "cpu.stat"), "usage_usec") * 1000
			}
			if st.PIDs == 0 {
				st.PIDs = read("pids.current")
			}
			continue
		}
		switch filepath.Base(m) {
		case "memory":
			st.MemoryBytes = read("memory.usage_in_bytes")
			st.MemoryPeakBytes = read("memory.max_usage_in_bytes")
			// total_: the sandbox's cgroup and any below it.
			st.MemoryCacheBytes = readKey(filepath.Join(dir, "memory.stat"), "total_cache")
			st.OOMKills = readKey(filepath.Join(dir, "memory.oom_control"), "oom_kill")
		case "cpuacct", "cpu,cpuacct":
			st.CPUNanos = read("cpuacct.usage")
		case "pids":
			st.PIDs = read("pids.current")
		}
	}
	return &st, nil
}

func readUint(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// readKey reads "key value" lines (memory.events, cpu.stat, oom_control).
func readKey(path, key string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// maxChownEntries bounds the walk of chownTree: Create holds a start slot
// while it runs, and a workspace may hold millions of files.
const maxChownEntries = 100_000

// errChownDone stops a walk that was cut short.
var errChownDone = errors.New("walk stopped")

// prepareWorkspace makes the workspace the sandbox user's. A workspace the
// control plane made is already: its directory and every file in it are
// written as the storage ids (the control plane's own files as storage
// root, to stay read-only to user code), and what the sandbox writes
// through its idmapped mount lands as them too; its directory owned by the
// storage user says so, and nothing is walked. A directory of someone else
// (one a caller of the runtime made itself, as root say) is walked by
// chownTree, which ctx cancels and maxChownEntries bounds.
func prepareWorkspace(ctx context.Context, dir string, uid, gid, keep int) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	if int(st.Uid) == uid && int(st.Gid) == gid {
		return nil
	}
	_, err := chownTree(ctx, dir, uid, gid, keep, maxChownEntries)
	return err
}

// chownTree makes every entry of dir owned by uid:gid, leaving entries that
// already are alone (the common case: files the sandbox itself wrote), and
// so are entries owned by keep: the sandbox's root, whose files (the
// control plane's conversation uploads) are meant to be read-only to user
// code. The walk is confined to dir with os.Root: a workspace may be shared
// with a running sandbox, whose code could swap a directory for a symlink
// to /etc between the walk reading a name and the chown of it. It stops
// with ctx's error when ctx is done, and with ErrResourceExhausted past
// limit entries, leaving dir itself as it was; it returns how many entries
// it visited.
func chownTree(ctx context.Context, dir string, uid, gid, keep, limit int) (int, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	visited := 0
	var stop error
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if visited++; visited > limit {
			stop = fmt.Errorf("workspace %s has more than %d entries not all the sandbox user's; chown it before use: %w", dir, limit, errdefs.ErrResourceExhausted)
			return errChownDone
		}
		if visited%1024 == 0 {
			if cerr := context.Cause(ctx); cerr != nil {
				stop = cerr
				return errChownDone
			}
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if p == "." {
			return nil // last, once the rest is done (prepareWorkspace)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && (int(st.Uid) == uid && int(st.Gid) == gid || int(st.Uid) == keep) {
			return nil
		}
		return root.Lchown(p, uid, gid)
	})
	if errors.Is(err, errChownDone) {
		return visited, stop
	}
	if err != nil {
		return visited, err
	}
	// The directory last: its owner tells prepareWorkspace that the walk
	// is done, so a walk cut short is taken up again by the next Create.
	return visited, root.Lchown(".", uid, gid)
}
