package workspace

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
)

// Dirs makes, restores, moves and removes the workspace directories on
// this host: ROOT/TENANT/SESSION, the warm pools' under ROOT/.pool and
// what is being removed under ROOT/.trash. It knows nothing of sessions'
// records or sandboxes.
//
// Every workspace directory is made through its quota.Dirs with the
// session's resources.disk as its limit: a session's own, a warm
// pool's (the template's default) and the siblings that restores build
// before renaming them into place. A directory made any other way would
// have no limit.
type Dirs struct {
	root   string
	trash  string // workspaces go here to be removed
	quota  quota.Dirs
	owners Owners
	saved  *snapshot.Store // nil: no blob store
	log    *slog.Logger
	wg     sync.WaitGroup // background removals
}

// DirsConfig configures Dirs.
type DirsConfig struct {
	// Root holds the workspaces.
	Root string
	// Quota makes each workspace a directory limited to its disk size;
	// nil is quota.None, no limit at all.
	Quota quota.Dirs
	// Owners are the host ids of the sandbox's root and user.
	Owners Owners
	// Saved keeps snapshots and hibernated workspaces, which Restore
	// reads; nil if there is no blob store.
	Saved *snapshot.Store
	Log   *slog.Logger
}

// NewDirs returns the workspace directories under cfg.Root.
func NewDirs(cfg DirsConfig) *Dirs {
	if cfg.Quota == nil {
		cfg.Quota = quota.None{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Dirs{
		root: cfg.Root, trash: filepath.Join(cfg.Root, ".trash"),
		quota: cfg.Quota, owners: cfg.Owners, saved: cfg.Saved, log: cfg.Log,
	}
}

// Wait waits for the removals Discard started.
func (d *Dirs) Wait() { d.wg.Wait() }

// Dir is a session's workspace.
func (d *Dirs) Dir(tenant, id string) string { return filepath.Join(d.root, tenant, id) }

// PoolDir holds the warm pools' workspaces.
func (d *Dirs) PoolDir() string { return filepath.Join(d.root, ".pool") }

// Trash holds what is being removed: a restarted server empties it.
func (d *Dirs) Trash() string { return d.trash }

// Make makes dir a new, empty workspace limited to diskMB.
func (d *Dirs) Make(ctx context.Context, dir string, diskMB int64) error {
	if diskMB <= 0 { // a record from before sessions kept their disk size
		diskMB = runtime.DefaultResources.DiskMB
	}
	if err := d.quota.Make(ctx, dir, quota.MB(diskMB)); err != nil {
		return err
	}
	ws, err := Init(dir, d.owners)
	if err != nil {
		d.quota.Remove(context.WithoutCancel(ctx), dir)
		return err
	}
	return ws.Close()
}

// restoreHeadroom is how far past its limit a restore may write: a
// workspace saved full must come back, and btrfs lays out the metadata of
// a rebuilt tree a little differently. The limit is set back once it is.
func restoreHeadroom(limit int64) int64 { return limit/4 + 16<<20 }

// Restore rebuilds the workspace saved at the blob key in a new
// directory in the trash, limited to diskMB, and returns that directory
// for the caller to rename into place.
func (d *Dirs) Restore(ctx context.Context, key string, diskMB int64) (string, *snapshot.Manifest, error) {
	if err := os.MkdirAll(d.trash, 0o700); err != nil {
		return "", nil, err
	}
	fresh := filepath.Join(d.trash, randomName("restore"))
	if diskMB <= 0 {
		diskMB = runtime.DefaultResources.DiskMB
	}
	limit := quota.MB(diskMB)
	if err := d.quota.Make(ctx, fresh, limit+restoreHeadroom(limit)); err != nil {
		return "", nil, err
	}
	mf, err := d.saved.RestoreInto(ctx, key, fresh)
	if err == nil {
		err = d.quota.SetLimit(ctx, fresh, limit)
	}
	if err != nil {
		d.quota.Remove(context.WithoutCancel(ctx), fresh)
		return "", nil, err
	}
	return fresh, mf, nil
}

// RemoveAll removes dir, made of workspaces (the trash, the pools'
// directory), each with one Quota.Remove: its entries but those named in
// keep, then dir itself if nothing was kept. An entry gone meanwhile (another replica
// sharing the data directory removed it) is no error.
func (d *Dirs) RemoveAll(ctx context.Context, dir string, keep map[string]bool) error {
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
		if err := d.quota.Remove(ctx, filepath.Join(dir, e.Name())); !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(keep) == 0 {
		errs = append(errs, quota.RemoveAll(dir))
	}
	return errors.Join(errs...)
}

// Discard moves dir, if it exists, to the trash and removes it in the
// background: the path is free at once, and a crash halfway leaves no
// half-removed workspace where a session would find it.
func (d *Dirs) Discard(dir string) error {
	if err := os.MkdirAll(d.trash, 0o700); err != nil {
		return err
	}
	junk := filepath.Join(d.trash, randomName("ws"))
	if err := os.Rename(dir, junk); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	d.wg.Add(1)
	go func() { // Wait waits for it
		defer d.wg.Done()
		// Gone meanwhile: a replica sharing the data directory emptied
		// the trash as it started.
		if err := d.quota.Remove(context.Background(), junk); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Error("removing a discarded workspace", "dir", junk, "err", err)
		}
	}()
	return nil
}

// MoveInto makes the pooled workspace dir the session's workspace at
// dst: dst's entries move into dir, then dir takes dst's place. The two
// have quotas of their own, equal (the claim checked), so the entries are
// copied, by reflink, rather than renamed (quota.MoveEntries). If that
// or the exchange fails, dst is left as it was.
func (d *Dirs) MoveInto(dir, dst string) error {
	undo, err := quota.MoveEntries(dst, dir)
	if err != nil {
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err != nil {
		undo()
		return err
	}
	// dir now holds the session's old directory, emptied or copied from.
	if err := d.quota.Remove(context.Background(), dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.log.Warn("warm pool: removing an emptied workspace", "dir", dir, "err", err)
	}
	return nil
}

// Remove removes one workspace directory now.
func (d *Dirs) Remove(ctx context.Context, dir string) error { return d.quota.Remove(ctx, dir) }

// randomName is prefix-HEX, a name no other directory in the trash has.
func randomName(prefix string) string {
	b := make([]byte, 10)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}
