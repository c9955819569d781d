package snapshot_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/blob"
	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// These tests take their archives from a real workspace (workspace.Local),
// which imports this package: hence a package of their own.

var bg = context.Background()

var owners = workspace.Owners{Root: workspace.Owner{UID: 100000, GID: 100000}, User: workspace.Owner{UID: 101000, GID: 101000}}

func idsOf(o workspace.Owners) snapshot.IDs {
	return snapshot.IDs{Root: snapshot.ID(o.Root), User: snapshot.ID(o.User)}
}

// counting is a blob store that counts the Stats of chunks.
type counting struct {
	blob.Store
	stats atomic.Int64
}

func (c *counting) Stat(ctx context.Context, key string) (blob.Info, error) {
	if strings.Contains(key, "/chunks/") {
		c.stats.Add(1)
	}
	return c.Store.Stat(ctx, key)
}

func newCountingStore(t testing.TB) (*snapshot.Store, *counting) {
	t.Helper()
	dir := t.TempDir()
	b, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	c := &counting{Store: b}
	s := snapshot.New(c, "snapshots", snapshot.Limits{TempDir: dir})
	s.MapIDs(idsOf(owners))
	return s, c
}

func needRoot(t testing.TB) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the workspace's files belong to the sandbox's ids")
	}
}

