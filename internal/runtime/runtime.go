// Package runtime defines the contract between sbx and the things that run
// sandboxes. A Runtime owns a sandbox's lifecycle (create, stop, destroy),
// reports on it (inspect, list) and gives the layers above a connection to
// the executor that runs inside every sandbox. What is said over that
// connection is the executor's business (internal/executor); the runtime
// only carries it.
//
// The contract assumes no host: a sandbox is made from an image (a
// reference the runtime resolves) over a volume (a name the runtime
// resolves and mounts at /workspace), and nothing in Spec or Info is a
// path on the caller's machine. What only some runtimes can do is an
// optional capability, a small interface of its own (Pauser,
// StatsReader, HostProcesses); CapabilitiesOf says which a runtime has,
// and the layers above ask it rather than assume. The oci runtime (runc,
// runsc) has them all; a runtime that drives Pods (issue 22, part 2) has
// no freezer and no host, and the control plane degrades as each
// capability's doc says.
package runtime

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Runtime runs sandboxes. Implementations: oci (runc, runsc, crun).
// Every implementation passes runtimetest.Run: its contract part always,
// its capability parts for the capabilities it declares.
type Runtime interface {
	// Create starts a sandbox from spec and returns once its executor
	// answers. A failed Create leaves nothing behind. A malformed id,
	// image or volume name is errdefs.ErrInvalidArgument; an image or
	// volume the runtime cannot find, errdefs.ErrNotFound.
	Create(ctx context.Context, spec Spec) (*Info, error)
	// Dial connects to the sandbox's executor.
	Dial(ctx context.Context, id string) (net.Conn, error)
	// Stop kills the sandbox's processes but keeps its record, so that
	// Inspect still answers (State Stopped) until Destroy.
	Stop(ctx context.Context, id string) error
	// Destroy kills the sandbox and removes everything the runtime made
	// for it (on a host: cgroups, mounts, bundle, runtime state); the
	// volume is the caller's and stays. It is idempotent: destroying an
	// unknown sandbox is not an error.
	Destroy(ctx context.Context, id string) error
	// Inspect reports one sandbox; ErrNotFound if it does not exist.
	Inspect(ctx context.Context, id string) (*Info, error)
	// List reports every sandbox this runtime knows about, including those
	// a previous server process left behind, so that the caller can reattach
	// to them or destroy them.
	List(ctx context.Context) ([]Info, error)
}

// Pauser is a runtime that can freeze a sandbox's processes and thaw
// them (the oci runtime's cgroup freezer). A runtime without it (a Pod
// cannot be frozen) leaves an idle session to hibernate instead, and a
// session paused on request keeps its sandbox unfrozen but unused
// (internal/session). Pause of a paused sandbox, or Resume of a running
// one, is a *StateError; an unknown sandbox, ErrNotFound.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// StatsReader is a runtime that reads a sandbox's resource usage
// cheaply, running, paused or stopped; ErrNotFound if it does not exist.
// Cheap matters: the usage sampler (internal/usage) calls it for every
// sandbox every few seconds. Without it, usage has no live figures for
// the runtime's sandboxes.
type StatsReader interface {
	Stats(ctx context.Context, id string) (*Stats, error)
}

// HostProcesses is a runtime whose sandboxes run on the caller's host:
// their processes (or, under gVisor, their kernel's) are host processes
// in host cgroups, and their mounts are made on the host. Only tests
// look this close (runtimetest's host probes); the control plane needs
// nothing of it.
type HostProcesses interface {
	// Pid is the host pid of the sandbox's first process (the executor;
	// under gVisor, its sandbox process), 0 when it runs no process;
	// ErrNotFound if the sandbox does not exist.
	Pid(ctx context.Context, id string) (int, error)
}

// Pools is a runtime whose warm pools are shared by every replica that
// uses it: the pool's sandboxes are the runtime's (on Kubernetes, Pods
// labelled with their pool and state), its size is one number for the
// whole deployment, one replica (the leader) fills it and any replica
// claims from it, atomically, so that no two claims ever get one
// sandbox. A runtime without it (oci: sandboxes are a host's) leaves each
// process to keep pools of its own (internal/sandbox/pool.go).
type Pools interface {
	// PoolCounts reports pool name's sandboxes of build that are ready
	// and that are starting, as this process last heard.
	PoolCounts(ctx context.Context, name, build string) (ready, starting int, err error)
	// StartPooled starts one sandbox of spec for pool name, build, and
	// returns once it is ready to claim: its executor answered and its
	// preload is done. A failed start leaves nothing behind.
	StartPooled(ctx context.Context, name, build string, spec Spec) error
	// ClaimPooled claims one ready sandbox of pool name (of build; ""
	// any) and makes it volume's holder, adding labels to its own (which
	// Inspect and List report from then on). The sandbox keeps its id; what
	// it runs never changes. ErrNotFound: none is ready.
	ClaimPooled(ctx context.Context, name, build, volume string, labels map[string]string) (id, gotBuild string, err error)
	// CollectPools destroys pool sandboxes nobody will claim: those still
	// starting after stuck, those that stopped, and ready ones of a pool
	// not in want (pool name -> its current build) or of another build.
	// Only one replica (the leader) calls it.
	CollectPools(ctx context.Context, want map[string]string, stuck time.Duration) (int, error)
}

