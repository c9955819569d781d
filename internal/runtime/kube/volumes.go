package kube

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// labelVolume selects the Pod that holds a volume: a hash of the
// volume's name, which a label value could not hold as it is.
const labelVolume = "sbx.dev/volume"

func volumeLabel(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:20])
}

// checkpointKey is where a volume's checkpoint is kept in the blob store:
// under the volume's own name, so in its tenant's namespace.
func checkpointKey(name string) string { return name + "/checkpoint" }

// Volumes keeps the workspaces of sandboxes that run as Pods
// (workspace.Store). A Pod's workspace is an emptyDir, which goes with
// the Pod; what makes a workspace outlive its Pod is its checkpoint, a
// snapshot in the blob store that the control plane brings up to date
// after every completed execution and file write (Checkpoint) and that
// every new Pod of the volume is given before it serves (Runtime.Create).
// So a Pod deleted, evicted or lost with its node loses nothing a
// completed call wrote, and any node can take the workspace up again.
//
// Every file call goes through the executor of the Pod that holds the
// volume (Open); with no such Pod the workspace is only its checkpoint,
// which a caller makes live by starting a sandbox over the volume.
type Volumes struct {
	rt         *Runtime
	snaps      *snapshot.Store
	maxArchive int64

	mu     sync.Mutex
	last   map[string]*snapshot.Manifest // volume -> its checkpoint as last saved here
	saving map[string]*saving            // volume -> its checkpoint in progress here
}

// saving serialises one volume's checkpoints in this process: two at
// once could end in the wrong order, the older tree last.
type saving struct {
	mu      sync.Mutex
	waiters int
}

var (
	_ workspace.Store        = (*Volumes)(nil)
	_ workspace.Checkpointer = (*Volumes)(nil)
)

// Volumes returns the runtime's workspace store, checkpointing into
// snaps. maxArchive bounds an archive an executor sends.
func (r *Runtime) Volumes(snaps *snapshot.Store, maxArchive int64) *Volumes {
	v := &Volumes{rt: r, snaps: snaps, maxArchive: maxArchive, last: map[string]*snapshot.Manifest{}, saving: map[string]*saving{}}
	r.mu.Lock()
	r.volumes = v
	r.mu.Unlock()
	return v
}

// holder is the running sandbox whose Pod holds volume name, "" if none.
func (v *Volumes) holder(ctx context.Context, name string) (string, error) {
	info, err := v.holderInfo(ctx, name)
	if err != nil || info == nil {
		return "", err
	}
	return info.ID, nil
}

// holderInfo finds a running sandbox whose Pod holds volume name by the
// volume's label: the newest, if a start a dead replica left still runs
// beside the session's (the leader collects it). The session layer names
// the session's own sandbox instead (in, OpenIn, Checkpoint, SaveFrom);
// this serves the Store's calls by name.
func (v *Volumes) holderInfo(ctx context.Context, name string) (*runtime.Info, error) {
	list, err := v.rt.pods().List(ctx, metav1.ListOptions{LabelSelector: labelVolume + "=" + volumeLabel(name)})
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", name, apiErr(err))
	}
	var newest *runtime.Info
	for i := range list.Items {
		p := &list.Items[i]
		if info, ok := v.rt.info(p); ok && info.Volume == name && info.State == runtime.StateRunning {
			if newest == nil || info.CreatedAt.After(newest.CreatedAt) {
				newest = &info
			}
		}
	}
	return newest, nil
}

// in is sandbox's Info if its Pod runs and holds volume name;
// ErrUnavailable if it does not (gone, stopped, another volume's).
func (v *Volumes) in(ctx context.Context, name, sandbox string) (*runtime.Info, error) {
	pod, err := v.rt.pods().Get(ctx, podName(sandbox), metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("workspace %s: %w", name, apiErr(err))
	}
	if err == nil {
		if info, ok := v.rt.info(pod); ok && info.ID == sandbox && info.Volume == name && info.State == runtime.StateRunning {
			return &info, nil
		}
	}
	return nil, fmt.Errorf("workspace %s: sandbox %s does not hold it (gone, stopped or another's): %w", name, sandbox, errdefs.ErrUnavailable)
}

