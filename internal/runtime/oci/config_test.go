package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sbx-sandbox/sbx/errdefs"

	"github.com/sbx-sandbox/sbx/internal/runtime"
)

func testConfig() bundleConfig {
	return bundleConfig{
		spec: runtime.Spec{ID: "x", Image: "sbx/python:0123", Volume: "t/s", Env: map[string]string{"FOO": "bar", "HOME": "/elsewhere"},
			Preload: []string{"pandas", "numpy"}},
		rootfs: "/b/rootfs", workspace: "/b/workspace",
		res:        runtime.Resources{CPU: 0.5, MemoryMB: 256, PIDs: 64, TmpMB: 32, DiskMB: 100},
		controlDir: "/b/ctl", binDir: "/s/bin", uidShift: 100000, uidRange: 65536,
		cgroupPath: sandboxCgroup("sbx", "x"),
	}
}

// TestSpecHardening pins the properties every sandbox must have (R-70 to
// R-73); the runtimetest suite checks that they hold in a real sandbox.
func TestSpecHardening(t *testing.T) {
	s := ociSpec(testConfig())
	if !s.Root.Readonly || s.Root.Path != "/b/rootfs" {
		t.Errorf("root %+v: want the bundle's read-only mount of the rootfs", s.Root)
	}
	if !s.Process.NoNewPrivileges {
		t.Error("noNewPrivileges is off")
	}
	if s.Process.User.UID != 0 {
		t.Errorf("the executor runs as %d inside, want 0 (it drops to 1000 for user code)", s.Process.User.UID)
	}
	caps := s.Process.Capabilities
	if len(caps.Inheritable) != 0 || len(caps.Ambient) != 0 {
		t.Errorf("inheritable/ambient capabilities: %v %v", caps.Inheritable, caps.Ambient)
	}
	for _, c := range caps.Bounding {
		if !slices.Contains(executorCaps, c) {
			t.Errorf("capability %s is not one the executor needs", c)
		}
	}
	var ns []string
	for _, n := range s.Linux.Namespaces {
		if n.Path != "" {
			t.Errorf("namespace %s joins %s", n.Type, n.Path)
		}
		ns = append(ns, string(n.Type))
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.MountNamespace, specs.IPCNamespace,
		specs.UTSNamespace, specs.NetworkNamespace, specs.UserNamespace, specs.CgroupNamespace} {
		if !slices.Contains(ns, string(want)) {
			t.Errorf("no %s namespace", want)
		}
	}
	if m := s.Linux.UIDMappings; len(m) != 1 || m[0].ContainerID != 0 || m[0].HostID != 100000 || m[0].Size != 65536 {
		t.Errorf("uid mappings %+v", m)
	}
	r := s.Linux.Resources
	if *r.Memory.Limit != 256<<20 || *r.Memory.Swap != 256<<20 {
		t.Errorf("memory %d swap %d: want 256 MiB each (no swap beyond the limit)", *r.Memory.Limit, *r.Memory.Swap)
	}
	if *r.CPU.Quota != 50000 || *r.CPU.Period != 100000 {
		t.Errorf("cpu quota %d/%d, want half a core", *r.CPU.Quota, *r.CPU.Period)
	}
	if *r.Pids.Limit != 64+executorTasks {
		t.Errorf("pids cgroup %d, want the limit plus the executor's room", *r.Pids.Limit)
	}
	if !slices.Contains(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Soft: 64, Hard: 64}) {
		t.Errorf("rlimits %+v: no RLIMIT_NPROC of 64 for user code", s.Process.Rlimits)
	}
	if len(r.Devices) == 0 || r.Devices[0].Allow {
		t.Errorf("devices cgroup does not start from deny-all: %+v", r.Devices)
	}
	if s.Linux.CgroupsPath != "/sbx/x" {
		t.Errorf("cgroups path %q", s.Linux.CgroupsPath)
	}
	if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != specs.ActErrno {
		t.Errorf("seccomp default action: %+v", s.Linux.Seccomp)
	}
	if !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Error("proc paths are not masked")
	}
}

func TestSpecMounts(t *testing.T) {
	s := ociSpec(testConfig())
	byDest := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		byDest[m.Destination] = m
	}
	for dest, want := range map[string]string{
		"/workspace": "rw", "/opt/sbx": "ro", "/run/sbx": "rw", "/sys": "ro", "/sys/fs/cgroup": "ro",
	} {
		m, ok := byDest[dest]
		if !ok || !slices.Contains(m.Options, want) || !slices.Contains(m.Options, "nosuid") {
			t.Errorf("%s: %+v, want %s,nosuid", dest, m, want)
		}
	}
	if m := byDest["/tmp"]; m.Type != "tmpfs" || !slices.Contains(m.Options, "size=32m") {
		t.Errorf("/tmp: %+v, want a 32m tmpfs", m)
	}
	if byDest["/workspace"].Source != "/b/workspace" || byDest["/run/sbx"].Source != "/b/ctl" {
		t.Error("bind sources are wrong")
	}
}

