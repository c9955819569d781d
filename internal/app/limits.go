package app

import (
	"fmt"
	"math"
	goruntime "runtime"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/session"
)

// Machine is what a server's default limits are made from, so that a
// default install is bounded by what its own machine has, on a laptop as
// on a large server.
type Machine struct {
	CPUs     int
	MemoryMB int64
	// WorkspaceMB is the size of the file system the workspaces live on:
	// the btrfs image or disk that holds their quotas (with quotas off,
	// the data directory's disk). Open fills it in.
	WorkspaceMB int64
}

// ThisMachine is this machine's cores and memory (0 if it cannot be
// read).
func ThisMachine() Machine {
	m := Machine{CPUs: goruntime.NumCPU()}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemoryMB = int64(si.Totalram) * int64(si.Unit) >> 20
	}
	return m
}

// fileSystemMB is the size of the file system dir is on.
func fileSystemMB(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("size of the file system of %s: %w", dir, err)
	}
	return int64(st.Blocks) * st.Bsize >> 20, nil
}

// Defaults of every tenant's limits that do not depend on the machine.
const (
	DefaultSessions  = 10000
	DefaultHistory   = 1000
	DefaultHistoryMB = 1024
	DefaultSnapshots = 32
	DefaultStoredMB  = 20 << 10
	// DefaultStreams bounds a tenant's requests held open of each kind
	// (each a goroutine and a connection; event streams poll the store),
	// DefaultChats its chat turns at once (each a model call on the
	// operator's key). The chat's tokens have no default: what is dear
	// depends on the model.
	DefaultStreams = 64
	DefaultChats   = 8
	// sandboxMB is the memory a default tenant's live sandboxes are
	// counted at for its sandbox limit: each holds an executor, a zygote
	// with its imports (about 50 MB with pandas) and kernel state.
	sandboxMB = 256
	// cpuOvercommit is how many times the machine's cores a tenant's
	// sandboxes' CPU limits may add up to.
	cpuOvercommit = 4
)

// DefaultLimits are every tenant's limits unless the operator says
// otherwise (sbx serve --limits, --tenant-limit), made from the machine
// so that no tenant, alone, can take more than the machine has:
//
//   - memory: three quarters of the machine's memory, summed over the
//     tenant's live sandboxes' memory limits, so that its sandboxes
//     together are killed by their own cgroups before the host runs out;
//     the rest is the host's, the server's and the page cache's.
//   - sandboxes: one live sandbox per 256 MiB of the machine's memory (at
//     least 4): what an idle sandbox holds, so many small ones cannot
//     fill the memory the memory limit does not see.
//   - cpu: four times the machine's cores. CPU is a quota, not a
//     reservation: agents' sandboxes mostly wait (for the model, paused
//     when idle), and a burst of all of them at once is slowed, never
//     killed.
//   - disk: the workspace file system's size times overcommit (sbx serve
//     --disk-overcommit, default 1): the sessions' disk quotas
//     (resources.disk) of one tenant never promise more than the file
//     system holds.
//
// Sessions, history (executions kept per session, and 1 GiB of records
// per tenant in the metadata store), snapshots, stored bytes, streams
// held open and chat turns at once have fixed defaults. A field the machine cannot say (0) is no
// bound.
func DefaultLimits(m Machine, overcommit float64) session.Limits {
	l := session.Limits{
		Sessions: DefaultSessions, History: DefaultHistory, HistoryMB: DefaultHistoryMB,
		Snapshots: DefaultSnapshots, StoredMB: DefaultStoredMB,
		Streams: DefaultStreams, Chats: DefaultChats,
		CPU: float64(cpuOvercommit * m.CPUs), MemoryMB: m.MemoryMB * 3 / 4,
	}
	if m.MemoryMB > 0 {
		l.Sandboxes = max(4, int(m.MemoryMB/sandboxMB))
	}
	if overcommit > 0 && m.WorkspaceMB > 0 {
		l.DiskMB = int64(math.Min(float64(m.WorkspaceMB)*overcommit, math.MaxInt64/2))
	}
	return l
}
