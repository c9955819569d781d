package session

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Limits bound what one tenant holds at once, so that no tenant
// can take the machine from the others. Zero is no bound. The server sets
// defaults for every tenant and may override them per tenant.
type Limits struct {
	// Sessions counts the tenant's sessions that are not terminated.
	Sessions int `json:"sessions,omitempty"`
	// Sandboxes counts its live sandboxes: starting, running or paused.
	Sandboxes int `json:"sandboxes,omitempty"`
	// MemoryMB and CPU bound the sums of the memory and CPU limits of its
	// live sandboxes.
	MemoryMB int64   `json:"memory_mb,omitempty"`
	CPU      float64 `json:"cpu,omitempty"`
	// DiskMB bounds the sum of the disk quotas (resources.disk) of its
	// sessions that are not terminated: what it may store.
	DiskMB int64 `json:"disk_mb,omitempty"`
	// History is how many executions are kept per session; older finished
	// ones are deleted as new ones come.
	History int `json:"history,omitempty"`
	// HistoryMB bounds what the tenant's executions, of all its sessions,
	// take in the metadata store (their records as written); its oldest
	// finished ones are deleted past it.
	HistoryMB int64 `json:"history_mb,omitempty"`
	// Snapshots is how many snapshots each session may keep.
	Snapshots int `json:"snapshots,omitempty"`
	// StoredMB bounds what the tenant keeps in the blob store: the chunks
	// and manifests of its snapshots and hibernated workspaces, and its
	// presigned copies (stored.go). Snapshots and presigns are refused at
	// the limit; hibernation is not (it moves bytes off the disk that
	// DiskMB already bounds).
	StoredMB int64 `json:"stored_mb,omitempty"`
	// Streams bounds the tenant's open requests of each long-lived kind
	// apart: event streams, execution streams and long polls, build-log
	// follows, E2B streams (internal/server/streams.go). Each holds a
	// goroutine and a connection, and some poll the store.
	Streams int `json:"streams,omitempty"`
	// Chats bounds the tenant's chat turns at once; ChatTokens the tokens
	// its turns may use in an hour, on the operator's model key
	// (internal/server/chatbudget.go).
	Chats      int   `json:"chats,omitempty"`
	ChatTokens int64 `json:"chat_tokens,omitempty"`
}

// Limits are the tenant's limits.
func (m *Manager) Limits(tenant string) Limits { return m.admission.limits(tenant) }

// Defaults are the lifecycle periods of sessions created without their
// own: an edge names them in its own units when it refuses a period.
func (m *Manager) Defaults() Defaults { return m.opt.Defaults }

// admission holds tenants to their Limits, and the server to the disk its
// workspace file system backs: the checks made before a session is
// recorded or a sandbox started, and what they hold meanwhile.
type admission struct {
	opt *Options // Limits, Store, DiskCapacityMB
	// live sums what the tenant's live sandboxes hold (Manager.usage).
	live func(tenant string) (n int, memMB int64, cpu float64)

	// sandboxes is held from a tenant's sandbox quota check until the
	// start it admits is on its entry; tenants serializes the session
	// quota check of one tenant with the insert it admits.
	sandboxes sync.Mutex
	tenants   tenantLocks
	disk      diskPromises
}

func (a *admission) limits(tenant string) Limits {
	if a.opt.Limits == nil {
		return Limits{}
	}
	return a.opt.Limits(tenant)
}

// quotaError is what every refusal looks like: 429 with Retry-After at
// the edge, and a message naming the limit.
func quotaError(tenant, what string, have, want, limit any, how string) error {
	return fmt.Errorf("tenant %q: %s: %v in use, %v more asked, the limit is %v; %s: %w",
		tenant, what, have, want, limit, how, errdefs.ErrResourceExhausted)
}

