package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// An image reference is what the control plane names a template build
// by to a runtime; the store resolves it to the build's rootfs, and
// nothing else: no path, no prefix of a hash, nothing past its length.
func TestImageRootfs(t *testing.T) {
	s := NewStore(t.TempDir())
	hash := strings.Repeat("ab", 32)
	build := s.path("builds", hash)
	if err := os.MkdirAll(filepath.Join(build, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(build, "build.json"), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"python", "python-datascience", "a-", "a--b"} {
		ref := ImageRef(name, hash)
		got, err := s.ImageRootfs(ctx, ref)
		if err != nil || got != filepath.Join(build, "rootfs") {
			t.Errorf("%s: %q, %v; want the build's rootfs", ref, got, err)
		}
	}
	if ref := ImageRef("a-", hash); ref != "sbx/a:"+hash {
		t.Errorf("ImageRef of a name ending in a hyphen: %s", ref)
	}
	if ref := (&Template{Spec: Spec{Name: "python"}, Hash: hash}).Image(); ref != "sbx/python:"+hash {
		t.Errorf("Image: %s", ref)
	}
	for _, ref := range []string{
		"", "python", "sbx/python", "sbx/python:" + hash[:12], // a prefix is for people, not runtimes
		"sbx/python:" + strings.ToUpper(hash), "sbx/../python:" + hash, "../../etc", "/",
		filepath.Join(build, "rootfs"), build, "sbx/python:" + hash + "/..", "sbx/python:" + hash + "\x00",
		"other/python:" + hash, "sbx/Python:" + hash, "sbx/-x:" + hash, "sbx/x-:" + hash,
		"sbx/" + strings.Repeat("a", 300) + ":" + hash, strings.Repeat("x", 1<<20),
	} {
		_, err := s.ImageRootfs(ctx, ref)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%.80q: %v, want ErrInvalidArgument", ref, err)
		}
		if err != nil && len(err.Error()) > 1024 {
			t.Errorf("%.80q: the error repeats the input (%d bytes)", ref, len(err.Error()))
		}
	}
	// Well formed, but no such build; and a build still in the making
	// (no build.json) is none either.
	if _, err := s.ImageRootfs(ctx, ImageRef("python", strings.Repeat("0", 64))); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing build: %v, want ErrNotFound", err)
	}
	half := strings.Repeat("cd", 32)
	if err := os.MkdirAll(s.path("builds", half, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ImageRootfs(ctx, ImageRef("python", half)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("build without its record: %v, want ErrNotFound", err)
	}
}
