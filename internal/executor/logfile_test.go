package executor

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestRotatingFile: however much is written, the file and its one older
// copy hold at most twice the bound, and the newest bytes are kept.
func TestRotatingFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "log")
	const bound = 4096
	f, err := OpenRotating(p, bound)
	if err != nil {
		t.Fatal(err)
	}
	line := bytes.Repeat([]byte("0123456789abcde\n"), 10) // 160 bytes
	for range 10000 {
		if n, err := f.Write(line); err != nil || n != len(line) {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	// One write larger than the bound keeps its end.
	big := append(bytes.Repeat([]byte("y"), 3*bound), []byte("last words\n")...)
	if n, err := f.Write(big); err != nil || n != len(big) {
		t.Fatalf("big write: %d %v", n, err)
	}
	f.Close()
	cur, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(p + ".1")
	if err != nil {
		t.Fatal(err)
	}
	if len(cur) > bound || len(old) > bound {
		t.Errorf("files of %d and %d bytes, bound %d", len(cur), len(old), bound)
	}
	if !bytes.HasSuffix(cur, []byte("last words\n")) {
		t.Errorf("the newest bytes are not kept: ...%q", cur[max(len(cur)-32, 0):])
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("%d files in the log's directory, want 2", len(entries))
	}
}
