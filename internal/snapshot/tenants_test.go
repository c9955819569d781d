package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Content is deduplicated within a tenant, never across: a tenant's
// new_bytes says nothing of what files another tenant has.
func TestNoCrossTenantDedup(t *testing.T) {
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	secret := random(100 << 10)
	write(t, filepath.Join(src, "secret.bin"), secret, 0o644)
	if _, st, err := s.Save(ctx, src, "victim/s1/snapshots/a", nil); err != nil || st.NewBytes != int64(len(secret)) {
		t.Fatalf("victim: %+v %v", st, err)
	}
	guess := filepath.Join(dir, "guess")
	write(t, filepath.Join(guess, "guess.bin"), secret, 0o644)
	_, st, err := s.Save(ctx, guess, "attacker/s2/snapshots/b", nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.NewBytes != int64(len(secret)) {
		t.Errorf("the attacker's snapshot stored %d new bytes of %d: it learnt the victim has the file", st.NewBytes, len(secret))
	}
	// Within a tenant, content is stored once.
	if _, st, _ := s.Save(ctx, guess, "attacker/s3/snapshots/c", nil); st.NewBytes != 0 {
		t.Errorf("the same tenant's second copy stored %d new bytes", st.NewBytes)
	}
	// Deleting one tenant's snapshot collects its chunks, not the other's.
	s.Delete(ctx, "attacker/s2/snapshots/b")
	s.Delete(ctx, "attacker/s3/snapshots/c")
	if c, err := s.Collect(ctx, 0); err != nil || c.Chunks != 1 {
		t.Errorf("collect: %+v %v; want the attacker's one chunk", c, err)
	}
	if _, err := s.Restore(ctx, "victim/s1/snapshots/a", filepath.Join(dir, "out")); err != nil {
		t.Errorf("the victim's snapshot after collection: %v", err)
	}
}

// Version 1 manifests, whose chunks are in the shared area, are still
// restored, and their chunks kept while they are there.
func TestVersion1Manifest(t *testing.T) {
	s, dir := newStore(t)
	content := []byte("from before namespaces")
	sum := sha256hex(content)
	legacy := chunkKey(s.chunkArea("t/old", 0), sum)
	if !strings.HasPrefix(legacy, "snapshots/chunks/") {
		t.Fatalf("a version 1 chunk at %s", legacy)
	}
	s.blobs.Put(ctx, legacy, strings.NewReader(string(content)))
	s.blobs.Put(ctx, chunkKey(s.chunkArea("t/old", 0), sha256hex([]byte("garbage"))), strings.NewReader("garbage"))
	putEntries(t, s, &Manifest{Key: "t/old"}, []Entry{
		{Path: ".", Type: "dir", Mode: 0o755},
		{Path: "z", Type: "dir", Mode: 0o755},
		{Path: "z/f", Type: "file", Mode: 0o644, Size: int64(len(content)), Chunks: []string{sum}},
		{Path: "a", Type: "symlink", Target: "z/f"},
	})
	if c, err := s.Collect(ctx, 0); err != nil || c.Chunks != 1 {
		t.Errorf("collect: %+v %v; want only the garbage", c, err)
	}
	out := filepath.Join(dir, "out")
	if _, err := s.Restore(ctx, "t/old", out); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "a")); string(b) != string(content) {
		t.Errorf("restored: %q %v", b, err)
	}
}

func sha256hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Tenants whose names start alike ("t", "t-x", "tt") are collected apart:
// the walk of one's manifests skips the others'. A corrupt manifest of a
// tenant with chunks is reported once.
func TestCollectTenantsAlike(t *testing.T) {
	s, dir := newStore(t)
	for _, tenant := range []string{"t", "t-x", "tt"} {
		src := filepath.Join(dir, "src-"+tenant)
		write(t, filepath.Join(src, "f"), []byte("the content of "+tenant), 0o644)
		if _, _, err := s.Save(ctx, src, tenant+"/s/a", nil); err != nil {
			t.Fatal(err)
		}
	}
	s.Delete(ctx, "t-x/s/a")
	s.blobs.Put(ctx, s.manifestKey("t/s/broken"), strings.NewReader("not gzip"))
	c, err := s.Collect(ctx, 0)
	if err != nil || c.Chunks != 1 || len(c.Unreadable) != 1 || c.Unreadable[0] != "t/s/broken" {
		t.Errorf("collect: %+v %v; want the one chunk of t-x, and t/s/broken reported once", c, err)
	}
	for _, tenant := range []string{"t", "tt"} {
		if _, err := s.Restore(ctx, tenant+"/s/a", filepath.Join(dir, "out-"+tenant)); err != nil {
			t.Errorf("%s after collection: %v", tenant, err)
		}
	}
}
