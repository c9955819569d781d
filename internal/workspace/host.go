package workspace

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
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

// Store keeps sessions' workspaces as volumes, by name (SessionVolume,
// PoolVolume): where they are is the store's business. Dirs keeps them as
// directories of this host, each with a disk quota; a runtime with no
// host in common with the control plane keeps them its own way. The
// session and sandbox layers use only this.
type Store interface {
	// Create makes name a new, empty workspace limited to diskMB;
	// whatever was under that name is discarded first.
	Create(ctx context.Context, name string, diskMB int64) error
	// Open opens the workspace for file calls.
	Open(ctx context.Context, name string) (Workspace, error)
	// Exists reports whether there is a workspace of that name.
	Exists(ctx context.Context, name string) (bool, error)
	// Save saves the workspace under the blob key (prev: an earlier
	// manifest of it, whose content is reused where unchanged).
	Save(ctx context.Context, name, key string, prev *snapshot.Manifest) (*snapshot.Manifest, snapshot.Stats, error)
	// Restore makes the tree saved at key the workspace's, limited to
	// diskMB, in one step: until it returns, the workspace is what it was
	// (or none), never a part.
	Restore(ctx context.Context, name, key string, diskMB int64) error
	// Claim makes the pooled workspace the session's: its files move
	// into pooled, which then takes the session's name.
	Claim(ctx context.Context, pooled, name string) error
	// Discard takes the workspace away at once and removes it in the
	// background; Remove removes it now. Neither is an error for a
	// workspace that is not there.
	Discard(ctx context.Context, name string) error
	Remove(ctx context.Context, name string) error
	// Reset removes what a previous server left: workspaces being
	// removed, and the pools' but those of the sandboxes in keep (live
	// replicas' pools).
	Reset(ctx context.Context, keep map[string]bool) error
	// Wait waits for the removals Discard started.
	Wait()
}

var _ Store = (*Dirs)(nil)

// Checkpointer is a Store whose workspaces live with their sandboxes
// (a Pod's emptyDir: internal/runtime/kube) and outlive them only as far
// as they were saved. The layer above calls Checkpoint after every
// completed execution and file write, before it answers, so that losing
// the sandbox loses nothing a completed call wrote. Dirs is no
// Checkpointer: its directories outlive every sandbox.
//
// Such a Store's workspace is in one sandbox, the session's, which the
// layer above names: another sandbox still running over the same volume
// (a start a dead replica left, not yet collected) holds an old copy,
// and reaching it by the volume's name alone could read it or save it
// over the real one. Its Open needs a running sandbox over the workspace
// (ErrUnavailable without one): the layer above starts one first and
// opens it there.
type Checkpointer interface {
	// Checkpoint saves the workspace of name as sandbox holds it as the
	// workspace's checkpoint.
	Checkpoint(ctx context.Context, name, sandbox string) error
	// OpenIn opens the workspace of name in sandbox.
	OpenIn(ctx context.Context, name, sandbox string) (Workspace, error)
	// SaveFrom saves the workspace of name under key: as sandbox holds
	// it, or with no sandbox ("") as its checkpoint has it.
	SaveFrom(ctx context.Context, name, sandbox, key string, prev *snapshot.Manifest) (*snapshot.Manifest, snapshot.Stats, error)
}

// Wait waits for the removals Discard started.
func (d *Dirs) Wait() { d.wg.Wait() }

// dir is the directory of the volume called name, which need not exist.
func (d *Dirs) dir(name string) (string, error) {
	if err := CheckVolume(name); err != nil {
		return "", err
	}
	return filepath.Join(d.root, name), nil
}

