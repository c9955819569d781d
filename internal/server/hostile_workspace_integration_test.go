//go:build integration

package server_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// A workspace of a million entries, the most a snapshot takes, goes
// through hibernation and restore over HTTP in server memory that does
// not grow with it; one entry more is refused with a clear error and the
// workspace is kept as it was. Sandboxed code makes such a workspace at
// no cost in bytes (empty files), so this is what a hostile tenant can
// make the server do.
//
// It runs with quotas on, as a server does by default: the workspace is a
// btrfs subvolume.
func TestHibernateMillionFiles(t *testing.T) {
	ts := startReal(t, t.TempDir())
	c := client.New(ts.URL)
	ctx := context.Background()
	const sid, dirs, per = "many", 999, 1000 // 999,000 files + 999 dirs + the root
	// Empty files cost metadata only, about 400 bytes each on btrfs.
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid, Resources: &api.Resources{Disk: 1300}}); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(ts.dir, "workspaces", "default", sid)
	t0 := time.Now()
	for i := range dirs {
		dir := filepath.Join(ws, "d"+strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range per {
			f, err := os.Create(filepath.Join(dir, strconv.Itoa(j)))
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	t.Logf("made %d files in %v", dirs*per, time.Since(t0).Round(time.Millisecond))
	// One entry past the limit: refused, named, and nothing lost.
	extra := filepath.Join(ws, "d0", "one-too-many")
	if err := os.WriteFile(extra, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := c.HibernateSession(ctx, sid)
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 429 || !strings.Contains(ae.Message, "1000000") {
		t.Fatalf("hibernating a million and one entries: %v", err)
	}
	if b, err := os.ReadFile(extra); err != nil || string(b) != "kept" {
		t.Fatalf("the workspace after a refused hibernation: %q %v", b, err)
	}
	if err := os.Remove(extra); err != nil {
		t.Fatal(err)
	}

	var took time.Duration
	grew := testenv.HeapGrowth(func() {
		t0 := time.Now()
		_, err = c.HibernateSession(ctx, sid)
		took = time.Since(t0)
	})
	t.Logf("hibernate: %v, heap grew %d KiB", took.Round(time.Millisecond), grew>>10)
	if err != nil {
		t.Fatal(err)
	}
	if grew > 64<<20 {
		t.Errorf("hibernating: the heap grew by %d MiB", grew>>20)
	}
	if _, err := os.Stat(ws); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the workspace after hibernation: %v", err)
	}
	grew = testenv.HeapGrowth(func() {
		t0 := time.Now()
		// A file call restores the workspace.
		_, err = c.ListFiles(ctx, sid, client.ListFilesOptions{Path: "d998"})
		took = time.Since(t0)
	})
	t.Logf("restore: %v, heap grew %d KiB", took.Round(time.Millisecond), grew>>10)
	if err != nil {
		t.Fatal(err)
	}
	if grew > 64<<20 {
		t.Errorf("restoring: the heap grew by %d MiB", grew>>20)
	}
	n := 0
	for i := range dirs {
		names, err := os.ReadDir(filepath.Join(ws, "d"+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		n += len(names)
	}
	if n != dirs*per {
		t.Errorf("restored %d files, want %d", n, dirs*per)
	}
	if _, err := c.DeleteSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
}

// A tree deeper than a snapshot takes is refused by hibernation with the
// limit named, in memory that does not grow with its depth, and the
// session keeps its workspace.
func TestHibernateDeepTree(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	const sid, depth = "deep", 40_000
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid}); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(ts.dir, "workspaces", "default", sid)
	testenv.DeepTree(t, ws, depth)
	var herr error
	grew := testenv.HeapGrowth(func() { _, herr = c.HibernateSession(ctx, sid) })
	t.Logf("hibernating a %d-deep tree: heap grew %d KiB", depth, grew>>10)
	var ae *client.APIError
	if !errors.As(herr, &ae) || ae.StatusCode != 429 || !strings.Contains(ae.Message, "deeper than 256") {
		t.Fatalf("hibernating a %d-deep tree: %v", depth, herr)
	}
	if grew > 64<<20 {
		t.Errorf("the heap grew by %d MiB", grew>>20)
	}
	s, err := c.GetSession(ctx, sid)
	if err != nil || s.Status == api.StatusHibernated {
		t.Fatalf("the session after a refused hibernation: %+v %v", s, err)
	}
	if _, err := os.Stat(filepath.Join(ws, "d", "d", "d")); err != nil {
		t.Errorf("the workspace after a refused hibernation: %v", err)
	}
	// Deleting the session removes the tree, however deep.
	if _, err := c.DeleteSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		left, _ := filepath.Glob(filepath.Join(ts.dir, "workspaces", "*", "*"))
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left after the session's deletion: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
