package snapshot

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
)

// Two processes share a blob store: a Save in one finds the chunks of a
// deleted snapshot present, older than any grace, and writes only its
// manifest. The other's Collect, fenced off (store.RWLock), cannot
// delete those chunks between the two: it waits for the Save, and then
// sees its manifest. Without the fence it would delete them, and the
// saved workspace could not be restored.
func TestCollectFencedAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	b, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	saver, collector := New(b, "snapshots", Limits{TempDir: dir}), New(b, "snapshots", Limits{TempDir: dir})
	fence := store.NewRWLock(st, "blob-collect", "saver")
	saver.ShareWith(fence)
	collector.ShareWith(store.NewRWLock(st, "blob-collect", "collector"))

	src := filepath.Join(dir, "src")
	write(t, filepath.Join(src, "data"), []byte("what the session keeps"), 0o644)
	if _, _, err := saver.Save(ctx, src, "t/s/old", nil); err != nil {
		t.Fatal(err)
	}
	if err := saver.Delete(ctx, "t/s/old"); err != nil {
		t.Fatal(err)
	}
	// The saver is in the middle of a Save: the fence is what Save holds.
	if err := fence.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if c, err := collector.Collect(short, 0); err == nil || c.Chunks != 0 {
		t.Fatalf("collect during another process's save: %+v, %v; want it to wait and give up", c, err)
	}
	fence.RUnlock()
	if _, _, err := saver.Save(ctx, src, "t/s/new", nil); err != nil {
		t.Fatal(err)
	}
	if c, err := collector.Collect(ctx, 0); err != nil || c.Chunks != 0 {
		t.Fatalf("collect after the save: %+v, %v; want nothing collected", c, err)
	}
	out := filepath.Join(dir, "out")
	if _, err := collector.Restore(ctx, "t/s/new", out); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(out, "data")); err != nil || string(got) != "what the session keeps" {
		t.Fatalf("restored: %q, %v", got, err)
	}
}