// newWorkspace is a workspace at a new directory.
func newWorkspace(t testing.TB, base, name string) *workspace.Local {
	t.Helper()
	w, err := workspace.Create(filepath.Join(base, name), owners)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func put(t testing.TB, root, rel string, data []byte, mode os.FileMode, o workspace.Owner) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(p, o.UID, o.GID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// plantWorkspace fills a workspace as a sandbox would: files of the user
// and of the sandbox's root, one of several chunks, one of zeros, one
// sparse, links in and out, nested directories with their own modes.
func plantWorkspace(t testing.TB, root string) {
	t.Helper()
	u, r := owners.User, owners.Root
	put(t, root, "a/b/c/deep.txt", []byte("deep"), 0o644, u)
	put(t, root, "empty", nil, 0o600, u)
	put(t, root, "script.sh", []byte("#!/bin/sh\necho hi\n"), 0o755, u)
	put(t, root, "big.bin", randomBytes(snapshot.ChunkSize*2+12345), 0o644, u)
	put(t, root, "zeros.bin", make([]byte, snapshot.ChunkSize+1), 0o644, u)
	put(t, root, "uploads/c1/temparea/up.pdf", []byte("%PDF"), 0o644, r)
	f, err := os.OpenFile(filepath.Join(root, "sparse.img"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("tail"), 3*snapshot.ChunkSize)
	f.Close()
	os.Lchown(filepath.Join(root, "sparse.img"), u.UID, u.GID)
	for name, target := range map[string]string{"a/in": "b/c/deep.txt", "out": "/etc/passwd", "dangling": "nowhere"} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
		os.Lchown(filepath.Join(root, name), u.UID, u.GID)
	}
	for _, d := range []string{"a", "a/b", "a/b/c", "emptydir"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
		os.Lchown(filepath.Join(root, d), u.UID, u.GID)
	}
	os.Chmod(filepath.Join(root, "a/b"), 0o700)
	for _, d := range []string{"uploads/c1", "uploads/c1/temparea"} {
		os.Lchown(filepath.Join(root, d), r.UID, r.GID)
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)
	os.Chtimes(filepath.Join(root, "script.sh"), old, old)
}

// treeOf describes a tree: every entry's type, mode, owner and content or
// target, and the time of files and links (an archive keeps no
// directory's time, and keeps the others to the microsecond).
func treeOf(t testing.TB, root string) string {
	t.Helper()
	var lines []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %v %d:%d", rel, fi.Mode(), st.Uid, st.Gid)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += fmt.Sprint(" -> ", target, " ", st.Mtim.Nano()/1000)
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" %d %x", st.Mtim.Nano()/1000, sha256.Sum256(b))
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func export(t testing.TB, w workspace.Workspace) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := w.Export(bg, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A workspace goes through SaveArchive and comes back through
// WriteArchive and Import as it was; WriteArchive writes the very bytes
// Export wrote, whether the manifest was saved from the archive or from
// the directory; and SaveArchive then RestoreInto gives the same tree as
// Save then RestoreInto.
func TestArchiveRoundTrip(t *testing.T) {
	needRoot(t)
	s, _ := newCountingStore(t)
	base := t.TempDir()
	src := newWorkspace(t, base, "src")
	plantWorkspace(t, src.Dir())
	want := treeOf(t, src.Dir())
	exported := export(t, src)

	m, st, err := s.SaveArchive(bg, bytes.NewReader(exported), "t/s/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Chunks: big.bin's 3, sparse.img's tail, deep.txt, script.sh and
	// up.pdf; none for the empty file and the zeros.
	if m.Files != 7 || st.NewChunks != 7 || !m.SandboxOwners() {
		t.Errorf("saved %d files in %d new chunks (owners %q), want 7 files in 7 chunks", m.Files, st.NewChunks, m.Owners)
	}
	if _, _, err := s.Save(bg, src.Dir(), "t/s/d", nil); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"t/s/a", "t/s/d"} {
		var buf bytes.Buffer
		if _, err := s.WriteArchive(bg, key, &buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), exported) {
			t.Errorf("%s: WriteArchive wrote %d bytes unlike the %d Export wrote", key, buf.Len(), len(exported))
		}
		dst := newWorkspace(t, base, "dst-"+strings.ReplaceAll(key, "/", "-"))
		if err := dst.Import(bg, &buf); err != nil {
			t.Fatal(err)
		}
		if got := treeOf(t, dst.Dir()); got != want {
			t.Errorf("%s: imported\n%s\nwant\n%s", key, got, want)
		}
	}
	var restored []string
	for _, key := range []string{"t/s/a", "t/s/d"} {
		out := filepath.Join(base, "restored-"+strings.ReplaceAll(key, "/", "-"))
		os.Mkdir(out, 0o700)
		if _, err := s.RestoreInto(bg, key, out); err != nil {
			t.Fatal(err)
		}
		restored = append(restored, treeOf(t, out))
	}
	if restored[0] != restored[1] {
		t.Errorf("restored from the archive:\n%s\nfrom the directory:\n%s", restored[0], restored[1])
	}
	if restored[1] != want {
		t.Errorf("restored:\n%s\nwant\n%s", restored[1], want)
	}
}

// A second SaveArchive of an unchanged workspace writes no chunk; with
// the previous manifest it does not even look one up.
func TestArchiveUnchanged(t *testing.T) {
	needRoot(t)
	s, c := newCountingStore(t)
	src := newWorkspace(t, t.TempDir(), "src")
	plantWorkspace(t, src.Dir())
	first, st, err := s.SaveArchive(bg, bytes.NewReader(export(t, src)), "t/s/1", nil)
	if err != nil || st.NewChunks == 0 {
		t.Fatalf("%+v %v", st, err)
	}
	chunks := st.NewChunks
	c.stats.Store(0)
	if _, st, err := s.SaveArchive(bg, bytes.NewReader(export(t, src)), "t/s/2", nil); err != nil || st.NewChunks != 0 || st.NewBytes != 0 {
		t.Errorf("second save without prev: %+v %v; want no new chunk", st, err)
	}
	if n := c.stats.Load(); n != int64(chunks) {
		t.Errorf("second save without prev looked up %d chunks, want %d", n, chunks)
	}
	c.stats.Store(0)
	if _, st, err := s.SaveArchive(bg, bytes.NewReader(export(t, src)), "t/s/3", first); err != nil || st.NewChunks != 0 {
		t.Errorf("second save with prev: %+v %v; want no new chunk", st, err)
	}
	if n := c.stats.Load(); n != 0 {
		t.Errorf("second save with prev looked up %d chunks, want none", n)
	}
	// A changed file is looked up (and written) again.
	put(t, src.Dir(), "big.bin", randomBytes(100), 0o644, owners.User)
	c.stats.Store(0)
	if _, st, err := s.SaveArchive(bg, bytes.NewReader(export(t, src)), "t/s/4", first); err != nil || st.NewChunks != 1 || c.stats.Load() != 1 {
		t.Errorf("save of a changed file: %+v %v, %d lookups; want 1 new chunk, 1 lookup", st, err, c.stats.Load())
	}
}

// Collect keeps the chunks of an archive-saved manifest, and collects
// them once it is deleted.
func TestCollectKeepsArchiveChunks(t *testing.T) {
	needRoot(t)
	s, _ := newCountingStore(t)
	src := newWorkspace(t, t.TempDir(), "src")
	plantWorkspace(t, src.Dir())
	_, st, err := s.SaveArchive(bg, bytes.NewReader(export(t, src)), "t/s/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := s.Collect(bg, 0); err != nil || c.Chunks != 0 {
		t.Errorf("collect: %+v %v; want nothing collected", c, err)
	}
	if _, err := s.WriteArchive(bg, "t/s/a", io.Discard); err != nil {
		t.Errorf("after collect: %v", err)
	}
	s.Delete(bg, "t/s/a")
	if c, err := s.Collect(bg, 0); err != nil || c.Chunks != st.NewChunks {
		t.Errorf("collect after delete: %+v %v; want its %d chunks", c, err, st.NewChunks)
	}
}

// With a stream the content is always read, so another tenant's chunk
// cannot be referenced by its hash: an attacker's archive holding a
// victim's file stores it anew in the attacker's area, even with the
// victim's manifest passed as prev, and survives the victim's deletion.
func TestArchiveTenantFence(t *testing.T) {
	needRoot(t)
	s, c := newCountingStore(t)
	base := t.TempDir()
	secret := randomBytes(100 << 10)
	victim := newWorkspace(t, base, "victim")
	put(t, victim.Dir(), "secret.bin", secret, 0o644, owners.User)
	vm, _, err := s.SaveArchive(bg, bytes.NewReader(export(t, victim)), "victim/s1/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	attacker := newWorkspace(t, base, "attacker")
	put(t, attacker.Dir(), "secret.bin", secret, 0o644, owners.User)
	for _, prev := range []*snapshot.Manifest{nil, vm} {
		c.stats.Store(0)
		_, st, err := s.SaveArchive(bg, bytes.NewReader(export(t, attacker)), "attacker/s2/b", prev)
		if err != nil {
			t.Fatal(err)
		}
		if st.NewBytes != int64(len(secret)) || c.stats.Load() != 1 {
			t.Errorf("prev %v: the attacker's save stored %d new bytes of %d after %d lookups: it learnt the victim has the file",
				prev != nil, st.NewBytes, len(secret), c.stats.Load())
		}
		s.Delete(bg, "attacker/s2/b")
		s.Collect(bg, 0)
	}
	if _, _, err := s.SaveArchive(bg, bytes.NewReader(export(t, attacker)), "attacker/s2/b", nil); err != nil {
		t.Fatal(err)
	}
	s.Delete(bg, "victim/s1/a")
	if col, err := s.Collect(bg, 0); err != nil || col.Chunks != 1 {
		t.Errorf("collect: %+v %v; want the victim's one chunk", col, err)
	}
	dst := newWorkspace(t, base, "dst")
	var buf bytes.Buffer
	if _, err := s.WriteArchive(bg, "attacker/s2/b", &buf); err != nil {
		t.Fatal(err)
	}
	if err := dst.Import(bg, &buf); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst.Dir(), "secret.bin")); err != nil || !bytes.Equal(b, secret) {
		t.Errorf("the attacker's copy: %v", err)
	}
}

// TestMeasureArchive logs what saving and restoring a 100 MB workspace of
// 1,000 files costs through a directory (Save, RestoreInto) and through
// an archive (Export piped into SaveArchive, WriteArchive piped into
// Import), first and unchanged second save, with the chunk lookups each
// made. It measures, it asserts nothing: SBX_MEASURE=1 runs it.
func TestMeasureArchive(t *testing.T) {
	if os.Getenv("SBX_MEASURE") == "" {
		t.Skip("a measurement: set SBX_MEASURE=1")
	}
	needRoot(t)
	base := t.TempDir()
	src := newWorkspace(t, base, "src")
	for i := range 1000 {
		put(t, src.Dir(), fmt.Sprintf("d%02d/f%04d.bin", i/50, i), randomBytes(100_000), 0o644, owners.User)
	}
	piped := func(w func(io.Writer) error, r func(io.Reader) error) error {
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() { err := w(pw); pw.CloseWithError(err); done <- err }()
		err := r(pr)
		pr.CloseWithError(io.ErrClosedPipe)
		if werr := <-done; err == nil {
			err = werr
		}
		return err
	}
	measure := func(name string, c *counting, fn func() (snapshot.Stats, error)) {
		c.stats.Store(0)
		start := time.Now()
		st, err := fn()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%-34s %8v  new chunks %4d  chunk lookups %4d  files reread %4d", name, time.Since(start).Round(time.Millisecond), st.NewChunks, c.stats.Load(), st.Reread)
	}
	dirStore, dc := newCountingStore(t)
	var prev *snapshot.Manifest
	for _, round := range []string{"first", "second"} {
		measure("Save "+round, dc, func() (snapshot.Stats, error) {
			m, st, err := dirStore.Save(bg, src.Dir(), "t/s/"+round, prev)
			prev = m
			return st, err
		})
	}
	arcStore, ac := newCountingStore(t)
	prev = nil
	for _, round := range []string{"first", "second with prev", "second without prev"} {
		p := prev
		if round == "second without prev" {
			p = nil
		}
		measure("Export|SaveArchive "+round, ac, func() (snapshot.Stats, error) {
			var st snapshot.Stats
			err := piped(func(w io.Writer) error { return src.Export(bg, w) }, func(r io.Reader) error {
				m, s, err := arcStore.SaveArchive(bg, r, "t/s/"+strings.ReplaceAll(round, " ", "-"), p)
				if m != nil && prev == nil {
					prev = m
				}
				st = s
				return err
			})
			return st, err
		})
	}
	measure("RestoreInto", dc, func() (snapshot.Stats, error) {
		out := filepath.Join(base, "restored")
		os.Mkdir(out, 0o700)
		_, err := dirStore.RestoreInto(bg, "t/s/first", out)
		return snapshot.Stats{}, err
	})
	dst := newWorkspace(t, base, "dst")
	measure("WriteArchive|Import", ac, func() (snapshot.Stats, error) {
		return snapshot.Stats{}, piped(func(w io.Writer) error {
			_, err := arcStore.WriteArchive(bg, "t/s/first", w)
			return err
		}, func(r io.Reader) error { return dst.Import(bg, r) })
	})
}
