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
