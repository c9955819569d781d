package executor

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

func TestSnapshotDiff(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	writeFiles(t, root, map[string]string{"keep.txt": "a", "change.txt": "a", "dir/same.txt": "a"})
	writeFiles(t, outside, map[string]string{"secret.txt": "s"})
	os.Symlink(outside, filepath.Join(root, "link-to-outside"))
	before := snapshotWorkspace(root)

	writeFiles(t, root, map[string]string{"change.txt": "ab", "dir/new.txt": "n"})
	writeFiles(t, outside, map[string]string{"secret.txt": "changed", "new-outside.txt": "x"})
	os.Symlink("keep.txt", filepath.Join(root, "new-link"))
	syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644)
	got, trunc := artifacts(before, snapshotWorkspace(root))
	if strings.Join(got, ",") != "change.txt,dir/new.txt" || trunc {
		t.Errorf("artifacts %v %v", got, trunc)
	}
}

func TestSnapshotBounded(t *testing.T) {
	root := t.TempDir()
	for i := range 30 {
		d := filepath.Join(root, "d", strings.Repeat("x", i+1))
		os.MkdirAll(d, 0o755)
		for j := range 700 {
			os.WriteFile(filepath.Join(d, string(rune('a'+j%26))+strings.Repeat("y", j/26)), nil, 0o644)
		}
	}
	before := snapshotWorkspace(root)
	if !before.truncated {
		t.Fatalf("walked %d files of 21000 without giving up", len(before.files))
	}
	got, trunc := artifacts(before, snapshotWorkspace(root))
	if !trunc || len(got) != 0 {
		t.Errorf("artifacts %d, truncated %v", len(got), trunc)
	}
}

func TestArtifactsCapped(t *testing.T) {
	before := workspaceSnapshot{files: map[string]fileKey{}}
	after := workspaceSnapshot{files: map[string]fileKey{}}
	for i := range wire.MaxArtifacts + 5 {
		after.files[strings.Repeat("f", 1+i%50)+string(rune('A'+i/50))] = fileKey{size: 1}
	}
	got, trunc := artifacts(before, after)
	if len(got) != wire.MaxArtifacts || !trunc {
		t.Errorf("%d artifacts, truncated %v", len(got), trunc)
	}
}

// TestSnapshotUnchanged: any change a run can make to the workspace's
// tree (a file written, removed or renamed, a directory or a link made,
// a mode changed) says changed, and only no change says unchanged: a
// checkpoint is skipped on its word.
func TestSnapshotUnchanged(t *testing.T) {
	for name, change := range map[string]func(root string) error{
		"write":     func(r string) error { return os.WriteFile(filepath.Join(r, "a.txt"), []byte("b"), 0o644) },
		"create":    func(r string) error { return os.WriteFile(filepath.Join(r, "new.txt"), nil, 0o644) },
		"remove":    func(r string) error { return os.Remove(filepath.Join(r, "a.txt")) },
		"rename":    func(r string) error { return os.Rename(filepath.Join(r, "a.txt"), filepath.Join(r, "b.txt")) },
		"mkdir":     func(r string) error { return os.Mkdir(filepath.Join(r, "d2"), 0o755) },
		"rmdir":     func(r string) error { return os.Remove(filepath.Join(r, "d")) },
		"symlink":   func(r string) error { return os.Symlink("a.txt", filepath.Join(r, "l")) },
		"chmod":     func(r string) error { return os.Chmod(filepath.Join(r, "a.txt"), 0o600) },
		"chmod dir": func(r string) error { return os.Chmod(filepath.Join(r, "d"), 0o700) },
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, map[string]string{"a.txt": "a"})
			if err := os.Mkdir(filepath.Join(root, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
			before := snapshotWorkspace(root)
			if !unchanged(before, snapshotWorkspace(root)) {
				t.Fatal("no change, and not unchanged")
			}
			if err := change(root); err != nil {
				t.Fatal(err)
			}
			if unchanged(before, snapshotWorkspace(root)) {
				t.Errorf("%s: unchanged", name)
			}
		})
	}
	// A walk that gave up knows nothing.
	if unchanged(workspaceSnapshot{truncated: true}, workspaceSnapshot{truncated: true}) {
		t.Error("truncated walks: unchanged")
	}
}
