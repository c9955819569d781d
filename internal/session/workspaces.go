package session

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// workspaces makes, restores, moves and removes the workspace directories
// on this host: WorkspaceDir/TENANT/SESSION, the warm pools' under
// WorkspaceDir/.pool and what is being removed under WorkspaceDir/.trash.
// It knows nothing of records or sandboxes.
//
// Every workspace directory is made through Options.Quota with the
// session's resources.disk as its limit: a session's own, a warm
// pool's (the template's default) and the siblings that restores build
// before renaming them into place. A directory made any other way would
// have no limit.
type workspaces struct {
	root   string // Options.WorkspaceDir
	trash  string // workspaces go here to be removed
	quota  quota.Dirs
	owners workspace.Owners
	saved  *snapshot.Store // nil: no blob store
	log    *slog.Logger
	wg     *sync.WaitGroup // the Manager's: background removals
}

func newWorkspaces(opt *Options, wg *sync.WaitGroup) *workspaces {
	return &workspaces{
		root: opt.WorkspaceDir, trash: filepath.Join(opt.WorkspaceDir, ".trash"),
		quota: opt.Quota, owners: opt.Owners, saved: opt.Snapshots, log: opt.Log, wg: wg,
	}
}

// dir is the session's workspace.
func (m *workspaces) dir(k key) string { return filepath.Join(m.root, k.tenant, k.id) }

// poolDir holds the warm pools' workspaces.
func (m *workspaces) poolDir() string { return filepath.Join(m.root, ".pool") }

// make makes dir a new, empty workspace limited to diskMB.
func (m *workspaces) make(ctx context.Context, dir string, diskMB int64) error {
	if diskMB <= 0 { // a record from before sessions kept their disk size
		diskMB = runtime.DefaultResources.DiskMB
	}
	if err := m.quota.Make(ctx, dir, quota.MB(diskMB)); err != nil {
		return err
	}
	ws, err := workspace.Init(dir, m.owners)
	if err != nil {
		m.quota.Remove(context.WithoutCancel(ctx), dir)
		return err
	}
	return ws.Close()
}

// restoreHeadroom is how far past its limit a restore may write: a
// workspace saved full must come back, and btrfs lays out the metadata of
// a rebuilt tree a little differently. The limit is set back once it is.
func restoreHeadroom(limit int64) int64 { return limit/4 + 16<<20 }

// restore rebuilds the workspace saved at the blob key in a new
// directory in the trash, limited to diskMB, and returns that directory
// for the caller to rename into place.
func (m *workspaces) restore(ctx context.Context, key string, diskMB int64) (string, *snapshot.Manifest, error) {
	if err := os.MkdirAll(m.trash, 0o700); err != nil {
		return "", nil, err
	}
	fresh := filepath.Join(m.trash, newID("restore"))
	if diskMB <= 0 {
		diskMB = runtime.DefaultResources.DiskMB
	}
	limit := quota.MB(diskMB)
	if err := m.quota.Make(ctx, fresh, limit+restoreHeadroom(limit)); err != nil {
		return "", nil, err
	}
	mf, err := m.saved.RestoreInto(ctx, key, fresh)
	if err == nil {
		err = m.quota.SetLimit(ctx, fresh, limit)
	}
	if err != nil {
		m.quota.Remove(context.WithoutCancel(ctx), fresh)
		return "", nil, err
	}
	return fresh, mf, nil
}

// removeAll removes dir, made of workspaces (the trash, the pools'
// directory), each with one Quota.Remove: its entries but those named in
// keep, then dir itself if nothing was kept. An entry gone meanwhile (another replica
// sharing the data directory removed it) is no error.
func (m *workspaces) removeAll(ctx context.Context, dir string, keep map[string]bool) error {
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
		if err := m.quota.Remove(ctx, filepath.Join(dir, e.Name())); !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(keep) == 0 {
		errs = append(errs, quota.RemoveAll(dir))
	}
	return errors.Join(errs...)
}

// discard moves dir, if it exists, to the trash and removes it in the
// background: the path is free at once, and a crash halfway leaves no
// half-removed workspace where a session would find it.
func (m *workspaces) discard(dir string) error {
	if err := os.MkdirAll(m.trash, 0o700); err != nil {
		return err
	}
	junk := filepath.Join(m.trash, newID("ws"))
	if err := os.Rename(dir, junk); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		// Gone meanwhile: a replica sharing the data directory emptied
		// the trash as it started.
		if err := m.quota.Remove(context.Background(), junk); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.log.Error("removing a discarded workspace", "dir", junk, "err", err)
		}
	}()
	return nil
}

// moveInto makes the pooled workspace dir the session's workspace at
// dst: dst's entries move into dir, then dir takes dst's place. The two
// have quotas of their own, equal (the claim checked), so the entries are
// copied, by reflink, rather than renamed (quota.MoveEntries). If that
// or the exchange fails, dst is left as it was.
func (m *workspaces) moveInto(dir, dst string) error {
	undo, err := quota.MoveEntries(dst, dir)
	if err != nil {
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err != nil {
		undo()
		return err
	}
	// dir now holds the session's old directory, emptied or copied from.
	if err := m.quota.Remove(context.Background(), dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Warn("warm pool: removing an emptied workspace", "dir", dir, "err", err)
	}
	return nil
}

// remove removes one workspace directory now.
func (m *workspaces) remove(ctx context.Context, dir string) error { return m.quota.Remove(ctx, dir) }
