package workspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// A volume name is what the control plane names a workspace by to a
// runtime; it resolves to a workspace directory under the root and to
// nothing else: not a path, not the trash, not a symlink.
func TestVolumeDir(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"t/s", ".pool/sbx-1", ".trash/ws-1", "t/x.y"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(root, "t", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "t", "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v := Volumes(root)
	for name, want := range map[string]string{
		SessionVolume("t", "s"): "t/s", PoolVolume("sbx-1"): ".pool/sbx-1", "t/x.y": "t/x.y",
	} {
		got, err := v.VolumeDir(ctx, name)
		if err != nil || got != filepath.Join(root, want) {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}
	d := NewDirs(DirsConfig{Root: root})
	if got, err := d.VolumeDir(ctx, "t/s"); err != nil || got != filepath.Join(root, "t/s") {
		t.Errorf("Dirs.VolumeDir: %q, %v", got, err)
	}
	for _, name := range []string{
		"", "t", "t/", "/t/s", "t/s/", "t//s", "t/s/x", "../t/s", "t/..", "t/../t/s", "..", "./s", "t/.",
		".trash/ws-1", ".pool", ".pool/..", ".pool/.x", ".other/x", "-t/s", "t/-s",
		filepath.Join(root, "t/s"), "/etc", "t/s\x00", "t\\s",
		"t/" + strings.Repeat("s", 200), strings.Repeat("x", 1<<20),
	} {
		_, err := v.VolumeDir(ctx, name)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%.80q: %v, want ErrInvalidArgument", name, err)
		}
		if err != nil && len(err.Error()) > 1024 {
			t.Errorf("%.80q: the error repeats the input (%d bytes)", name, len(err.Error()))
		}
	}
	for _, name := range []string{"t/missing", "u/s", "t/link", "t/file", PoolVolume("sbx-2")} {
		if _, err := v.VolumeDir(ctx, name); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", name, err)
		}
	}
}
