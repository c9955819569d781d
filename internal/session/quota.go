package session

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Every workspace directory is made through Options.Quota with the
// session's resources.disk as its limit: a session's own, a warm
// pool's (the template's default) and the siblings that restores build
// before renaming them into place. A directory made any other way would
// have no limit.

// makeWorkspace makes dir a new, empty workspace limited to diskMB.
func (m *Manager) makeWorkspace(ctx context.Context, dir string, diskMB int64) error {
	if diskMB <= 0 { // a record from before sessions kept their disk size
		diskMB = runtime.DefaultResources.DiskMB
	}
	if err := m.opt.Quota.Make(ctx, dir, quota.MB(diskMB)); err != nil {
		return err
	}
	ws, err := workspace.Init(dir, m.opt.Owners)
	if err != nil {
		m.opt.Quota.Remove(context.WithoutCancel(ctx), dir)
		return err
	}
	return ws.Close()
}

// restoreHeadroom is how far past its limit a restore may write: a
// workspace saved full must come back, and btrfs lays out the metadata of
// a rebuilt tree a little differently. The limit is set back once it is.
func restoreHeadroom(limit int64) int64 { return limit/4 + 16<<20 }

// restoreWorkspace rebuilds the workspace saved at the blob key in a new
// directory in the trash, limited to diskMB, and returns that directory
// for the caller to rename into place.
func (m *Manager) restoreWorkspace(ctx context.Context, key string, diskMB int64) (string, *snapshot.Manifest, error) {
	if err := os.MkdirAll(m.trash, 0o700); err != nil {
		return "", nil, err
	}
	fresh := filepath.Join(m.trash, newID("restore"))
	if diskMB <= 0 {
		diskMB = runtime.DefaultResources.DiskMB
	}
	limit := quota.MB(diskMB)
	if err := m.opt.Quota.Make(ctx, fresh, limit+restoreHeadroom(limit)); err != nil {
		return "", nil, err
	}
	mf, err := m.opt.Snapshots.RestoreInto(ctx, key, fresh)
	if err == nil {
		err = m.opt.Quota.SetLimit(ctx, fresh, limit)
	}
	if err != nil {
		m.opt.Quota.Remove(context.WithoutCancel(ctx), fresh)
		return "", nil, err
	}
	return fresh, mf, nil
}

// removeAll removes dir, made of workspaces (the trash, the pools'
// directory), each with one Quota.Remove: its entries but those named in
// keep, then dir itself if nothing was kept. An entry gone meanwhile (another replica
// sharing the data directory removed it) is no error.
func (m *Manager) removeAll(ctx context.Context, dir string, keep map[string]bool) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if keep[e.Name()] {
			continue
		}
		if err := m.opt.Quota.Remove(ctx, filepath.Join(dir, e.Name())); !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(keep) == 0 {
		errs = append(errs, quota.RemoveAll(dir))
	}
	return errors.Join(errs...)
}
