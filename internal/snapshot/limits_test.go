package snapshot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// A tree 40,000 directories deep is refused at once, with a clear error
// and in little memory (the paths alone of a full walk would take 1.6 GB),
// and leaves no manifest; one at the limit goes through save and restore.
func TestDeepTree(t *testing.T) {
	if testing.Short() {
		t.Skip("makes 40,000 nested directories")
	}
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o755)
	testenv.DeepTree(t, src, 40_000)
	defer func() {
		if err := quota.RemoveAll(src); err != nil {
			t.Error(err)
		}
	}()
	var err error
	grew := testenv.HeapGrowth(func() { _, _, err = s.Save(ctx, src, "deep", nil) })
	t.Logf("save of a 40,000-deep tree: heap grew %d KiB", grew>>10)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "deeper than 256") {
		t.Errorf("save: %v, want ErrResourceExhausted naming the depth limit", err)
	}
	if grew > 64<<20 {
		t.Errorf("the heap grew by %d MiB", grew>>20)
	}
	if list := manifests(t, s, ""); len(list) != 0 {
		t.Errorf("a refused save left manifests %v", list)
	}

	ok := filepath.Join(dir, "ok")
	os.Mkdir(ok, 0o755)
	testenv.DeepTree(t, ok, DefaultMaxDepth)
	if _, _, err := s.Save(ctx, ok, "ok", nil); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if _, err := s.Restore(ctx, "ok", out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, strings.Repeat("d/", DefaultMaxDepth), "bottom")); err != nil {
		t.Errorf("the bottom of the tree: %v", err)
	}
}