// archiveBound is the most an archive of a workspace limited to diskMB
// may hold: the files the limit lets it have, and room for the archive's
// own headers. What a sandbox sends past it is cut off: a sandbox cannot
// fill the blob store through its checkpoints.
func archiveBound(diskMB int64) int64 {
	if diskMB <= 0 {
		diskMB = runtime.DefaultResources.DiskMB
	}
	return diskMB<<20 + diskMB<<18 + 64<<20
}

// client is a workspace client of sandbox id's executor, whose archives
// are bounded by the volume's disk limit (and by maxArchive, if lower).
func (v *Volumes) client(id string, diskMB int64) (*execclient.Client, *execclient.Workspace) {
	c := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return v.rt.Dial(ctx, id) })
	limit := archiveBound(diskMB)
	if v.maxArchive > 0 {
		limit = min(limit, v.maxArchive)
	}
	return c, execclient.NewWorkspace(c, limit)
}

// Create makes name a new, empty workspace: no checkpoint. Its Pod, when
// one starts, begins empty.
//
// Every workspace has a checkpoint from its creation on (here, the empty
// tree) until Remove: the checkpoint is the workspace whenever no Pod
// holds it, so that a save with no Pod (a hibernation, a snapshot) always
// has the tree to save, and never mistakes a workspace whose Pod is gone
// for one that never held a file.
func (v *Volumes) Create(ctx context.Context, name string, diskMB int64) error {
	v.forget(name)
	if strings.HasPrefix(name, workspace.PoolVolume("")) {
		// A warm pool's Pod holds nothing of anyone's until a claim
		// makes its workspace a session's: nothing to keep of it.
		return nil
	}
	var empty bytes.Buffer
	tar.NewWriter(&empty).Close() // an archive of no entry: a new, empty workspace
	_, _, err := v.snaps.SaveArchive(ctx, &empty, checkpointKey(name), nil)
	return err
}

// Open opens the workspace of the running sandbox that holds it;
// ErrUnavailable if none does.
func (v *Volumes) Open(ctx context.Context, name string) (workspace.Workspace, error) {
	info, err := v.holderInfo(ctx, name)
	if err != nil {
		return nil, err
	}
	if info == nil {
		return nil, fmt.Errorf("workspace %s: no running sandbox holds it: %w", name, errdefs.ErrUnavailable)
	}
	c, ws := v.client(info.ID, info.Resources.DiskMB)
	return closingWorkspace{ws, c}, nil
}

// OpenIn opens the workspace of name in sandbox, the session's.
func (v *Volumes) OpenIn(ctx context.Context, name, sandbox string) (workspace.Workspace, error) {
	info, err := v.in(ctx, name, sandbox)
	if err != nil {
		return nil, err
	}
	c, ws := v.client(info.ID, info.Resources.DiskMB)
	return closingWorkspace{ws, c}, nil
}

// closingWorkspace closes its client with the workspace.
type closingWorkspace struct {
	*execclient.Workspace
	c *execclient.Client
}

func (w closingWorkspace) Close() error { w.Workspace.Close(); return w.c.Close() }

