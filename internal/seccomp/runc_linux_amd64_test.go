package seccomp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// What the probe (testdata/probe) does that any program must be able to do,
// and what the outer profile must refuse.
var (
	probeOrdinary = []string{
		"goroutines", "files", "exec self", "socket AF_UNIX", "socket AF_INET",
		"socket AF_NETLINK", "personality query",
	}
	probeRefused = []string{
		"ptrace", "bpf", "keyctl", "perf_event_open", "io_uring_setup",
		"socket AF_VSOCK", "socket AF_VSOCK high bits",
		"ioctl BTRFS_IOC_SUBVOL_CREATE", "ioctl BTRFS_IOC_SNAP_CREATE_V2 high bits",
		"personality high bits", "personality ADDR_NO_RANDOMIZE",
	}
)

func TestOCIProfileUnderRunc(t *testing.T) {
	runc := requireRunc(t)
	bundle := probeBundle(t)

	t.Run("control without seccomp", func(t *testing.T) {
		// Shows that the probe's refused calls fail with something other
		// than EPERM when only the container's other limits apply, so that
		// the EPERMs below are the profile's doing.
		got := runProbe(t, runc, bundle, nil, nil, nil)
		expect(t, got, "seccomp", "0")
		for _, name := range probeOrdinary {
			expect(t, got, name, "ok")
		}
		for _, name := range probeRefused {
			if got[name] == "EPERM" || got[name] == "" {
				t.Errorf("%s: got %q without seccomp; the probe cannot show that the profile refuses it", name, got[name])
			}
		}
	})
	t.Run("outer profile", func(t *testing.T) {
		got := runProbe(t, runc, bundle, OCI(), nil, nil)
		expect(t, got, "seccomp", "2")
		expect(t, got, "no_new_privs", "1")
		for _, name := range probeOrdinary {
			expect(t, got, name, "ok")
		}
		for _, name := range probeRefused {
			expect(t, got, name, "EPERM")
		}
		// Refusing the btrfs requests leaves the rest of ioctl alone.
		if r := got["ioctl FICLONE"]; r == "EPERM" || r == "" {
			t.Errorf("ioctl FICLONE: got %q under the profile; only the btrfs subvolume requests are refused", r)
		}
	})
	t.Run("outer profile with CAP_SYS_ADMIN", func(t *testing.T) {
		// The executor's case: with the capability, the profile must not
		// stand in the way of mounts and namespaces.
		caps := []string{"CAP_SYS_ADMIN"}
		got := runProbe(t, runc, bundle, OCI(), caps, []string{"PROBE_PRIVILEGED=1"})
		expect(t, got, "seccomp", "2")
		expect(t, got, "mount", "ok")
		expect(t, got, "exec in new namespaces", "ok")
		for _, name := range probeOrdinary {
			expect(t, got, name, "ok")
		}
	})
}

// requireRunc skips the test unless it can run containers, and returns the
// path of runc.
func requireRunc(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run containers with runc")
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("runc is not on PATH")
	}
	return runc
}

func expect(t *testing.T, got map[string]string, name, want string) {
	t.Helper()
	if got[name] != want {
		t.Errorf("%s: got %q, want %q", name, got[name], want)
	}
}

// probeBundle builds the probe statically into a fresh bundle's rootfs,
// which holds nothing else: no libc, no shell.
func probeBundle(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
		if _, err := os.Stat(goBin); err != nil {
			t.Skip("no Go toolchain to build the probe with")
		}
	}
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	// The rootfs is read-only in the container, so mount points must exist.
	for _, dir := range []string{"proc", "dev", "tmp", "mnt"} {
		if err := os.MkdirAll(filepath.Join(rootfs, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command(goBin, "build", "-o", filepath.Join(rootfs, "probe"), "./testdata/probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, out)
	}
	return bundle
}

// runProbe runs the probe as PID 1 of a container configured like a
// sandbox and returns its report.
func runProbe(t *testing.T, runc, bundle string, profile *specs.LinuxSeccomp, caps, env []string) map[string]string {
	t.Helper()
	spec := sandboxSpec(profile, caps)
	spec.Process.Args = []string{"/probe"}
	spec.Process.Env = append(spec.Process.Env, env...)
	return parseResults(runContainer(t, runc, bundle, spec))
}

// runContainer writes spec into bundle, runs it with runc in the
// foreground and returns what the container wrote to stdout.
func runContainer(t *testing.T, runc, bundle string, spec *specs.Spec) []byte {
	t.Helper()
	id := sanitizeID(fmt.Sprintf("sbx-seccomp-test-%d-%s", os.Getpid(), t.Name()))
	// An explicit top-level cgroup, which runc removes with the container;
	// without one runc scatters cgroups (see notes/runtime-facts.md).
	spec.Linux.CgroupsPath = "/" + id
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	t.Cleanup(func() {
		// runc run removes the container when its process exits; this is
		// for a run that failed half-way.
		_ = exec.Command(runc, "--root", state, "delete", "-f", id).Run()
	})
	cmd := exec.Command(runc, "--root", state, "run", "--bundle", bundle, id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("runc run: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.Bytes())
	}
	t.Logf("container output:\n%s", out) // shown with -v or on failure
	return out
}

// sanitizeID keeps a container id to the characters runc accepts.
func sanitizeID(id string) string {
	b := []byte(id)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '-'
		}
	}
	return string(b)
}

// sandboxSpec is a container configured like a sandbox: read-only root,
// new namespaces, no_new_privs, only the given capabilities and the given
// seccomp profile. The caller sets the process's arguments.
func sandboxSpec(profile *specs.LinuxSeccomp, caps []string) *specs.Spec {
	return &specs.Spec{
		// runc 1.1 speaks runtime-spec 1.0.2; nothing used here is newer.
		Version:  "1.0.2",
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Hostname: "sandbox",
		Process: &specs.Process{
			Cwd:             "/",
			Env:             []string{"PATH=/usr/bin:/bin:/"},
			NoNewPrivileges: true,
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755", "size=64k"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "nodev", "mode=1777", "size=16m"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=64m"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace},
			},
			Seccomp: profile,
		},
	}
}
