package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// contentDir is a stand-in for the content store: content by its hash.
// lie, if set, is what it gives instead for that hash.
type contentDir struct {
	have map[string][]byte
	lie  map[string][]byte
}

func newContentDir(t *testing.T, base string) *contentDir {
	return &contentDir{have: map[string][]byte{}, lie: map[string][]byte{}}
}

func (c *contentDir) add(content string) Resource {
	sum := sha256.Sum256([]byte(content))
	h := hex.EncodeToString(sum[:])
	c.have[h] = []byte(content)
	return Resource{SHA256: h, Size: int64(len(content))}
}

func (c *contentDir) open(ctx context.Context, sum string) (io.ReadCloser, int64, error) {
	b, ok := c.have[sum]
	if !ok {
		return nil, 0, errdefs.ErrNotFound
	}
	if l, ok := c.lie[sum]; ok {
		b = l
	}
	return io.NopCloser(bytes.NewReader(b)), int64(len(c.have[sum])), nil
}

func res(name string, r Resource) Resource { r.Name = name; return r }

func (e *env) sync(t *testing.T, c *contentDir, want ...Resource) ResourceSync {
	t.Helper()
	want, err := CheckManifest(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.w.SyncResources(context.Background(), want, c.open)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func (e *env) resource(t *testing.T, name string) (string, *syscall.Stat_t) {
	t.Helper()
	p := filepath.Join(e.w.Dir(), ResourcesDir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	return string(b), fi.Sys().(*syscall.Stat_t)
}

func TestSyncResources(t *testing.T) {
	e := newEnv(t)
	c := newContentDir(t, e.base)
	skill, readme := c.add("# PDF skill\n"), c.add("read me\n")

	got := e.sync(t, c, res("skills/pdf/SKILL.md", skill), res("README", readme))
	if !slices.Equal(got.Added, []string{"README", "skills/pdf/SKILL.md"}) || len(got.Needed)+len(got.Changed)+len(got.Removed)+got.Unchanged != 0 {
		t.Fatalf("first sync: %+v", got)
	}
	body, st := e.resource(t, "skills/pdf/SKILL.md")
	if body != "# PDF skill\n" {
		t.Fatalf("content %q", body)
	}
	if int(st.Uid) != testOwners().Root.UID || st.Mode&0o777 != 0o444 {
		t.Fatalf("resource: uid %d, mode %o", st.Uid, st.Mode&0o777)
	}
	dir, _ := os.Stat(filepath.Join(e.w.Dir(), ResourcesDir, "skills"))
	if ds := dir.Sys().(*syscall.Stat_t); int(ds.Uid) != testOwners().Root.UID || dir.Mode().Perm() != 0o755 {
		t.Fatalf("directory: uid %d mode %v", ds.Uid, dir.Mode())
	}

	// Unchanged: nothing happens, the record is not even rewritten.
	rec := filepath.Join(e.w.Dir(), resourcesRecord)
	before, _ := os.Stat(rec)
	if got := e.sync(t, c, res("README", readme), res("skills/pdf/SKILL.md", skill)); got.Unchanged != 2 || len(got.Added)+len(got.Changed)+len(got.Removed)+len(got.Needed) != 0 {
		t.Fatalf("unchanged sync: %+v", got)
	}
	if after, _ := os.Stat(rec); !after.ModTime().Equal(before.ModTime()) {
		t.Fatal("an unchanged sync rewrote the record")
	}

	// Content the store lacks is needed; the old version stays meanwhile.
	v2 := Resource{SHA256: strings.Repeat("ab", 32), Size: 9}
	got = e.sync(t, c, res("README", readme), res("skills/pdf/SKILL.md", v2))
	if len(got.Needed) != 1 || got.Needed[0].Name != "skills/pdf/SKILL.md" || got.Unchanged != 1 {
		t.Fatalf("sync with missing content: %+v", got)
	}
	if body, _ := e.resource(t, "skills/pdf/SKILL.md"); body != "# PDF skill\n" {
		t.Fatalf("old version gone before the new one came: %q", body)
	}
	have, _ := e.w.Resources(context.Background())
	if len(have) != 2 || have[1].SHA256 != skill.SHA256 {
		t.Fatalf("record after a partial sync: %+v", have)
	}

	// Changed, removed, and a file that becomes a directory.
	skill2, sub := c.add("# PDF skill v2\n"), c.add("nested\n")
	got = e.sync(t, c, res("skills/pdf/SKILL.md", skill2), res("README/sub", sub))
	if !slices.Equal(got.Changed, []string{"skills/pdf/SKILL.md"}) || !slices.Equal(got.Removed, []string{"README"}) || !slices.Equal(got.Added, []string{"README/sub"}) {
		t.Fatalf("sync: %+v", got)
	}
	if body, _ := e.resource(t, "skills/pdf/SKILL.md"); body != "# PDF skill v2\n" {
		t.Fatalf("changed content %q", body)
	}
	// Content that is not what it claims (a store gone wrong) fails the
	// sync and leaves the version in place.
	skill3 := c.add("# PDF skill v3\n")
	c.lie[skill3.SHA256] = []byte("# PDF skill v4\n")
	want, _ := CheckManifest([]Resource{res("skills/pdf/SKILL.md", skill3), res("README/sub", sub)})
	if _, err := e.w.SyncResources(context.Background(), want, c.open); err == nil || !strings.Contains(err.Error(), "hashing to") {
		t.Fatalf("sync of content that lies: %v", err)
	}
	if body, _ := e.resource(t, "skills/pdf/SKILL.md"); body != "# PDF skill v2\n" {
		t.Fatalf("after a failed sync: %q", body)
	}
	// Removing everything leaves no empty directories behind.
	got = e.sync(t, c)
	if len(got.Removed) != 2 {
		t.Fatalf("remove all: %+v", got)
	}
	ents, _ := os.ReadDir(filepath.Join(e.w.Dir(), ResourcesDir))
	if len(ents) != 1 || ents[0].Name() != filepath.Base(resourcesRecord) {
		t.Fatalf("left in %s: %v", ResourcesDir, ents)
	}
}

// A sandbox that renames the resource directory away and makes its own
// gets sbx's back, rebuilt from nothing it made.
func TestSyncResourcesDirReplacedBySandbox(t *testing.T) {
	requiresRoot(t)
	e := newEnv(t)
	c := newContentDir(t, e.base)
	a := c.add("a\n")
	e.sync(t, c, res("a", a))
	ws := e.w.Dir()
	if err := os.Rename(filepath.Join(ws, ResourcesDir), filepath.Join(ws, "moved")); err != nil {
		t.Fatal(err)
	}
	// The sandbox's own directory, with a forged record claiming b is
	// in place and a link out of the workspace.
	fake := filepath.Join(ws, ResourcesDir)
	mustMkdir(t, fake)
	mustWrite(t, filepath.Join(fake, filepath.Base(resourcesRecord)), `{"resources":[{"name":"b","sha256":"`+strings.Repeat("0", 64)+`","size":1}]}`)
	os.Symlink(e.outside, filepath.Join(fake, "out"))
	for _, p := range []string{fake, filepath.Join(fake, filepath.Base(resourcesRecord))} {
		os.Lchown(p, e.user.UID, e.user.GID)
	}
	b := c.add("b\n")
	got := e.sync(t, c, res("a", a), res("b", b))
	if !slices.Equal(got.Added, []string{"a", "b"}) {
		t.Fatalf("sync over a forged directory: %+v", got)
	}
	if _, err := os.Lstat(filepath.Join(fake, "out")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sandbox's link survived: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.outside, "secret")); err != nil {
		t.Fatalf("outside touched: %v", err)
	}
}

func TestCheckManifest(t *testing.T) {
	sum := strings.Repeat("0", 64)
	for _, tc := range []struct {
		name string
		m    []Resource
	}{
		{"dotdot", []Resource{{Name: "../x", SHA256: sum}}},
		{"absolute", []Resource{{Name: "/etc/passwd", SHA256: sum}}},
		{"root", []Resource{{Name: ".", SHA256: sum}}},
		{"own names", []Resource{{Name: "a/.sbx-manifest.json", SHA256: sum}}},
		{"bad sum", []Resource{{Name: "a", SHA256: strings.Repeat("A", 64)}}},
		{"short sum", []Resource{{Name: "a", SHA256: "abc"}}},
		{"negative", []Resource{{Name: "a", SHA256: sum, Size: -1}}},
		{"twice", []Resource{{Name: "a", SHA256: sum}, {Name: "./a", SHA256: sum}}},
		{"file and dir", []Resource{{Name: "a/b", SHA256: sum}, {Name: "a", SHA256: sum}}},
		{"file and dir apart", []Resource{{Name: "a/b", SHA256: sum}, {Name: "a.b", SHA256: sum}, {Name: "a", SHA256: sum}}},
		{"NUL", []Resource{{Name: "a\x00", SHA256: sum}}},
		{"too many", make([]Resource, MaxResources+1)},
	} {
		if _, err := CheckManifest(tc.m); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid argument", tc.name, err)
		}
	}
	got, err := CheckManifest([]Resource{{Name: "b//c", SHA256: sum}, {Name: "a.b", SHA256: sum}, {Name: "a", SHA256: sum}})
	if err != nil || got[0].Name != "a" || got[1].Name != "a.b" || got[2].Name != "b/c" {
		t.Fatalf("CheckManifest: %v %+v", err, got)
	}
}