// Exists reports whether there is a workspace of that name: a Pod holds
// it or it has a checkpoint.
func (v *Volumes) Exists(ctx context.Context, name string) (bool, error) {
	id, err := v.holder(ctx, name)
	if err != nil || id != "" {
		return id != "", err
	}
	if _, err := v.snaps.Load(ctx, checkpointKey(name)); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// Save saves the workspace under key: the live tree of the newest Pod
// that holds it, else its checkpoint. The session layer says which
// sandbox is the session's (SaveFrom).
func (v *Volumes) Save(ctx context.Context, name, key string, prev *snapshot.Manifest) (*snapshot.Manifest, snapshot.Stats, error) {
	info, err := v.holderInfo(ctx, name)
	if err != nil {
		return nil, snapshot.Stats{}, err
	}
	return v.saveFrom(ctx, name, info, key, prev)
}

// SaveFrom saves the workspace of name under key as sandbox (the
// session's) holds it, or with no sandbox as its checkpoint has it.
func (v *Volumes) SaveFrom(ctx context.Context, name, sandbox, key string, prev *snapshot.Manifest) (*snapshot.Manifest, snapshot.Stats, error) {
	var info *runtime.Info
	if sandbox != "" {
		var err error
		if info, err = v.in(ctx, name, sandbox); err != nil {
			return nil, snapshot.Stats{}, err
		}
	}
	return v.saveFrom(ctx, name, info, key, prev)
}

func (v *Volumes) saveFrom(ctx context.Context, name string, info *runtime.Info, key string, prev *snapshot.Manifest) (*snapshot.Manifest, snapshot.Stats, error) {
	if info == nil {
		if err := v.snaps.Copy(ctx, checkpointKey(name), key); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				return nil, snapshot.Stats{}, fmt.Errorf("workspace %s: not held by a sandbox and no checkpoint: %w", name, errdefs.ErrNotFound)
			}
			return nil, snapshot.Stats{}, err
		}
		mf, err := v.snaps.Load(ctx, key)
		return mf, snapshot.Stats{}, err
	}
	// The live tree is newer than the checkpoint: it is the checkpoint
	// now too (a hibernation's Pod goes next, and the checkpoint is what
	// the session wakes to).
	defer v.serialise(name)()
	mf, st, err := v.export(ctx, info, key, prev)
	if err != nil {
		return nil, st, err
	}
	if key != checkpointKey(name) {
		if err := v.snaps.Copy(ctx, key, checkpointKey(name)); err != nil {
			return nil, st, err
		}
	}
	v.mu.Lock()
	v.last[name] = mf
	v.mu.Unlock()
	return mf, st, nil
}