// Create makes the volume a new, empty workspace limited to diskMB. The
// directory it is in (the tenant's, the pools') is the server's alone:
// sandboxes reach their workspace through a bind mount the server makes,
// never by this path.
func (d *Dirs) Create(ctx context.Context, name string, diskMB int64) error {
	dir, err := d.dir(name)
	if err != nil {
		return err
	}
	parentMode := os.FileMode(0o700)
	if strings.HasPrefix(name, poolVolume+"/") {
		parentMode = 0o711 // as it always was
	}
	if err := os.MkdirAll(filepath.Dir(dir), parentMode); err != nil {
		return err
	}
	// A workspace that a crash kept from being removed is not this one.
	if err := d.discard(dir); err != nil {
		return err
	}
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

// Open opens the volume's workspace.
func (d *Dirs) Open(ctx context.Context, name string) (Workspace, error) {
	dir, err := d.dir(name)
	if err != nil {
		return nil, err
	}
	return Open(dir, d.owners)
}

// Exists reports whether the volume's directory is there.
func (d *Dirs) Exists(ctx context.Context, name string) (bool, error) {
	dir, err := d.dir(name)
	if err != nil {
		return false, err
	}
	switch _, err := os.Lstat(dir); {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	default:
		return false, err
	}
}

// Save snapshots the volume's directory: the walk that reuses prev's
// hashes for files whose inode and change time are the same.
func (d *Dirs) Save(ctx context.Context, name, key string, prev *snapshot.Manifest) (*snapshot.Manifest, snapshot.Stats, error) {
	dir, err := d.dir(name)
	if err != nil {
		return nil, snapshot.Stats{}, err
	}
	if d.saved == nil {
		return nil, snapshot.Stats{}, fmt.Errorf("saving a workspace: no blob store: %w", errdefs.ErrUnavailable)
	}
	return d.saved.Save(ctx, dir, key, prev)
}

// restoreHeadroom is how far past its limit a restore may write: a
// workspace saved full must come back, and btrfs lays out the metadata of
// a rebuilt tree a little differently. The limit is set back once it is.
func restoreHeadroom(limit int64) int64 { return limit/4 + 16<<20 }

// Restore rebuilds the tree saved at key in a new directory in the trash,
// limited to diskMB, and then puts it in the volume's place in one
// rename: exchanged with the directory there, which is then discarded,
// or renamed to a name that is free.
func (d *Dirs) Restore(ctx context.Context, name, key string, diskMB int64) error {
	dir, err := d.dir(name)
	if err != nil {
		return err
	}
	if d.saved == nil {
		return fmt.Errorf("restoring a workspace: no blob store: %w", errdefs.ErrUnavailable)
	}
	if err := os.MkdirAll(d.trash, 0o700); err != nil {
		return err
	}
	fresh := filepath.Join(d.trash, randomName("restore"))
	if diskMB <= 0 {
		diskMB = runtime.DefaultResources.DiskMB
	}
	limit := quota.MB(diskMB)
	if err := d.quota.Make(ctx, fresh, limit+restoreHeadroom(limit)); err != nil {
		return err
	}
	_, err = d.saved.RestoreInto(ctx, key, fresh)
	if err == nil {
		err = d.quota.SetLimit(ctx, fresh, limit)
	}
	if err == nil {
		err = d.putInPlace(fresh, dir)
	}
	if err != nil {
		d.quota.Remove(context.WithoutCancel(ctx), fresh)
		return err
	}
	return nil
}

// putInPlace makes fresh the directory at dir: exchanged with what is
// there (then discarded), or renamed if nothing is.
func (d *Dirs) putInPlace(fresh, dir string) error {
	err := unix.Renameat2(unix.AT_FDCWD, fresh, unix.AT_FDCWD, dir, unix.RENAME_EXCHANGE)
	switch {
	case err == nil:
		if err := d.discard(fresh); err != nil { // now the old workspace
			d.log.Error("removing a replaced workspace", "dir", fresh, "err", err)
		}
		return nil
	case errors.Is(err, unix.ENOENT):
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return err
		}
		return os.Rename(fresh, dir)
	}
	return err
}

// Reset empties the trash, and the pools' directory but for keep.
func (d *Dirs) Reset(ctx context.Context, keep map[string]bool) error {
	return errors.Join(d.removeAll(ctx, d.trash, nil), d.removeAll(ctx, filepath.Join(d.root, poolVolume), keep))
}

// removeAll removes dir, made of workspaces (the trash, the pools'
// directory), each with one Quota.Remove: its entries but those named in
// keep, then dir itself if nothing was kept. An entry gone meanwhile
// (another replica sharing the data directory removed it) is no error.
func (d *Dirs) removeAll(ctx context.Context, dir string, keep map[string]bool) error {
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

// Discard moves the volume's directory, if it exists, to the trash and
// removes it in the background: the name is free at once, and a crash
// halfway leaves no half-removed workspace where a session would find it.
func (d *Dirs) Discard(ctx context.Context, name string) error {
	dir, err := d.dir(name)
	if err != nil {
		return err
	}
	return d.discard(dir)
}

func (d *Dirs) discard(dir string) error {
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

// Claim makes the pooled workspace the session's at name: name's entries
// move into pooled, then pooled takes name's place. The two have quotas of
// their own, equal (the claim checked), so the entries are copied, by
// reflink, rather than renamed (quota.MoveEntries). If that or the
// exchange fails, name's workspace is left as it was.
func (d *Dirs) Claim(ctx context.Context, pooled, name string) error {
	dir, err := d.dir(pooled)
	if err != nil {
		return err
	}
	dst, err := d.dir(name)
	if err != nil {
		return err
	}
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

// Remove removes the volume's directory now.
func (d *Dirs) Remove(ctx context.Context, name string) error {
	dir, err := d.dir(name)
	if err != nil {
		return err
	}
	if err := d.quota.Remove(ctx, dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// randomName is prefix-HEX, a name no other directory in the trash has.
func randomName(prefix string) string {
	b := make([]byte, 10)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}
