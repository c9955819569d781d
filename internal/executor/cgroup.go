package executor

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"golang.org/x/sys/unix"
)

// unlimited is where a cgroup v1 limit sits when none is set
// (PAGE_COUNTER_MAX pages, rounded); anything above is reported as 0.
const unlimited = 1 << 62

// cgroupReader reads the sandbox's own cgroup counters. Inside a sandbox
// /sys/fs/cgroup shows the sandbox's cgroups at its top; on a host (tests)
// they are at the path /proc/self/cgroup names, so both are tried.
type cgroupReader struct {
	version int
	// dirs maps a v1 controller (memory, cpuacct, pids) to its directory;
	// for v2 every controller maps to the one unified directory.
	dirs map[string]string

	// The OOM kill count is read two or three times per execution: its
	// file stays open and is read with one pread (a cgroup file renders
	// afresh at offset 0) instead of open, stat, read, read, close.
	oomOnce sync.Once
	oomFD   int // -1 if it cannot be opened
}

// newCgroupReader finds the cgroup directories under root (normally
// /sys/fs/cgroup); self is the content of /proc/self/cgroup.
func newCgroupReader(root string, self []byte) *cgroupReader {
	paths := map[string]string{} // controller -> path in its hierarchy
	sc := bufio.NewScanner(bytes.NewReader(self))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			paths[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			paths[c] = parts[2]
		}
	}
	pick := func(base, rel string) string {
		if rel != "" && rel != "/" {
			if d := filepath.Join(base, rel); isDir(d) {
				return d
			}
		}
		return base
	}
	r := &cgroupReader{dirs: map[string]string{}}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		r.version = 2
		d := pick(root, paths[""])
		for _, c := range []string{"memory", "cpu", "pids"} {
			r.dirs[c] = d
		}
		return r
	}
	r.version = 1
	for _, c := range []string{"memory", "cpuacct", "pids"} {
		if base := filepath.Join(root, c); isDir(base) {
			r.dirs[c] = pick(base, paths[c])
		}
	}
	return r
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// read returns the counters; anything missing is 0.
func (r *cgroupReader) read() wire.Stats {
	s := wire.Stats{CgroupVersion: r.version}
	if r.version == 2 {
		s.MemoryUsageBytes = r.uint("memory", "memory.current")
		s.MemoryPeakBytes = r.uint("memory", "memory.peak")
		s.MemoryLimitBytes = r.uint("memory", "memory.max")
		s.MemoryCacheBytes = r.keyed("memory", "memory.stat", "file")
		s.CPUUsageNs = r.keyed("cpu", "cpu.stat", "usage_usec") * 1000
		s.PidsCurrent = r.uint("pids", "pids.current")
		s.PidsLimit = r.uint("pids", "pids.max")
		s.OOMKillCount = r.oomKills()
		return s
	}
	s.MemoryUsageBytes = r.uint("memory", "memory.usage_in_bytes")
	s.MemoryPeakBytes = r.uint("memory", "memory.max_usage_in_bytes")
	s.MemoryLimitBytes = r.memoryLimit()
	// total_: the cgroup's and any below it, as the usage counts them.
	s.MemoryCacheBytes = r.keyed("memory", "memory.stat", "total_cache")
	s.CPUUsageNs = r.uint("cpuacct", "cpuacct.usage")
	s.PidsCurrent = r.uint("pids", "pids.current")
	s.PidsLimit = r.uint("pids", "pids.max")
	s.OOMKillCount = r.oomKills()
	return s
}

// oomKills is how many processes the OOM killer has killed in the cgroup.
func (r *cgroupReader) oomKills() uint64 {
	name := "memory.oom_control"
	if r.version == 2 {
		name = "memory.events"
	}
	r.oomOnce.Do(func() {
		r.oomFD = -1
		if d, ok := r.dirs["memory"]; ok {
			if fd, err := unix.Open(filepath.Join(d, name), unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
				r.oomFD = fd
			}
		}
	})
	if r.oomFD < 0 {
		return r.keyed("memory", name, "oom_kill")
	}
	var buf [512]byte
	n, err := unix.Pread(r.oomFD, buf[:], 0)
	if err != nil || n <= 0 {
		return r.keyed("memory", name, "oom_kill")
	}
	return keyedValue(buf[:n], "oom_kill")
}

// memoryLimit is the memory limit in bytes, 0 if none.
func (r *cgroupReader) memoryLimit() uint64 {
	if r.version == 2 {
		return r.uint("memory", "memory.max")
	}
	return r.uint("memory", "memory.limit_in_bytes")
}

func (r *cgroupReader) file(ctrl, name string) []byte {
	d, ok := r.dirs[ctrl]
	if !ok {
		return nil
	}
	b, _ := os.ReadFile(filepath.Join(d, name))
	return b
}

// uint reads a one-number file; "max" and v1's huge "no limit" are 0.
func (r *cgroupReader) uint(ctrl, name string) uint64 {
	v, err := strconv.ParseUint(strings.TrimSpace(string(r.file(ctrl, name))), 10, 64)
	if err != nil || v >= unlimited {
		return 0
	}
	return v
}

// keyed reads the value of key from a "key value" per line file.
func (r *cgroupReader) keyed(ctrl, name, key string) uint64 {
	return keyedValue(r.file(ctrl, name), key)
}

func keyedValue(b []byte, key string) uint64 {
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
