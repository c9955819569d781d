package snapshot

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
)

var ctx = context.Background()

func newStore(t testing.TB) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	b, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	return New(b, "snapshots", Limits{TempDir: dir}), dir
}

// manifests is s.List collected.
func manifests(t testing.TB, s *Store, prefix string) []blob.Info {
	t.Helper()
	var out []blob.Info
	if err := s.List(ctx, prefix, func(info blob.Info) error {
		out = append(out, info)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func write(t testing.TB, p string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// describe is a tree as a sorted list of lines: every entry's type, mode,
// owner, mtime and content or target.
func describe(t testing.TB, root string) string {
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
			line += " -> " + target + fmt.Sprint(" ", st.Mtim.Nano())
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" %d %x", st.Mtim.Nano(), b)
		case fi.IsDir():
			line += fmt.Sprint(" ", st.Mtim.Nano())
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

func plant(t testing.TB, root string) {
	t.Helper()
	write(t, filepath.Join(root, "a/b/c/deep.txt"), []byte("deep"), 0o644)
	write(t, filepath.Join(root, "zero"), nil, 0o600)
	write(t, filepath.Join(root, "one"), []byte("1"), 0o755)
	write(t, filepath.Join(root, "exact"), random(ChunkSize), 0o644)
	// Its last chunk is one byte: a random one would be "one"'s, and so
	// not new, once in 256 runs.
	write(t, filepath.Join(root, "exact1"), append(random(ChunkSize), 0xfe), 0o644)
	write(t, filepath.Join(root, "big"), random(10<<20), 0o4755)
	for _, d := range []string{"empty", "sticky/inner"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(root, "sticky"), 0o1777)
	os.Lchown(filepath.Join(root, "one"), 101000, 101000)
	os.Lchown(filepath.Join(root, "big"), 100000, 100000)
	os.Chmod(filepath.Join(root, "big"), 0o4755) // chown cleared setuid
	for name, target := range map[string]string{"inside": "a/b/c/deep.txt", "outside": "/etc/passwd", "dangling": "nowhere"} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	os.Chtimes(filepath.Join(root, "one"), old, old)
	os.Chtimes(filepath.Join(root, "empty"), old, old)
}

func TestRoundTrip(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	plant(t, src)
	want := describe(t, src)
	m, st, err := s.Save(ctx, src, "t/s/one", nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Files != 6 || m.Symlinks != 3 || m.Dirs != 7 || st.NewBytes != st.Bytes || st.Bytes != m.Size {
		t.Errorf("manifest %d files %d links %d dirs; stats %+v", m.Files, m.Symlinks, m.Dirs, st)
	}
	dst := filepath.Join(dir, "dst")
	if _, err := s.Restore(ctx, "t/s/one", dst); err != nil {
		t.Fatal(err)
	}
	if got := describe(t, dst); got != want {
		t.Errorf("restored tree differs:\n%s\nwant:\n%s", got, want)
	}
	if _, err := s.Restore(ctx, "t/s/one", dst); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("restore over a tree: %v, want ErrAlreadyExists", err)
	}
	if _, err := s.Restore(ctx, "t/s/none", filepath.Join(dir, "x")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("restore of nothing: %v, want ErrNotFound", err)
	}
}

func TestIncremental(t *testing.T) {
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	for i := range 20 {
		write(t, filepath.Join(src, fmt.Sprintf("f%02d", i)), random(100<<10), 0o644)
	}
	write(t, filepath.Join(src, "log"), random(10<<20), 0o644)
	m1, st1, err := s.Save(ctx, src, "k/1", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Unchanged, with the previous manifest: nothing stored, nothing read.
	m2, st2, err := s.Save(ctx, src, "k/2", m1)
	if err != nil {
		t.Fatal(err)
	}
	if st2.NewBytes != 0 || st2.Reread != 0 || st2.Bytes != st1.Bytes {
		t.Errorf("unchanged tree: %+v (first: %+v)", st2, st1)
	}
	// Without it: read again, still nothing stored.
	if _, st, _ := s.Save(ctx, src, "k/3", nil); st.NewBytes != 0 || st.Reread != 21 {
		t.Errorf("unchanged tree without the previous manifest: %+v", st)
	}
	// One small file changed: only it.
	write(t, filepath.Join(src, "f07"), random(100<<10), 0o644)
	_, st4, _ := s.Save(ctx, src, "k/4", m2)
	if st4.NewBytes != 100<<10 || st4.Reread != 1 {
		t.Errorf("one file changed: %+v", st4)
	}
	// Appended to the 10 MiB file: only its last chunk.
	f, _ := os.OpenFile(filepath.Join(src, "log"), os.O_APPEND|os.O_WRONLY, 0)
	f.Write([]byte("more"))
	f.Close()
	_, st5, _ := s.Save(ctx, src, "k/5", m2)
	if want := int64(10<<20 - 2*ChunkSize + 4); st5.NewBytes != want {
		t.Errorf("append: stored %d bytes, want %d", st5.NewBytes, want)
	}
}

func TestHostileTree(t *testing.T) {
	s, dir := newStore(t)
	src, outside := filepath.Join(dir, "src"), filepath.Join(dir, "outside")
	write(t, filepath.Join(outside, "secret"), []byte("secret"), 0o644)
	write(t, filepath.Join(src, "ok"), []byte("ok"), 0o644)
	os.Symlink(outside, filepath.Join(src, "escape"))
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var m *Manifest
	var st Stats
	var err error
	go func() {
		defer close(done)
		m, st, err = s.Save(ctx, src, "h", nil)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("save hung on a FIFO")
	}
	if err != nil {
		t.Fatal(err)
	}
	if m.Files != 1 || m.Symlinks != 1 || st.Skipped != 1 {
		t.Errorf("hostile tree: %d files, %d links, %d skipped", m.Files, m.Symlinks, st.Skipped)
	}
	for _, e := range entries(t, s, "h") {
		if strings.Contains(e.Path, "secret") {
			t.Errorf("saved %s through a symlink", e.Path)
		}
	}
}

func TestBadManifests(t *testing.T) {
	s, dir := newStore(t)
	root := Entry{Path: ".", Type: "dir", Mode: 0o755}
	sum := strings.Repeat("a", 64)
	for name, entries := range map[string][]Entry{
		"dotdot":      {root, {Path: "../x", Type: "file"}},
		"absolute":    {root, {Path: "/etc/x", Type: "file"}},
		"unclean":     {root, {Path: "a//b", Type: "file"}},
		"orphan":      {root, {Path: "a/b", Type: "file"}},
		"via symlink": {root, {Path: "a", Type: "symlink", Target: "/etc"}, {Path: "a/passwd", Type: "file"}},
		"twice":       {root, {Path: "a", Type: "dir"}, {Path: "a", Type: "file"}},
		"no root":     {{Path: "a", Type: "file"}},
		"bad chunk":   {root, {Path: "a", Type: "file", Size: 1, Chunks: []string{"../../x"}}},
		"bad size":    {root, {Path: "a", Type: "file", Size: 2 * ChunkSize, Chunks: []string{sum}}},
		"bad type":    {root, {Path: "a", Type: "fifo"}},
		"bad mode":    {root, {Path: "a", Type: "file", Mode: 0o170000}},
		"nul":         {root, {Path: "a\x00b", Type: "file"}},
	} {
		t.Run(name, func(t *testing.T) {
			putEntries(t, s, &Manifest{Version: manifestVersion, Key: "bad"}, entries)
			if _, err := s.Restore(ctx, "bad", filepath.Join(dir, "out")); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("restore: %v, want ErrInvalidArgument", err)
			}
			if _, err := os.Lstat(filepath.Join(dir, "out")); err == nil {
				t.Error("something was restored")
			}
		})
	}
}

func TestCorruptChunk(t *testing.T) {
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	write(t, filepath.Join(src, "f"), []byte("original"), 0o644)
	m, _, err := s.Save(ctx, src, "c", nil)
	if err != nil {
		t.Fatal(err)
	}
	sum := entries(t, s, m.Key)[1].Chunks[0]
	s.blobs.Put(ctx, chunkKey(s.chunkArea("c", manifestVersion), sum), strings.NewReader("tampered"))
	if _, err := s.Restore(ctx, "c", filepath.Join(dir, "out")); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("restore with a corrupt chunk: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("a failed restore left %v", entries)
	}
}

func TestCollect(t *testing.T) {
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	write(t, filepath.Join(src, "kept"), []byte("kept"), 0o644)
	write(t, filepath.Join(src, "gone"), []byte("gone"), 0o644)
	if _, _, err := s.Save(ctx, src, "t/a", nil); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(src, "gone"))
	if _, _, err := s.Save(ctx, src, "t/b", nil); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Collect(ctx, 0); c.Chunks != 0 {
		t.Errorf("collected %d chunks every manifest still uses", c.Chunks)
	}
	s.Delete(ctx, "t/a")
	if c, _ := s.Collect(ctx, time.Hour); c.Chunks != 0 {
		t.Errorf("collected %d chunks younger than the grace period", c.Chunks)
	}
	c, err := s.Collect(ctx, 0)
	if err != nil || c.Chunks != 1 || c.Bytes != 4 {
		t.Errorf("collect: %+v, %v; want 1 chunk, 4 bytes", c, err)
	}
	if _, err := s.Restore(ctx, "t/b", filepath.Join(dir, "out")); err != nil {
		t.Errorf("restore after collection: %v", err)
	}
	if list := manifests(t, s, ""); len(list) != 1 || list[0].Key != "t/b" {
		t.Errorf("list: %+v", list)
	}
}

func FuzzManifest(f *testing.F) {
	f.Add(`{"v":2,"Entries":[{"p":".","t":"dir"},{"p":"a","t":"dir"},{"p":"a/b","t":"file","s":1,"c":["` + strings.Repeat("0", 64) + `"]}]}`)
	f.Add(`{"Entries":[{"p":".","t":"dir"},{"p":"../x","t":"symlink","l":"y"}]}`)
	f.Add(`{"v":2,"Entries":[{"p":".","t":"dir"},{"pb":"/y8=","t":"symlink","lb":"/w=="}]}`)
	f.Fuzz(func(t *testing.T, js string) {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write([]byte(js))
		zw.Close()
		var m Manifest
		r, err := readHeader(&buf, &m)
		if err != nil {
			return
		}
		c := checker{lim: Limits{}.withDefaults(), legacy: r.legacy}
		var e Entry
		for r.next(&e) == nil && c.check(&e) == nil {
			if strings.HasPrefix(e.Path, "/") || strings.Contains("/"+e.Path+"/", "/../") {
				t.Fatalf("accepted %q", e.Path)
			}
			json.Marshal(e)
		}
	})
}

// entries reads the entries of the manifest at key.
func entries(t testing.TB, s *Store, key string) []Entry {
	t.Helper()
	var out []Entry
	if err := s.Entries(ctx, key, func(e *Entry) error {
		out = append(out, *e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// putEntries writes a manifest of the entries given, unchecked.
func putEntries(t testing.TB, s *Store, m *Manifest, entries []Entry) {
	t.Helper()
	mw, err := newManifestWriter(s.lim.TempDir)
	if err != nil {
		t.Fatal(err)
	}
	defer mw.close()
	for _, e := range entries {
		if err := mw.add(e); err != nil {
			t.Fatal(err)
		}
	}
	r, err := mw.reader(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.blobs.Put(ctx, s.manifestKey(m.Key), r); err != nil {
		t.Fatal(err)
	}
}

func benchTree(b *testing.B) (*Store, string) {
	s, dir := newStore(b)
	src := filepath.Join(dir, "src")
	write(b, filepath.Join(src, "big"), random(50<<20), 0o644)
	for i := range 50 {
		write(b, filepath.Join(src, fmt.Sprintf("p%02d", i)), random(1<<20), 0o644)
	}
	return s, src
}

func BenchmarkSave100MB(b *testing.B) {
	s, src := benchTree(b)
	b.SetBytes(100 << 20)
	for i := 0; b.Loop(); i++ {
		if _, _, err := s.Save(ctx, src, fmt.Sprintf("b/%d", i), nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSaveUnchanged100MB(b *testing.B) {
	s, src := benchTree(b)
	m, _, _ := s.Save(ctx, src, "first", nil)
	b.SetBytes(100 << 20)
	for i := 0; b.Loop(); i++ {
		if _, _, err := s.Save(ctx, src, fmt.Sprintf("b/%d", i), m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRestore100MB(b *testing.B) {
	s, src := benchTree(b)
	s.Save(ctx, src, "r", nil)
	out := filepath.Join(b.TempDir(), "out")
	b.SetBytes(100 << 20)
	for b.Loop() {
		if _, err := s.Restore(ctx, "r", out); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(out)
		b.StartTimer()
	}
}
