package oci

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Dirs resolves the names added to it and nothing else: a path given as
// a name is just an unknown name.
func TestDirs(t *testing.T) {
	var d Dirs
	d.Add("python", "/srv/rootfs")
	d.Add("workdir", "/srv/work")
	ctx := context.Background()
	if dir, err := d.ImageRootfs(ctx, "python"); err != nil || dir != "/srv/rootfs" {
		t.Errorf("image: %q, %v", dir, err)
	}
	if dir, err := d.VolumeDir(ctx, "workdir"); err != nil || dir != "/srv/work" {
		t.Errorf("volume: %q, %v", dir, err)
	}
	for _, name := range []string{"/srv/rootfs", "/srv/work", "/", "../python", "python/", strings.Repeat("x", 1<<20)} {
		_, ierr := d.ImageRootfs(ctx, name)
		_, verr := d.VolumeDir(ctx, name)
		if !errors.Is(ierr, errdefs.ErrNotFound) || !errors.Is(verr, errdefs.ErrNotFound) {
			t.Errorf("%.80q: %v, %v; want ErrNotFound", name, ierr, verr)
		}
		if len(ierr.Error()) > 1024 {
			t.Errorf("%.80q: the error repeats the input (%d bytes)", name, len(ierr.Error()))
		}
	}
	if _, err := d.VolumeDir(ctx, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("no name: %v, want ErrInvalidArgument", err)
	}
	d.Remove("workdir")
	if _, err := d.VolumeDir(ctx, "workdir"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("removed: %v, want ErrNotFound", err)
	}
}