// Capabilities says what a runtime can do beyond the core Runtime.
type Capabilities struct {
	// Pause: the runtime is a Pauser.
	Pause bool `json:"pause"`
	// Stats: the runtime is a StatsReader.
	Stats bool `json:"stats"`
	// HostProcesses: the runtime is a HostProcesses.
	HostProcesses bool `json:"host_processes"`
	// Pools: the runtime is a Pools (warm pools shared by replicas).
	Pools bool `json:"pools"`
}

// Declarer is a runtime that says what it can do. A declaration can only
// take away: a capability needs its interface as well, so that a wrapper
// (or a test's fake) can have the methods and still say it cannot.
type Declarer interface {
	Capabilities() Capabilities
}

// CapabilitiesOf says what rt can do: the optional interfaces it has,
// less what it declares it cannot (Declarer).
func CapabilitiesOf(rt Runtime) Capabilities {
	var c Capabilities
	_, c.Pause = rt.(Pauser)
	_, c.Stats = rt.(StatsReader)
	_, c.HostProcesses = rt.(HostProcesses)
	_, c.Pools = rt.(Pools)
	if d, ok := rt.(Declarer); ok {
		dc := d.Capabilities()
		c.Pause = c.Pause && dc.Pause
		c.Stats = c.Stats && dc.Stats
		c.HostProcesses = c.HostProcesses && dc.HostProcesses
		c.Pools = c.Pools && dc.Pools
	}
	return c
}

// PauserOf returns rt as a Pauser if it can pause (CapabilitiesOf).
func PauserOf(rt Runtime) (Pauser, bool) {
	if !CapabilitiesOf(rt).Pause {
		return nil, false
	}
	return rt.(Pauser), true
}

// StatsReaderOf returns rt as a StatsReader if it reads stats
// (CapabilitiesOf).
func StatsReaderOf(rt Runtime) (StatsReader, bool) {
	if !CapabilitiesOf(rt).Stats {
		return nil, false
	}
	return rt.(StatsReader), true
}

// HostProcessesOf returns rt as a HostProcesses if its sandboxes run on
// this host (CapabilitiesOf).
func HostProcessesOf(rt Runtime) (HostProcesses, bool) {
	if !CapabilitiesOf(rt).HostProcesses {
		return nil, false
	}
	return rt.(HostProcesses), true
}

// PoolsOf returns rt as a Pools if its warm pools are shared
// (CapabilitiesOf).
func PoolsOf(rt Runtime) (Pools, bool) {
	if !CapabilitiesOf(rt).Pools {
		return nil, false
	}
	return rt.(Pools), true
}

// State is where a sandbox is in its life.
type State string

const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateStopped  State = "stopped"
)

// Spec says what to run: an image (a built template) over a volume (the
// caller's workspace, which outlives the sandbox). Both are names the
// runtime resolves, never host paths: a runtime may have no host in
// common with its caller.
type Spec struct {
	// ID names the sandbox: [a-zA-Z0-9_-], at most 64 characters.
	ID string
	// Image is the template build to run, as an OCI image reference
	// (template.ImageRef: sbx/NAME:BUILDHASH). Its root filesystem is
	// mounted read-only.
	Image string
	// Runtime is the template's OCI runtime (template.Spec.Runtime: runc,
	// crun or runsc; "" is runc). A runtime made for one of them (oci: the
	// control plane asks for one per name, sandbox.Config.Runtime) has
	// nothing to choose; one that runs them all (kube) runs the sandbox
	// under what it maps the name to, and refuses a name it maps to
	// nothing rather than run it under another.
	Runtime string
	// Volume names the workspace volume mounted read-write at /workspace
	// (workspace.SessionVolume, workspace.PoolVolume). The runtime makes
	// its files owned by the sandbox user, except for entries owned by the
	// sandbox's root, which the control plane put there to be read-only
	// to user code (conversation uploads).
	Volume string
	// Env is added to every execution's environment.
	Env map[string]string
	// Preload lists Python modules the executor imports once, before the
	// first execution, so executions do not pay for them.
	Preload []string
	// Resources are the sandbox's limits; zero fields take defaults.
	Resources Resources
	// Network, when true, gives the sandbox more than loopback. Only false
	// is supported today.
	Network bool
	// Labels are kept with the sandbox and returned by Inspect and List, so
	// that a restarted server can tell which session a sandbox served.
	Labels map[string]string
}

// Resources are a sandbox's limits.
type Resources struct {
	// CPU is the number of cores the sandbox may use (0.5 = half a core).
	CPU float64 `json:"cpu,omitempty"`
	// MemoryMB caps memory and swap together, in MiB.
	MemoryMB int64 `json:"memory_mb,omitempty"`
	// PIDs caps the number of processes and threads.
	PIDs int64 `json:"pids,omitempty"`
	// TmpMB caps the size of /tmp (a tmpfs, counted in memory), in MiB.
	TmpMB int64 `json:"tmp_mb,omitempty"`
	// DiskMB caps the workspace, in MiB. Enforcement is the workspace
	// layer's; the runtime only carries the number.
	DiskMB int64 `json:"disk_mb,omitempty"`
}

