package runtimetest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/template"
)

// SeedBuild writes a build of spec into st as a finished build leaves it,
// with an empty rootfs, so that a sandbox start finds it and builds
// nothing: InProcess runs the host's python and never looks at a rootfs.
// It fails t if st does not then find the build (the store's layout
// changed under this copy of it).
func SeedBuild(t testing.TB, st *template.Store, spec template.Spec) *template.Template {
	t.Helper()
	shift := st.UIDShift
	if shift == 0 {
		shift = template.DefaultUIDShift
	}
	dir := st.Dir
	if dir == "" {
		t.Fatal("SeedBuild: the template store has no Dir: it would write into the shared one")
	}
	hash := spec.HashWithShift(shift)
	build := filepath.Join(dir, "builds", hash)
	if err := os.MkdirAll(filepath.Join(build, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{
		"build.json": map[string]any{"hash": hash, "built_at": time.Now().UTC()},
		"spec.json":  spec,
	} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(build, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmpl, ok := st.Lookup(spec)
	if !ok {
		t.Fatalf("SeedBuild: the store does not find the build of %s written at %s", spec.Name, build)
	}
	return tmpl
}