func TestSpecProcess(t *testing.T) {
	s := ociSpec(testConfig())
	args := strings.Join(s.Process.Args, " ")
	if !strings.HasPrefix(args, executorBinary+" ") || !strings.Contains(args, "--preload pandas,numpy") {
		t.Errorf("args %q", args)
	}
	// The spec's variables are the tenant's: they reach user code through
	// the env file, never the environment of the executor (the sandbox's
	// root, with capabilities) or its zygote.
	env := strings.Join(s.Process.Env, "\n")
	if strings.Contains(env, "FOO=") || strings.Contains(env, "HOME=/elsewhere") || !strings.Contains(env, "HOME=/tmp") {
		t.Errorf("env: the executor's environment must be the fixed defaults only:\n%s", env)
	}
	if !strings.Contains(args, "--env-file "+envFile) {
		t.Errorf("args %q: no --env-file", args)
	}
	if u := userEnv(testConfig().spec.Env); u["FOO"] != "bar" || u["HOME"] != "/elsewhere" {
		t.Errorf("user env %v", u)
	}
	if u := userEnv(nil); u == nil {
		t.Error("userEnv(nil) is nil: the file would be null, not an object")
	}
	if !slices.IsSorted(s.Process.Env) {
		t.Error("env is not sorted: the generated config would not be stable")
	}
}

func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{
		"a": true, "run-0123abcd": true, "A_b-9": true, strings.Repeat("a", 64): true,
		"": false, "-a": false, "../x": false, "a/b": false, "a b": false, "a\x00": false, strings.Repeat("a", 65): false,
	} {
		if validID.MatchString(id) != ok {
			t.Errorf("validID(%q) = %v, want %v", id, !ok, ok)
		}
	}
}

func TestChownTree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, "a/b"), 0o755)
	os.WriteFile(filepath.Join(dir, "a/b/f"), nil, 0o644)
	os.Symlink(outside, filepath.Join(dir, "a/link"))
	os.Symlink(filepath.Dir(outside), filepath.Join(dir, "dirlink"))
	// Entries of the sandbox's root (read-only uploads) stay as they are.
	os.Mkdir(filepath.Join(dir, "uploads"), 0o755)
	os.Chown(filepath.Join(dir, "uploads"), 100000, 100000)
	if _, err := chownTree(context.Background(), dir, 101000, 101000, 100000, maxChownEntries); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".", "a", "a/b", "a/b/f", "a/link", "dirlink"} {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil || fi.Sys().(*syscall.Stat_t).Uid != 101000 {
			t.Errorf("%s not chowned: %v", p, err)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dir, "uploads")); fi.Sys().(*syscall.Stat_t).Uid != 100000 {
		t.Error("chownTree took an entry of the sandbox's root")
	}
	if fi, _ := os.Stat(outside); fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("chownTree followed a symlink out of the tree")
	}
}

// TestPrepareWorkspace: a workspace whose directory is the sandbox user's
// (every workspace the control plane makes) is not walked, however many
// files it holds, so that a big one does not hold a start slot for
// minutes; a foreign one is, but the walk stops when the context is done
// and past its bound, and is taken up again by the next Create.
func TestPrepareWorkspace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	const user, root = 101000, 100000
	owned := t.TempDir()
	if err := os.Chown(owned, user, user); err != nil {
		t.Fatal(err)
	}
	// A file of someone else in it stays theirs: nothing was walked.
	if err := os.WriteFile(filepath.Join(owned, "host-file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := prepareWorkspace(context.Background(), owned, user, user, root); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(filepath.Join(owned, "host-file")); fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("prepareWorkspace walked a workspace that is the sandbox user's")
	}

	foreign := t.TempDir()
	for i := range 3000 {
		if err := os.WriteFile(filepath.Join(foreign, fmt.Sprint(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n, err := chownTree(ctx, foreign, user, user, root, maxChownEntries)
	if !errors.Is(err, context.Canceled) || n > 1024 {
		t.Errorf("cancelled walk: %d entries, %v", n, err)
	}
	n, err = chownTree(context.Background(), foreign, user, user, root, 1000)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || n > 1001 {
		t.Errorf("bounded walk: %d entries, %v", n, err)
	}
	if err := prepareWorkspace(context.Background(), foreign, user, user, root); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(filepath.Join(foreign, "2999")); fi.Sys().(*syscall.Stat_t).Uid != user {
		t.Error("prepareWorkspace left a foreign workspace as it was")
	}
}