// tenantLocks serializes the quota checks of one tenant with what they
// admit, so that two requests at once cannot both take the last unit.
type tenantLocks struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (t *tenantLocks) lock(tenant string) func() {
	t.mu.Lock()
	if t.locks == nil {
		t.locks = map[string]*sync.Mutex{}
	}
	l := t.locks[tenant]
	if l == nil {
		l = &sync.Mutex{}
		t.locks[tenant] = l
	}
	t.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// admitSession checks that the tenant may have one more session that may
// store diskMB, and that the workspace file system can back it. The
// caller holds the tenant's lock until the session is recorded, and then
// calls release.
func (a *admission) admitSession(ctx context.Context, tenant string, diskMB int64) (release func(), err error) {
	// The tenant's own limits first: they name what the tenant can change.
	if l := a.limits(tenant); l.Sessions > 0 || l.DiskMB > 0 {
		u, err := a.opt.Store.TenantUsage(ctx, tenant)
		if err != nil {
			return nil, err
		}
		if l.Sessions > 0 && u.Sessions+1 > l.Sessions {
			return nil, quotaError(tenant, "sessions", u.Sessions, 1, l.Sessions, "delete a session first")
		}
		if l.DiskMB > 0 && u.DiskMB+diskMB > l.DiskMB {
			return nil, quotaError(tenant, "disk (MiB, the sum of its sessions' resources.disk)", u.DiskMB, diskMB, l.DiskMB, "delete a session or ask for less disk")
		}
	}
	return a.admitDisk(ctx, diskMB)
}

// diskPromises are the disk quotas of sessions being created: admitted,
// not yet in the store. Tenants are not serialized with each other, so
// each create counts those of the others in flight as well as the
// store's sum (one it has recorded already may be counted twice until it
// releases: a refusal near the bound, never a pass beyond it).
type diskPromises struct {
	mu      sync.Mutex
	pending int64
}

// admitDisk checks that the disk quotas of every tenant's sessions, with
// diskMB more, stay within what the workspace file system backs
// (Options.DiskCapacityMB), and holds diskMB as promised until release.
func (a *admission) admitDisk(ctx context.Context, diskMB int64) (release func(), err error) {
	capMB := a.opt.DiskCapacityMB
	if capMB <= 0 {
		return func() {}, nil
	}
	a.disk.mu.Lock()
	a.disk.pending += diskMB
	pending := a.disk.pending
	a.disk.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			a.disk.mu.Lock()
			a.disk.pending -= diskMB
			a.disk.mu.Unlock()
		})
	}
	u, err := a.opt.Store.TotalUsage(ctx)
	if err != nil {
		release()
		return nil, err
	}
	if u.DiskMB+pending > capMB {
		release()
		return nil, fmt.Errorf("workspace disk: the sessions of this server promise %d MiB (resources.disk, every tenant's), %d more asked, and the workspace file system backs %d MiB (its size times --disk-overcommit); delete a session or ask for less disk: %w",
			u.DiskMB+pending-diskMB, diskMB, capMB, errdefs.ErrResourceExhausted)
	}
	return release, nil
}

// setRes records what the entry's sandbox holds, for usage.
func (e *entry) setRes(memMB int64, cpu float64) {
	e.resMB.Store(memMB)
	e.resMilliCPU.Store(int64(math.Round(cpu * 1000)))
}

// usage sums what the tenant's live sandboxes hold, from the state each
// entry publishes (never waiting on an entry's lock, which a long
// lifecycle call may hold). Entries whose sandbox is starting count: their
// start was admitted.
func (m *Manager) usage(tenant string) (n int, memMB int64, cpu float64) {
	var milli int64
	m.mu.Lock()
	for k, e := range m.entries {
		if k.tenant == tenant && e.pub.Load() != 0 { // 0: api.SandboxNone
			n++
			memMB += e.resMB.Load()
			milli += e.resMilliCPU.Load()
		}
	}
	m.mu.Unlock()
	return n, memMB, float64(milli) / 1000
}

// admitSandbox checks that the session's tenant may have one more live
// sandbox of the session's size. The caller holds a.sandboxes until the start
// is registered on the entry.
func (a *admission) admitSandbox(s *Session) error {
	l := a.limits(s.Tenant)
	if l.Sandboxes == 0 && l.MemoryMB == 0 && l.CPU == 0 {
		return nil
	}
	n, mem, cpu := a.live(s.Tenant)
	r := s.Config.Resources
	const how = "pause or delete one of its sessions, or try again later"
	switch {
	case l.Sandboxes > 0 && n+1 > l.Sandboxes:
		return quotaError(s.Tenant, "live sandboxes", n, 1, l.Sandboxes, how)
	case l.MemoryMB > 0 && mem+r.MemoryMB > l.MemoryMB:
		return quotaError(s.Tenant, "sandbox memory (MiB)", mem, r.MemoryMB, l.MemoryMB, how)
	case l.CPU > 0 && cpu+r.CPU > l.CPU+1e-9:
		return quotaError(s.Tenant, "sandbox CPU (cores)", cpu, r.CPU, l.CPU, how)
	}
	return nil
}
