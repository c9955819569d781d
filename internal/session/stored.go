package session

import (
	"context"
	"fmt"
	"sync"

	"github.com/sbx-sandbox/sbx/internal/blob"
)

// Stored bytes: what a tenant keeps in the blob store, the chunks
// and manifests of its snapshots, hibernated workspaces, resource content
// (all under Snapshots.Prefixes) and presigned copies (StoredPrefixes),
// counted from the blob store itself. The first check of
// a tenant walks its prefixes; what this server writes for it afterwards
// is added as it is written. Deletions free bytes only when the
// collectors remove them (a deleted snapshot's chunks stay for the grace
// period of collection), so after each collection the counts are dropped
// and walked again on next use.
type storedBytes struct {
	mu    sync.Mutex
	known map[string]int64
}

// storedPrefixes are the tenant's prefixes in the blob store.
func (m *Manager) storedPrefixes(tenant string) []string {
	var p []string
	if m.opt.Snapshots != nil {
		p = m.opt.Snapshots.Prefixes(tenant)
	}
	if m.opt.StoredPrefixes != nil {
		p = append(p, m.opt.StoredPrefixes(tenant)...)
	}
	return p
}

// Stored returns what the tenant keeps in the blob store, in bytes.
func (m *Manager) Stored(ctx context.Context, tenant string) (int64, error) {
	m.stored.mu.Lock()
	n, ok := m.stored.known[tenant]
	m.stored.mu.Unlock()
	if ok {
		return n, nil
	}
	if m.opt.Snapshots == nil {
		return 0, nil
	}
	for _, prefix := range m.storedPrefixes(tenant) {
		err := m.opt.Snapshots.Blobs().List(ctx, prefix, func(info blob.Info) error {
			n += info.Size
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("counting what tenant %q stores: %w", tenant, err)
		}
	}
	m.stored.mu.Lock()
	defer m.stored.mu.Unlock()
	if m.stored.known == nil {
		m.stored.known = map[string]int64{}
	}
	if have, ok := m.stored.known[tenant]; ok { // another call walked meanwhile and
		return have, nil // may have counted writes since
	}
	m.stored.known[tenant] = n
	return n, nil
}

// AddStored counts n bytes the tenant has just written to the blob store.
func (m *Manager) AddStored(tenant string, n int64) {
	m.stored.mu.Lock()
	if _, ok := m.stored.known[tenant]; ok {
		m.stored.known[tenant] += n
	}
	m.stored.mu.Unlock()
}

// StoredCollected drops every count: a collector has removed blobs.
func (m *Manager) StoredCollected() {
	m.stored.mu.Lock()
	m.stored.known = nil
	m.stored.mu.Unlock()
}

// AdmitStored checks that the tenant may write more to the blob store: a
// write is refused once what it stores is at its limit, so a tenant goes
// past it by one write at most (one snapshot: at most its session's disk
// quota).
func (m *Manager) AdmitStored(ctx context.Context, tenant string) error {
	limit := m.limits(tenant).StoredMB
	if limit == 0 {
		return nil
	}
	n, err := m.Stored(ctx, tenant)
	if err != nil {
		return err
	}
	if n >= limit<<20 {
		return quotaError(tenant, "stored (MiB in the blob store: snapshots, hibernated workspaces, resource content, presigned copies)",
			n>>20, "more", limit, "delete snapshots or sessions; their bytes are freed when the collector next runs")
	}
	return nil
}
