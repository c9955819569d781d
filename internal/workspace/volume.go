package workspace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// A workspace is named to a runtime as a volume (runtime.Spec.Volume),
// never by its path: TENANT/SESSION for a session's, .pool/ID for a warm
// pool's sandbox's own. The oci runtime resolves the name to the
// directory here (VolumeDir); a runtime with no host in common with the
// control plane maps it to a volume of its own (a PVC, say).
const poolVolume = ".pool"

// maxVolumeName bounds a volume name: two ids of at most maxIDLen.
const maxVolumeName = 2*maxIDLen + 1

// SessionVolume is the volume name of a tenant's session's workspace.
func SessionVolume(tenant, id string) string { return tenant + "/" + id }

// PoolVolume is the volume name of the workspace of the warm pool's
// sandbox id.
func PoolVolume(id string) string { return poolVolume + "/" + id }

// CheckVolume refuses what is not a volume name: TENANT/SESSION or
// .pool/ID, two ids, never a path; errdefs.ErrInvalidArgument.
func CheckVolume(name string) error {
	if len(name) > maxVolumeName {
		return fmt.Errorf("volume name of %d bytes: at most %d: %w", len(name), maxVolumeName, errdefs.ErrInvalidArgument)
	}
	owner, id, ok := strings.Cut(name, "/")
	if !ok || !ValidID(id) || owner != poolVolume && !ValidID(owner) {
		return fmt.Errorf("volume %q: want TENANT/SESSION or %s/ID: %w", name, poolVolume, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Volumes resolves volume names to the workspace directories under a
// root (DirsConfig.Root): the oci runtime's volume resolver, made before
// the Dirs that manage those directories (internal/app).
type Volumes string

// VolumeDir returns the directory of the volume called name: an existing
// directory, not a symlink. A malformed name (not two ids, "..", a path)
// is errdefs.ErrInvalidArgument; a volume that does not exist,
// errdefs.ErrNotFound.
func (v Volumes) VolumeDir(ctx context.Context, name string) (string, error) {
	if err := CheckVolume(name); err != nil {
		return "", err
	}
	dir := filepath.Join(string(v), name)
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return "", fmt.Errorf("volume %q: no such workspace: %w", name, errdefs.ErrNotFound)
	}
	return dir, nil
}

// VolumeDir is Volumes.VolumeDir over d's root: the oci runtime's
// resolver of the volumes Dirs keeps.
func (d *Dirs) VolumeDir(ctx context.Context, name string) (string, error) {
	return Volumes(d.root).VolumeDir(ctx, name)
}
