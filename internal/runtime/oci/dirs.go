package oci

import (
	"context"
	"fmt"
	"sync"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Dirs resolves the names it was given, images and volumes alike, to
// their directories: for a caller that has directories rather than a
// template store and a workspace tree (`sbx run`, bench, the runtime's
// own tests). Only a name added resolves, so no path given as a name
// ever reaches a mount. Safe for concurrent use.
type Dirs struct {
	mu   sync.Mutex
	dirs map[string]string
}

var (
	_ Images  = (*Dirs)(nil)
	_ Volumes = (*Dirs)(nil)
)

// Add makes name resolve to dir.
func (d *Dirs) Add(name, dir string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dirs == nil {
		d.dirs = map[string]string{}
	}
	d.dirs[name] = dir
}

// Remove forgets name.
func (d *Dirs) Remove(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.dirs, name)
}

func (d *Dirs) lookup(kind, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("no %s named: %w", kind, errdefs.ErrInvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	dir, ok := d.dirs[name]
	if !ok {
		if len(name) > 256 {
			name = name[:256] + "..."
		}
		return "", fmt.Errorf("%s %q: %w", kind, name, errdefs.ErrNotFound)
	}
	return dir, nil
}

// ImageRootfs resolves an image added with Add.
func (d *Dirs) ImageRootfs(ctx context.Context, ref string) (string, error) {
	return d.lookup("image", ref)
}

// VolumeDir resolves a volume added with Add.
func (d *Dirs) VolumeDir(ctx context.Context, name string) (string, error) {
	return d.lookup("volume", name)
}