// export saves the workspace of the sandbox info says under key.
func (v *Volumes) export(ctx context.Context, info *runtime.Info, key string, prev *snapshot.Manifest) (*snapshot.Manifest, snapshot.Stats, error) {
	c, ws := v.client(info.ID, info.Resources.DiskMB)
	defer c.Close()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := ws.Export(ctx, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	mf, st, err := v.snaps.SaveArchive(ctx, pr, key, prev)
	pr.CloseWithError(errors.New("the save ended"))
	if xerr := <-done; err == nil && xerr != nil {
		err = xerr
	}
	return mf, st, err
}

// importInto makes the tree saved at key sandbox id's workspace.
func (v *Volumes) importInto(ctx context.Context, id, key string) error {
	c, ws := v.client(id, 0) // an import sends, and takes no archive
	defer c.Close()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := v.snaps.WriteArchive(ctx, key, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	err := ws.Import(ctx, pr)
	pr.CloseWithError(errors.New("the import ended"))
	if werr := <-done; werr != nil && (err == nil || errors.Is(err, io.ErrClosedPipe)) {
		err = werr
	}
	return err
}

// Restore makes the tree saved at key the workspace's checkpoint, which
// the next Pod of the volume is given. The session layer has let its
// sandbox go before (a hibernated session's wake, a snapshot's restore):
// a Pod still running over the volume is no one's to import into.
func (v *Volumes) Restore(ctx context.Context, name, key string, diskMB int64) error {
	v.forget(name)
	return v.snaps.Copy(ctx, key, checkpointKey(name))
}

// Claim makes the pooled workspace the session's. A Pod claimed from a
// shared pool (Runtime.ClaimPooled) holds the session's volume already:
// its claim relabelled it in the same write. Otherwise the Pod that holds
// the pooled volume is relabelled here (its metadata, never its spec).
// The session's checkpoint, if it has one (a workspace saved before),
// is the session's files: it is imported into the Pod through its
// executor, and kept.
func (v *Volumes) Claim(ctx context.Context, pooled, name string) error {
	mf, err := v.snaps.Load(ctx, checkpointKey(name))
	// A checkpoint of more than the empty tree (a session that had files
	// before its first sandbox) goes into the claimed Pod.
	saved := err == nil && (mf.Files > 0 || mf.Dirs > 1 || mf.Symlinks > 0)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	id, err := v.holder(ctx, pooled)
	if err != nil {
		return err
	}
	if id != "" {
		if err := v.rt.relabel(ctx, id, name); err != nil {
			return err
		}
	} else if saved {
		if id, err = v.holder(ctx, name); err != nil {
			return err
		}
		if id == "" {
			return fmt.Errorf("workspace %s: no running sandbox holds it: %w", name, errdefs.ErrUnavailable)
		}
	}
	v.forget(name)
	if saved {
		if err := v.importInto(ctx, id, checkpointKey(name)); err != nil {
			return fmt.Errorf("workspace %s: restoring its checkpoint into a pooled sandbox: %w", name, err)
		}
	}
	return v.snaps.Delete(ctx, checkpointKey(pooled))
}

// Discard keeps the checkpoint: after a hibernation, its Pod gone, the
// checkpoint is the workspace (a second save without a Pod copies it; a
// wake starts a Pod from it). Nothing of it is on a host to take away.
func (v *Volumes) Discard(ctx context.Context, name string) error {
	v.forget(name)
	return nil
}

// Remove drops the workspace's checkpoint; its Pod's files go with the
// Pod.
func (v *Volumes) Remove(ctx context.Context, name string) error {
	v.forget(name)
	return v.snaps.Delete(ctx, checkpointKey(name))
}

// Reset has nothing to do: no workspace is on this host.
func (v *Volumes) Reset(context.Context, map[string]bool) error { return nil }

// Wait has nothing to wait for.
func (v *Volumes) Wait() {}

// Checkpoint saves the workspace of name as sandbox (the session's)
// holds it as its checkpoint, from the last one this process saved where
// files are unchanged. A sandbox that no longer holds it (its Pod gone
// meanwhile) is ErrUnavailable: what it wrote since the checkpoint is lost
// with it, even if its container still runs for a moment after the Pod's
// forced delete (the session then reports its execution lost).
func (v *Volumes) Checkpoint(ctx context.Context, name, sandbox string) error {
	defer v.serialise(name)()
	info, err := v.in(ctx, name, sandbox)
	if err != nil {
		return err
	}
	v.mu.Lock()
	prev := v.last[name]
	v.mu.Unlock()
	mf, _, err := v.export(ctx, info, checkpointKey(name), prev)
	if err != nil {
		return fmt.Errorf("workspace %s: checkpoint: %w", name, err)
	}
	v.mu.Lock()
	v.last[name] = mf
	v.mu.Unlock()
	return nil
}

// serialise waits for the volume's checkpoint in progress here, if any,
// and returns what ends this one.
func (v *Volumes) serialise(name string) (done func()) {
	v.mu.Lock()
	sv := v.saving[name]
	if sv == nil {
		sv = &saving{}
		v.saving[name] = sv
	}
	sv.waiters++
	v.mu.Unlock()
	sv.mu.Lock()
	return func() {
		sv.mu.Unlock()
		v.mu.Lock()
		if sv.waiters--; sv.waiters == 0 {
			delete(v.saving, name)
		}
		v.mu.Unlock()
	}
}

func (v *Volumes) forget(name string) {
	v.mu.Lock()
	delete(v.last, name)
	v.mu.Unlock()
}

// restore gives a new Pod of volume name its checkpoint, if it has one.
func (v *Volumes) restore(ctx context.Context, id, name string) error {
	if _, err := v.snaps.Load(ctx, checkpointKey(name)); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		return err
	}
	return v.importInto(ctx, id, checkpointKey(name))
}

// relabel makes sandbox id's Pod the holder of volume name.
func (r *Runtime) relabel(ctx context.Context, id, name string) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q},"annotations":{%q:%q}}}`, labelVolume, volumeLabel(name), annotationVolume, name)
	_, err := r.pods().Patch(ctx, podName(id), types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("sandbox %s: take volume %s: %w", id, name, apiErr(err))
	}
	return nil
}
