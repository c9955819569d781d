package session

import (
	"context"
	"fmt"
	"sync"

	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
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
type Stored struct {
	snapshots *snapshot.Store              // nil: no blob store
	more      func(tenant string) []string // Options.StoredPrefixes
	limits    func(tenant string) Limits

	mu    sync.Mutex
	known map[string]int64
}

// Stored is what tenants keep in the blob store.
func (m *Manager) Stored() *Stored { return m.stored }

// prefixes are the tenant's prefixes in the blob store.
func (s *Stored) prefixes(tenant string) []string {
	var p []string
	if s.snapshots != nil {
		p = s.snapshots.Prefixes(tenant)
	}
	if s.more != nil {
		p = append(p, s.more(tenant)...)
	}
	return p
}

// Bytes returns what the tenant keeps in the blob store.
func (s *Stored) Bytes(ctx context.Context, tenant string) (int64, error) {
	s.mu.Lock()
	n, ok := s.known[tenant]
	s.mu.Unlock()
	if ok {
		return n, nil
	}
	if s.snapshots == nil {
		return 0, nil
	}
	for _, prefix := range s.prefixes(tenant) {
		err := s.snapshots.Blobs().List(ctx, prefix, func(info blob.Info) error {
			n += info.Size
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("counting what tenant %q stores: %w", tenant, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		s.known = map[string]int64{}
	}
	if have, ok := s.known[tenant]; ok { // another call walked meanwhile and
		return have, nil // may have counted writes since
	}
	s.known[tenant] = n
	return n, nil
}

// Add counts n bytes the tenant has just written to the blob store.
func (s *Stored) Add(tenant string, n int64) {
	s.mu.Lock()
	if _, ok := s.known[tenant]; ok {
		s.known[tenant] += n
	}
	s.mu.Unlock()
}

// Collected drops every count: a collector has removed blobs.
func (s *Stored) Collected() {
	s.mu.Lock()
	s.known = nil
	s.mu.Unlock()
}

// Admit checks that the tenant may write more to the blob store: a
// write is refused once what it stores is at its limit, so a tenant goes
// past it by one write at most (one snapshot: at most its session's disk
// quota).
func (s *Stored) Admit(ctx context.Context, tenant string) error {
	limit := s.limits(tenant).StoredMB
	if limit == 0 {
		return nil
	}
	n, err := s.Bytes(ctx, tenant)
	if err != nil {
		return err
	}
	if n >= limit<<20 {
		return quotaError(tenant, "stored (MiB in the blob store: snapshots, hibernated workspaces, resource content, presigned copies)",
			n>>20, "more", limit, "delete snapshots or sessions; their bytes are freed when the collector next runs")
	}
	return nil
}
