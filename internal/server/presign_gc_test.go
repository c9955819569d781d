package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
)

func TestCollectPresigned(t *testing.T) {
	dir := t.TempDir()
	blobs, err := blobfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now()
	ages := map[string]time.Duration{
		"presigned/" + strings.Repeat("a", 64): presignKeep + time.Minute,      // every URL expired
		"presigned/" + strings.Repeat("b", 64): maxPresignExpiry * time.Second, // a URL may still work
		"snapshots/chunks/x":                   30 * 24 * time.Hour,            // not a presigned copy
	}
	for key, age := range ages {
		if _, err := blobs.Put(ctx, key, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
		old := now.Add(-age)
		os.Chtimes(filepath.Join(dir, filepath.FromSlash(key)), old, old)
	}
	n, err := CollectPresigned(ctx, blobs, now)
	if err != nil || n != 1 {
		t.Fatalf("collected %d, %v; want 1", n, err)
	}
	for key := range ages {
		_, err := blobs.Stat(ctx, key)
		if gone := err != nil; gone != strings.HasPrefix(key, "presigned/a") {
			t.Errorf("%s: gone %v", key, gone)
		}
	}
}
