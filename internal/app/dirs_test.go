package app_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// With the default runtime, a server refuses to start when a sandbox's
// host user could not pass through the directories down to the state
// directory (a 0700 `mktemp -d` above it, or the data directory, which
// is private now), and says which directory and what to run; every
// sandbox start failed with runc's bare "permission denied" before. A
// state directory sandboxes can reach starts, and the data directory,
// made 0755 by someone else, comes out 0700.
func TestStateDirCheck(t *testing.T) {
	testenv.RequiresRoot(t) // the check takes a sandbox's user; without root there are no sandboxes
	base, err := os.MkdirTemp("", "sbx-statedir-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(base, "private")
	open := filepath.Join(base, "open")
	data := filepath.Join(base, "data")
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{private, 0o700}, {open, 0o711}, {data, 0o755}} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	start := func(state string) (*app.App, error) {
		return app.Open(context.Background(), app.Config{
			DataDir: data, StateDir: state, TemplateDir: filepath.Join(data, "templates"),
			WorkspaceQuota: "off", Log: slog.New(slog.DiscardHandler),
		})
	}

	for _, tc := range []struct {
		name, state string
		want        []string
	}{
		{"under a private directory", filepath.Join(private, "state"),
			[]string{private + " (mode 0700, owner 0, group 0) does not let other users pass", "chmod o+x " + private}},
		{"inside the data directory", filepath.Join(data, "state"),
			[]string{"inside the data directory " + data, "--state-dir outside the data directory"}},
	} {
		a, err := start(tc.state)
		if err == nil {
			a.Close()
			t.Errorf("%s: the server started", tc.name)
			continue
		}
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: %v, want a failed precondition", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v\nwant it to say %q", tc.name, err, w)
			}
		}
	}

	a, err := start(filepath.Join(open, "state"))
	if err != nil {
		t.Fatalf("a state directory sandboxes can reach: %v", err)
	}
	a.Close()
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{data, 0o700}, {filepath.Join(data, "workspaces"), 0o700}, {filepath.Join(data, "instance.id"), 0o600}, {filepath.Join(data, "signing.key"), 0o600}} {
		if fi, err := os.Stat(p.path); err != nil || fi.Mode().Perm() != p.mode {
			t.Errorf("%s: %v %v, want mode %04o", p.path, fi.Mode(), err, p.mode)
		}
	}
}
