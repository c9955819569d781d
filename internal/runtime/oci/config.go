package oci

import (
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/seccomp"
)

// Paths inside every sandbox. Templates create these mount points at build
// time, because a read-only rootfs cannot.
const (
	workspaceDir   = "/workspace"
	controlDir     = "/run/sbx"
	executorDir    = "/opt/sbx"
	executorSocket = controlDir + "/executor.sock"
	executorBinary = executorDir + "/sbx-executor"
	envFile        = controlDir + "/env.json"
)

// sandboxUID is the user code runs as inside every sandbox.
const sandboxUID = 1000

// executorCaps are what the executor keeps inside the sandbox's own user
// namespace: enough to give each execution its own PID and mount namespace
// and to drop to sandboxUID (SYS_ADMIN, SETUID, SETGID, SETPCAP), to read
// the workspace for the artifact list (DAC_READ_SEARCH), to kill user
// code (KILL), and to serve the workspace's files as the sandbox's root
// (CHOWN, DAC_OVERRIDE, FOWNER: the file routes write in the user's
// directories and give the files they write to the user). They mean
// nothing outside that namespace, and user code never has any of them
// (the executor clears every set, the bounding set included, before it
// runs user code). The executor itself leaves only KILL and
// DAC_READ_SEARCH effective (cmd/sbx-executor), and makes CHOWN,
// DAC_OVERRIDE and FOWNER effective only on the thread of a file call
// (internal/executor/filecaps.go); the shim gives those three up at once;
// the rest are for the zygote, whose workers make the namespaces.
var executorCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_SYS_ADMIN",
}

// maskedPaths and readonlyPaths are the usual set (runc's `runc spec`,
// containerd's defaults): kernel interfaces a sandbox has no business with.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
		"/proc/sched_debug", "/proc/scsi", "/sys/firmware",
		"/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// bundleConfig is what config.json is generated from.
type bundleConfig struct {
	runtime    string // runc, crun or runsc: runsc gets gvisorSpec's changes
	spec       runtime.Spec
	rootfs     string // the sandbox's read-only mount of spec.Image's root filesystem (rootfs.go)
	workspace  string // the sandbox's mount of spec.Volume's directory (rootfs.go)
	res        runtime.Resources
	controlDir string // host directory mounted at /run/sbx
	binDir     string // host directory holding sbx-executor, mounted at /opt/sbx
	uidShift   uint32 // the sandbox's root on the host (ids.go)
	uidRange   uint32
	cgroupPath string
}

// executorTasks is the room the pids cgroup leaves above Resources.PIDs for
// the executor (PID 1, a Go program that dies when it cannot make a thread)
// and the zygote, which run as the sandbox's root.
//
// Resources.PIDs itself is enforced by RLIMIT_NPROC, which the kernel counts
// per uid *and user namespace* (since Linux 5.14): every sandbox has its own
// user namespace, so the limit counts the processes and threads of one
// sandbox's user code (uid sandboxUID) and nothing else. A fork bomb stops
// there, leaving the executor its room in the cgroup; with the cgroup limit
// alone it took the last slot and the executor's next thread, killing the
// sandbox. The cgroup limit stays as the backstop for the sandbox as a whole.
const executorTasks = 32

// ociSpec builds the OCI runtime spec of one sandbox.
func ociSpec(c bundleConfig) *specs.Spec {
	res := c.res
	memory := res.MemoryMB << 20
	quota := int64(res.CPU * 100000)
	period := uint64(100000)
	pids := res.PIDs + executorTasks
	swappiness := uint64(0)
	args := []string{executorBinary,
		"--socket", executorSocket,
		"--workspace", workspaceDir,
		"--uid", strconv.Itoa(sandboxUID), "--gid", strconv.Itoa(sandboxUID),
		"--env-file", envFile,
		// Its own log, and the zygote's stderr, into a rotating file on
		// the control directory's tmpfs (rootfs.go), not runc's stdout.
		"--log-file", controlDir + "/" + executorLogName,
		"--log-max-bytes", strconv.Itoa(executorLogMax),
	}
	if len(c.spec.Preload) > 0 {
		args = append(args, "--preload", strings.Join(c.spec.Preload, ","))
	}
	caps := append([]string(nil), executorCaps...)
	s := &specs.Spec{
		// runc 1.1 speaks 1.0.2; nothing here needs a newer spec.
		Version:  "1.0.2",
		Hostname: "sbx",
		Root:     &specs.Root{Path: c.rootfs, Readonly: true},
		Process: &specs.Process{
			Args: args,
			Env:  environ(),
			Cwd:  workspaceDir,
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: caps,
				Permitted: caps,
			},
			NoNewPrivileges: true,
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Soft: 4096, Hard: 4096},
				{Type: "RLIMIT_CORE", Soft: 0, Hard: 0},
				// One file may not be larger than the whole workspace may be.
				{Type: "RLIMIT_FSIZE", Soft: uint64(res.DiskMB) << 20, Hard: uint64(res.DiskMB) << 20},
				// The process limit; see executorTasks.
				{Type: "RLIMIT_NPROC", Soft: uint64(res.PIDs), Hard: uint64(res.PIDs)},
			},
			OOMScoreAdj: intPtr(0),
		},
		Mounts: mounts(c),
		Linux: &specs.Linux{
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: c.uidShift, Size: c.uidRange}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: c.uidShift, Size: c.uidRange}},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.NetworkNamespace}, {Type: specs.UserNamespace},
				{Type: specs.CgroupNamespace},
			},
			CgroupsPath: c.cgroupPath,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &memory, Swap: &memory, Swappiness: &swappiness},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:    &specs.LinuxPids{Limit: &pids},
			},
			Seccomp:           seccomp.OCI(),
			RootfsPropagation: "private",
			MaskedPaths:       maskedPaths,
			ReadonlyPaths:     readonlyPaths,
		},
	}
	if c.runtime == "runsc" {
		gvisorSpec(s, c)
	}
	return s
}

func mounts(c bundleConfig) []specs.Mount {
	tmp := "size=" + strconv.FormatInt(c.res.TmpMB, 10) + "m"
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", tmp}},
		{Destination: workspaceDir, Type: "bind", Source: c.workspace, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
		{Destination: controlDir, Type: "bind", Source: c.controlDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		{Destination: executorDir, Type: "bind", Source: c.binDir, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
	}
}

// baseEnv is the environment of the executor and its zygote (both the
// sandbox's root), and the base of every execution's. Nothing a tenant
// chooses goes here: template and session variables reach user code only,
// through userEnv.
var baseEnv = map[string]string{
	"PATH":                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME":                    "/tmp",
	"LANG":                    "C.UTF-8",
	"TERM":                    "xterm",
	"PYTHONDONTWRITEBYTECODE": "1",
	"MPLCONFIGDIR":            "/tmp/.matplotlib",
}

// environ is baseEnv as a process environment, sorted so that the
// generated config is stable.
func environ() []string {
	out := make([]string, 0, len(baseEnv))
	for k, v := range baseEnv {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// userEnv is what the executor adds to every execution's environment (and
// only there): the spec's variables. Never nil, so the file is a JSON
// object.
func userEnv(extra map[string]string) map[string]string {
	env := make(map[string]string, len(extra))
	for k, v := range extra {
		env[k] = v
	}
	return env
}

func intPtr(v int) *int { return &v }

// sandboxCgroup is the cgroup path of a sandbox under the sbx parent. An
// explicit path keeps every controller's cgroup in one place that Destroy
// can find (runc otherwise scatters them, see runtime-facts.md).
func sandboxCgroup(parent, id string) string { return filepath.Join("/", parent, id) }