// 50,000 entries go through save and restore in memory that does not
// grow with them (a million go through hibernation over HTTP in
// internal/server, TestHibernateMillionFiles).
func TestManyFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 50,000 files")
	}
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	const dirs, per = 50, 1000
	for i := range dirs {
		d := filepath.Join(src, fmt.Sprintf("dir-%03d", i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range per {
			f, err := os.Create(filepath.Join(d, fmt.Sprintf("file-with-a-longish-name-%04d.txt", j)))
			if err != nil {
				t.Fatal(err)
			}
			if j%100 == 0 {
				fmt.Fprintf(f, "%d/%d", i, j)
			}
			f.Close()
		}
	}
	var (
		m   *Manifest
		err error
	)
	grew := testenv.HeapGrowth(func() { m, _, err = s.Save(ctx, src, "many", nil) })
	t.Logf("save of %d files: heap grew %d KiB", dirs*per, grew>>10)
	if err != nil {
		t.Fatal(err)
	}
	if m.Files != dirs*per || m.Dirs != dirs+1 {
		t.Errorf("manifest: %d files, %d dirs", m.Files, m.Dirs)
	}
	if grew > 48<<20 {
		t.Errorf("save: the heap grew by %d MiB", grew>>20)
	}
	out := filepath.Join(dir, "out")
	grew = testenv.HeapGrowth(func() { _, err = s.Restore(ctx, "many", out) })
	t.Logf("restore of %d files: heap grew %d KiB", dirs*per, grew>>10)
	if err != nil {
		t.Fatal(err)
	}
	if grew > 48<<20 {
		t.Errorf("restore: the heap grew by %d MiB", grew>>20)
	}
	if b, err := os.ReadFile(filepath.Join(out, "dir-023", "file-with-a-longish-name-0400.txt")); string(b) != "23/400" {
		t.Errorf("a restored file: %q %v", b, err)
	}
}

// Each limit refuses a tree past it with ErrResourceExhausted.
func TestLimits(t *testing.T) {
	_, dir := newStore(t)
	src := filepath.Join(dir, "src")
	write(t, filepath.Join(src, "a/b/c/file"), []byte(strings.Repeat("x", 100)), 0o644)
	write(t, filepath.Join(src, "top"), nil, 0o644)
	for name, tc := range map[string]struct {
		lim  Limits
		want string
	}{
		"depth":   {Limits{MaxDepth: 2}, "deeper than 2"},
		"path":    {Limits{MaxPath: 8}, "longer than 8 bytes"},
		"entries": {Limits{MaxEntries: 4}, "more than 4 entries"},
		"bytes":   {Limits{MaxBytes: 99}, "more than 99 bytes"},
		"time":    {Limits{Timeout: time.Nanosecond}, "took longer than"},
		"enough":  {Limits{MaxDepth: 3, MaxPath: 10, MaxEntries: 5, MaxBytes: 100}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			s, _ := newStore(t)
			tc.lim.TempDir = dir
			s.lim = tc.lim.withDefaults()
			_, _, err := s.Save(ctx, src, "k", nil)
			if tc.want == "" {
				if err != nil {
					t.Errorf("save within the limits: %v", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("save: %v, want ErrResourceExhausted saying %q", err, tc.want)
			}
		})
	}
}

// Names that are not UTF-8 keep their bytes: two of them do not become
// one (which made the manifest unrestorable: "appears twice").
func TestNonUTF8Names(t *testing.T) {
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	write(t, filepath.Join(src, "\xff"), []byte("ff"), 0o644)
	write(t, filepath.Join(src, "\xfe"), []byte("fe"), 0o644)
	os.Symlink("\xfd", filepath.Join(src, "link"))
	if _, _, err := s.Save(ctx, src, "k", nil); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if _, err := s.Restore(ctx, "k", out); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"\xff": "ff", "\xfe": "fe"} {
		if b, err := os.ReadFile(filepath.Join(out, name)); string(b) != want {
			t.Errorf("%q: %q %v", name, b, err)
		}
	}
	if target, _ := os.Readlink(filepath.Join(out, "link")); target != "\xfd" {
		t.Errorf("link target %q", target)
	}
}

// A manifest that cannot be read is skipped and reported: the garbage of
// everyone else is still collected.
func TestCollectSkipsCorruptManifest(t *testing.T) {
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	write(t, filepath.Join(src, "f"), []byte("gone"), 0o644)
	if _, _, err := s.Save(ctx, src, "a", nil); err != nil {
		t.Fatal(err)
	}
	s.Delete(ctx, "a")
	s.blobs.Put(ctx, s.manifestKey("broken"), strings.NewReader("not gzip"))
	c, err := s.Collect(ctx, 0)
	if err != nil || c.Chunks != 1 || len(c.Unreadable) != 1 || c.Unreadable[0] != "broken" {
		t.Errorf("collect: %+v, %v; want 1 chunk collected and broken reported", c, err)
	}
}

// A manifest past today's limits (written under higher ones) is still
// restored, and still keeps its chunks from the collector.
func TestManifestsPastLimits(t *testing.T) {
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	for i := range 5 {
		write(t, filepath.Join(src, fmt.Sprint("f", i)), []byte(fmt.Sprint("content ", i)), 0o644)
	}
	if _, _, err := s.Save(ctx, src, "t/a", nil); err != nil {
		t.Fatal(err)
	}
	s.lim.MaxEntries = 2
	if c, err := s.Collect(ctx, 0); err != nil || c.Chunks != 0 || len(c.Unreadable) != 0 {
		t.Errorf("collect: %+v %v; want nothing collected", c, err)
	}
	if _, err := s.Restore(ctx, "t/a", filepath.Join(dir, "out")); err != nil {
		t.Errorf("restore under lower limits: %v", err)
	}
}

// No file comes back setuid or setgid: the bits were set by sandboxed
// code, and left on the host they would be one more way out. A
// directory's mode comes back as it was.
func TestRestoreDropsSetID(t *testing.T) {
	s, dir := newStore(t)
	src := filepath.Join(dir, "src")
	write(t, filepath.Join(src, "suid"), []byte("x"), 0o755)
	write(t, filepath.Join(src, "sub", "sgid"), []byte("y"), 0o755)
	for p, mode := range map[string]os.FileMode{"suid": 0o755 | os.ModeSetuid, "sub/sgid": 0o750 | os.ModeSetgid, "sub": 0o755 | os.ModeSticky} {
		if err := os.Chmod(filepath.Join(src, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Save(ctx, src, "k", nil); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if _, err := s.Restore(ctx, "k", out); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"suid": 0o755, "sub/sgid": 0o750, "sub": 0o755 | os.ModeSticky | os.ModeDir} {
		fi, err := os.Lstat(filepath.Join(out, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v (%v)", p, fi.Mode(), want, err)
		}
	}
}