// DefaultResources are used for every zero field of Resources.
var DefaultResources = Resources{CPU: 1, MemoryMB: 512, PIDs: 256, TmpMB: 64, DiskMB: 1024}

// WithDefaults returns r with every zero field taken from DefaultResources.
func (r Resources) WithDefaults() Resources {
	d := DefaultResources
	if r.CPU > 0 {
		d.CPU = r.CPU
	}
	if r.MemoryMB > 0 {
		d.MemoryMB = r.MemoryMB
	}
	if r.PIDs > 0 {
		d.PIDs = r.PIDs
	}
	if r.TmpMB > 0 {
		d.TmpMB = r.TmpMB
	}
	if r.DiskMB > 0 {
		d.DiskMB = r.DiskMB
	}
	return d
}

// Info describes one sandbox. Image and Volume are the names Create was
// given: a warm pool's sandbox claimed for a session keeps its pool
// volume's name, though on the oci runtime its directory has taken the
// session's place since (internal/sandbox/pool.go).
type Info struct {
	ID        string            `json:"id"`
	State     State             `json:"state"`
	Runtime   string            `json:"runtime"`
	Image     string            `json:"image"`
	Volume    string            `json:"volume"`
	Resources Resources         `json:"resources"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
}

// Stats is a sandbox's resource usage, and the limits it is held to.
type Stats struct {
	// MemoryBytes is what the memory limit counts: the processes' memory
	// and the page cache of their files and of /tmp.
	MemoryBytes     uint64 `json:"memory_bytes"`
	MemoryPeakBytes uint64 `json:"memory_peak_bytes"`
	// MemoryCacheBytes is the page cache part of MemoryBytes, which the
	// kernel reclaims before it kills anything.
	MemoryCacheBytes uint64 `json:"memory_cache_bytes"`
	// CPUNanos is the CPU time the sandbox's processes used since it
	// started; it only grows.
	CPUNanos uint64 `json:"cpu_nanos"`
	PIDs     uint64 `json:"pids"`
	OOMKills uint64 `json:"oom_kills"`
	// DiskBytes is the workspace's use where the runtime knows it without
	// the host (a Pod: the executor's walk at its last execution); 0 where
	// the host's quota says it (the usage sampler's Disk).
	DiskBytes uint64 `json:"disk_bytes"`
	// Limits are the resources the sandbox was created with, defaults
	// filled in.
	Limits Resources `json:"limits"`
}

// StateError is an operation asked of a sandbox in a state that does not
// allow it, such as resuming a running sandbox. It is an
// errdefs.ErrFailedPrecondition.
type StateError struct {
	ID    string
	Op    string
	State State
}

func (e *StateError) Error() string {
	return "sandbox " + e.ID + ": cannot " + e.Op + " a " + string(e.State) + " sandbox"
}

// Is makes errors.Is(err, errdefs.ErrFailedPrecondition) true.
func (e *StateError) Is(target error) bool { return target == errdefs.ErrFailedPrecondition }

// Job is a one-shot container for work that is not a sandbox: a step of a
// template build. It runs Args to completion as root of a user namespace
// of its own (host ids of its own, like a sandbox's), with no capability
// on the host, under seccomp, in its own PID, mount, IPC, UTS and cgroup
// namespaces and a network namespace with loopback only unless NetNS
// names another. Root and the Storage binds are reached through idmapped
// mounts, so what the job writes there belongs to the storage ids on disk
// (root inside the job is the first storage id), as template builds must.
type Job struct {
	// Root is the job's root directory, read-write unless ReadOnlyRoot.
	Root         string
	ReadOnlyRoot bool
	// Binds are mounted into the job, in order.
	Binds []Bind
	// Args, Env and Cwd are the process's ("/" if Cwd is empty).
	Args []string
	Env  []string
	Cwd  string
	// Stdin (nil: none), Stdout and Stderr (nil: discarded) are the
	// process's standard streams.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// NetNS is the path of a network namespace to join (egress.NetNS);
	// empty: a new one with loopback only.
	NetNS string
	// Resources bound the job: CPU, MemoryMB, PIDs and TmpMB (a tmpfs on
	// /tmp; 0: /tmp is Root's own). Zero CPU, memory and PIDs take
	// DefaultJobResources'.
	Resources Resources
}

// Bind is a bind mount of a host directory into a job.
type Bind struct {
	Source, Dest string
	ReadOnly     bool
	// Storage: the source belongs to the storage ids and is mounted
	// through the job's idmapping (as Root is); otherwise it is mounted as
	// it is, and whatever the host owns there shows as the overflow id.
	Storage bool
}

// DefaultJobResources fill Job.Resources' zero fields.
var DefaultJobResources = Resources{CPU: 1, MemoryMB: 2048, PIDs: 1024}
