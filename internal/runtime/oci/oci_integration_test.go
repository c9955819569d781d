//go:build integration

package oci_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

func TestRunc(t *testing.T) { conformance(t, "runc", nil) }

// TestRunsc runs the suite on gVisor, whose sandboxes differ from Linux's
// by nature in the ways the switches below name (see their doc comments in
// runtimetest.Harness). Every other check is the same as runc's.
func TestRunsc(t *testing.T) {
	conformance(t, "runsc", func(h *runtimetest.Harness) {
		// Sandboxed processes live in the sentry; the host sees the
		// sentry, its stubs and the gofer.
		h.ProcessesOffHost = true
		// gVisor has no ambient capabilities; its /proc/PID/status lacks
		// the CapAmb and NoNewPrivs lines.
		h.NoAmbientCaps = true
		// gVisor's sysfs has no /sys/class/net.
		h.NoSysfsNet = true
		// The sentry shares the memory cgroup with the code it runs: an
		// OOM kills the whole sandbox (google/gvisor#2533).
		h.SandboxWideOOM = true
		// gVisor's sentry serves mount(2) itself.
		h.EmulatedMounts = true
	})
}

func conformance(t *testing.T, name string, adjust func(*runtimetest.Harness)) {
	testenv.RequiresRoot(t)
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s is not installed", name)
	}
	env := testenv.New(t)
	stateDir := filepath.Join(env.StateRoot, name)
	// The resolvers the server uses: the template store's images and
	// workspace volumes under a root of the test's.
	rootfs := env.Rootfs(t, "python")
	spec, _ := template.Builtin("python")
	store := template.NewStore(testenv.TemplateDir())
	tmpl, ok := store.Lookup(spec)
	if !ok {
		t.Fatal("the python template is built but not found")
	}
	volumes := workspace.Volumes(filepath.Join(env.WorkspaceRoot, name))
	open := func(t *testing.T) runtime.Runtime {
		rt, err := oci.New(oci.Config{Runtime: name, StateDir: stateDir, ExecutorPath: env.Executor, CgroupParent: "sbx-test",
			Images: store, Volumes: volumes})
		if err != nil {
			t.Fatal(err)
		}
		return rt
	}
	rt := open(t)
	var vols atomic.Int64
	volumeDir := func(name string) string { return filepath.Join(string(volumes), name) }
	h := runtimetest.Harness{
		Runtime:  rt,
		ExecRoot: rt.(*oci.Runtime).ExecRoot,
		Reopen:   open,
		Image:    tmpl.Image(),
		NewVolume: func(t testing.TB) string {
			vol := workspace.SessionVolume("rtt", fmt.Sprintf("v%d-%d", os.Getpid(), vols.Add(1)))
			if err := os.MkdirAll(volumeDir(vol), 0o700); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(volumeDir(vol)) })
			return vol
		},
		MissingImage:  template.ImageRef("python", strings.Repeat("0", 64)),
		MissingVolume: workspace.SessionVolume("rtt", "missing"),
		Rootfs:        rootfs,
		VolumeDir:     volumeDir,
		CgroupDirs: func(id string) []string {
			var dirs []string
			for _, c := range []string{"memory", "pids", "cpu", "cpuacct", "freezer", "devices", "blkio", "cpuset", "unified", "systemd"} {
				dirs = append(dirs, filepath.Join("/sys/fs/cgroup", c, "sbx-test", id))
			}
			return dirs
		},
		BundleDir: func(id string) string { return filepath.Join(stateDir, "sandboxes", id) },
	}
	if adjust != nil {
		adjust(&h)
	}
	runtimetest.Run(t, h)
}

func TestCrunHybrid(t *testing.T) {
	testenv.RequiresRoot(t)
	if _, err := exec.LookPath("crun"); err != nil {
		t.Skip("crun is not installed")
	}
	_, err := oci.New(oci.Config{Runtime: "crun", StateDir: t.TempDir(), ExecutorPath: "/bin/true"})
	if _, statErr := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers"); statErr == nil && err == nil {
		b, _ := os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")
		if len(b) > 1 {
			t.Errorf("crun on a hybrid host with cgroup2 controllers (%s) was accepted", b)
		}
	}
}
