package executor

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCgroupV1(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string]string{
		// The sandbox's own cgroup, at the path /proc/self/cgroup names
		// (as on a host) ...
		"memory/sbx/s1/memory.usage_in_bytes":     "1000\n",
		"memory/sbx/s1/memory.max_usage_in_bytes": "2000\n",
		"memory/sbx/s1/memory.limit_in_bytes":     "268435456\n",
		"memory/sbx/s1/memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
		"memory/sbx/s1/memory.stat":               "cache 100\nrss 800\ntotal_cache 400\ntotal_rss 900\n",
		// ... or at the top (as inside a container).
		"cpuacct/cpuacct.usage": "123456789\n",
		"pids/pids.current":     "7\n",
		"pids/pids.max":         "max\n",
	})
	self := []byte("12:pids:/sbx/s1\n4:memory:/sbx/s1\n2:cpu,cpuacct:/sbx/s1\n0::/\n")
	st := newCgroupReader(root, self).read()
	want := wire.Stats{CgroupVersion: 1, MemoryUsageBytes: 1000, MemoryPeakBytes: 2000, MemoryLimitBytes: 268435456,
		MemoryCacheBytes: 400, CPUUsageNs: 123456789, PidsCurrent: 7, PidsLimit: 0, OOMKillCount: 3}
	if st != want {
		t.Errorf("stats %+v\nwant  %+v", st, want)
	}
}

func TestCgroupV1Unlimited(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"})
	r := newCgroupReader(root, nil)
	if l := r.memoryLimit(); l != 0 {
		t.Errorf("limit %d, want 0 (unlimited)", l)
	}
	if st := r.read(); st.CPUUsageNs != 0 || st.PidsCurrent != 0 {
		t.Errorf("missing files must read as 0: %+v", st)
	}
}

func TestCgroupV2(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string]string{
		"cgroup.controllers": "cpu memory pids\n",
		"memory.current":     "4096\n",
		"memory.peak":        "8192\n",
		"memory.max":         "max\n",
		"memory.events":      "low 0\nhigh 0\nmax 5\noom 2\noom_kill 1\n",
		"memory.stat":        "anon 1024\nfile 2048\nkernel 512\nfile_mapped 100\n",
		"cpu.stat":           "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
		"pids.current":       "3\n",
		"pids.max":           "64\n",
	})
	st := newCgroupReader(root, []byte("0::/\n")).read()
	want := wire.Stats{CgroupVersion: 2, MemoryUsageBytes: 4096, MemoryPeakBytes: 8192, MemoryCacheBytes: 2048, CPUUsageNs: 1_500_000,
		PidsCurrent: 3, PidsLimit: 64, OOMKillCount: 1}
	if st != want {
		t.Errorf("stats %+v\nwant  %+v", st, want)
	}
}
