package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// Tenants' builds are on the server's disk, outside any workspace quota:
// what a tenant may hold there is bounded here. A build may take
// MaxBuildBytes (the store stops it there as it runs; a build that came out
// larger all the same fails and is removed), a tenant's templates
// MaxTenantBytes together, and a build starts only while the disk has
// room for a build of the largest size, so that no tenant fills it. The
// versions no session runs on are removed once a newer one is built.

// DefaultMaxTenantBytes is Config.MaxTenantBytes' default.
const DefaultMaxTenantBytes = 20 << 30

// checkDisk refuses a build the tenant or the disk has no room for.
func (r *Registry) checkDisk(ctx context.Context, tenant, name string) error {
	held, err := r.tenantBytes(ctx, tenant, name)
	if err != nil {
		return err
	}
	if held+r.cfg.MaxBuildBytes > r.cfg.MaxTenantBytes {
		return fmt.Errorf("the tenant's other templates hold %d MiB of the %d MiB its templates may take, and a build may take %d MiB: delete some first: %w",
			held>>20, r.cfg.MaxTenantBytes>>20, r.cfg.MaxBuildBytes>>20, errdefs.ErrResourceExhausted)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(r.cfg.Templates.Dir, &st); err != nil {
		return nil // no store directory yet: the first build makes it
	}
	if free := int64(st.Bavail) * st.Bsize; free < 2*r.cfg.MaxBuildBytes {
		return fmt.Errorf("the server has %d MiB of disk free for templates, less than it keeps in reserve: %w", free>>20, errdefs.ErrResourceExhausted)
	}
	return nil
}

// tenantBytes sums the versions of a tenant's templates other than name.
func (r *Registry) tenantBytes(ctx context.Context, tenant, name string) (int64, error) {
	var sum int64
	after := ""
	for {
		docs, err := r.cfg.Store.ListDocuments(ctx, Kind, tenant, "", after, 1000)
		if err != nil {
			return 0, err
		}
		for _, d := range docs {
			var rec record
			if d.Key == name || json.Unmarshal(d.Value, &rec) != nil {
				continue
			}
			for _, v := range rec.Versions {
				sum += v.SizeBytes
			}
		}
		if len(docs) < 1000 {
			return sum, nil
		}
		after = docs[len(docs)-1].Key
	}
}

// sessionBuilds returns the builds (hashes) that a tenant's sessions of
// template name run on, and whether there is any such session: those that
// have not ended, whatever build they have.
func (r *Registry) sessionBuilds(ctx context.Context, tenant, name string) (map[string]bool, bool, error) {
	pinned, any := map[string]bool{}, false
	f := store.SessionFilter{Tenant: tenant, Limit: 1000}
	for {
		page, next, err := r.cfg.Store.ListSessions(ctx, f)
		if err != nil {
			return nil, false, err
		}
		for _, s := range page {
			if s.TemplateID != name || s.Status == api.StatusTerminated {
				continue
			}
			any = true
			var c struct {
				TemplateHash string `json:"template_hash"`
			}
			if json.Unmarshal(s.Config, &c) == nil && c.TemplateHash != "" {
				pinned[c.TemplateHash] = true
			}
		}
		if next == "" {
			return pinned, any, nil
		}
		f.PageToken = next
	}
}

// prune removes the builds of a template's versions older than its
// newest that no session runs on, here and in its record. A session not
// pinned yet (it has had no sandbox) takes the newest version.
func (r *Registry) prune(ctx context.Context, tenant, name string) {
	pinned, _, err := r.sessionBuilds(ctx, tenant, name)
	if err != nil {
		r.log.Warn("pruning a template's old versions", "tenant", tenant, "template", name, "err", err)
		return
	}
	var drop []string
	_, err = r.update(ctx, tenant, name, func(rec *record) (bool, error) {
		drop = nil
		if len(rec.Versions) < 2 {
			return false, nil
		}
		kept := []api.TemplateVersion{rec.Versions[0]}
		for _, v := range rec.Versions[1:] {
			if pinned[v.Hash] || v.Hash == rec.Build.Hash {
				kept = append(kept, v)
			} else {
				drop = append(drop, v.Hash)
			}
		}
		rec.Versions = kept
		return len(drop) > 0, nil
	})
	if err != nil {
		r.log.Warn("pruning a template's old versions", "tenant", tenant, "template", name, "err", err)
		return
	}
	for _, h := range drop {
		if err := r.cfg.Templates.Remove(ctx, h); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			r.log.Warn("removing an old template version", "tenant", tenant, "template", name, "hash", h, "err", err)
		}
	}
}
