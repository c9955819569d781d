// Package workspacetest is the conformance suite of workspace.Workspace:
// what every implementation (the host's Local, the executor's through its
// client, any later one) must do, and what it must refuse when the
// sandbox works against it. Each implementation's tests call Run.
package workspacetest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Subject is one workspace under test.
type Subject struct {
	W workspace.Workspace
	// Sandbox runs script with /bin/sh -c in the workspace directory as
	// the sandbox user (uid 1000 inside), as code in the sandbox would,
	// and returns its combined output; an error if it exits non-zero.
	Sandbox func(ctx context.Context, script string) (string, error)
	// InConversation, where set, runs script as Sandbox does but for a run
	// of conversation cid, and the suite expects what a Pod's executor
	// gives (internal/executor/podviews.go): a conversation's uploads are
	// read by its own code only. Where nil, by any code in the sandbox.
	InConversation func(ctx context.Context, cid, script string) (string, error)
}

// Run runs the suite. fresh returns a new, empty workspace (as
// workspace.Create makes it) on every call; the caller closes it (with
// t.Cleanup, say).
func Run(t *testing.T, fresh func(t *testing.T) Subject) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, func(*testing.T) Subject)
	}{
		{"SaveOpenStat", testSaveOpenStat},
		{"Ranges", testRanges},
		{"TooLarge", testTooLarge},
		{"ListMakeDirRenameRemove", testListMakeDirRenameRemove},
		{"BadPaths", testBadPaths},
		{"PlantedLinks", testPlantedLinks},
		{"SpecialFiles", testSpecialFiles},
		{"Uploads", testUploads},
		{"Resources", testResources},
		{"Usage", testUsage},
		{"ExportImport", testExportImport},
		{"ExportOrder", testExportOrder},
		{"HostileArchives", testHostileArchives},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, fresh) })
	}
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func sandbox(t *testing.T, s Subject, script string) string {
	t.Helper()
	out, err := s.Sandbox(ctxOf(t), script)
	if err != nil {
		t.Fatalf("in the sandbox: %q: %v\n%s", script, err, out)
	}
	return out
}

func save(t *testing.T, w workspace.Workspace, rel, content string) workspace.SavedFile {
	t.Helper()
	f, err := w.Save(ctxOf(t), rel, strings.NewReader(content), 0)
	if err != nil {
		t.Fatalf("Save(%q): %v", rel, err)
	}
	return f
}

func read(t *testing.T, w workspace.Workspace, rel string) string {
	t.Helper()
	f, err := w.Open(ctxOf(t), rel)
	if err != nil {
		t.Fatalf("Open(%q): %v", rel, err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatalf("reading %q: %v", rel, err)
	}
	return string(b)
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func testSaveOpenStat(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	ctx := ctxOf(t)
	got := save(t, s.W, "./dir//a.txt", "hello")
	if got.Path != "dir/a.txt" || got.Size != 5 || got.SHA256 != sum("hello") {
		t.Errorf("Save = %+v", got)
	}
	if c := read(t, s.W, "dir/a.txt"); c != "hello" {
		t.Errorf("read back %q", c)
	}
	// The sandbox sees it as its own, and can change it.
	if out := sandbox(t, s, "cat dir/a.txt && echo more >> dir/a.txt"); out != "hello" {
		t.Errorf("the sandbox sees %q", out)
	}
	e, err := s.W.Stat(ctx, "dir/a.txt")
	if err != nil || e.Type != "file" || e.Size != 10 || e.Path != "dir/a.txt" || e.Name != "a.txt" || e.Owner != workspace.OwnerUser || e.Mode != 0o644 {
		t.Errorf("Stat = %+v, %v", e, err)
	}
	if e, err := s.W.Stat(ctx, "dir"); err != nil || e.Type != "dir" {
		t.Errorf("Stat(dir) = %+v, %v", e, err)
	}
	f, err := s.W.Open(ctx, "dir/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	if i := f.Info(); i.Size != 10 || i.Type != "file" || i.ModTime.IsZero() {
		t.Errorf("Open's Info = %+v", i)
	}
	f.Close()
	// Replacing is whole: a reader never sees a part.
	save(t, s.W, "dir/a.txt", "x")
	if c := read(t, s.W, "dir/a.txt"); c != "x" {
		t.Errorf("after replacing: %q", c)
	}
	_, err = s.W.Stat(ctx, "nope")
	wantErr(t, "Stat(nope)", err, errdefs.ErrNotFound)
	_, err = s.W.Open(ctx, "nope")
	wantErr(t, "Open(nope)", err, errdefs.ErrNotFound)
	_, err = s.W.Open(ctx, "dir")
	wantErr(t, "Open(a directory)", err, errdefs.ErrInvalidArgument)
	// An empty file, and one larger than any buffer on the way.
	save(t, s.W, "empty", "")
	if c := read(t, s.W, "empty"); c != "" {
		t.Errorf("empty file reads %q", c)
	}
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	if got := save(t, s.W, "big", big); got.Size != int64(len(big)) || got.SHA256 != sum(big) {
		t.Errorf("Save(big) = %+v", got)
	}
	if c := read(t, s.W, "big"); c != big {
		t.Errorf("big file reads back %d bytes, not the same", len(c))
	}
}

func testRanges(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	content := strings.Repeat("abcdefghij", 10_000)
	save(t, s.W, "r.txt", content)
	f, err := s.W.Open(ctxOf(t), "r.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Back to the start last: http.ServeContent reads a file's start to
	// sniff its type, then reads it again from there.
	for _, at := range []int64{0, 5, 99_990, 12_345, 3, 0} {
		if n, err := f.Seek(at, io.SeekStart); err != nil || n != at {
			t.Fatalf("Seek(%d) = %d, %v", at, n, err)
		}
		buf := make([]byte, 10)
		n, err := io.ReadFull(f, buf)
		want := content[at:min(at+10, int64(len(content)))]
		if string(buf[:n]) != want || (err != nil && len(want) == 10) {
			t.Errorf("10 bytes at %d = %q, %v; want %q", at, buf[:n], err, want)
		}
	}
	if n, err := f.Seek(0, io.SeekEnd); err != nil || n != int64(len(content)) {
		t.Errorf("Seek to the end = %d, %v", n, err)
	}
	if n, err := f.Read(make([]byte, 4)); n != 0 || err != io.EOF {
		t.Errorf("Read at the end = %d, %v; want EOF", n, err)
	}
}

func testTooLarge(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	ctx := ctxOf(t)
	_, err := s.W.Save(ctx, "big.bin", strings.NewReader(strings.Repeat("x", 1001)), 1000)
	wantErr(t, "Save over maxBytes", err, errdefs.ErrTooLarge)
	_, err = s.W.Stat(ctx, "big.bin")
	wantErr(t, "what a refused Save left", err, errdefs.ErrNotFound)
	if l, _, err := s.W.List(ctx, ".", true, 0); err != nil || slices.ContainsFunc(l, func(e workspace.Entry) bool { return e.Type == "file" }) {
		t.Errorf("a refused Save left %+v, %v", l, err)
	}
	if got, err := s.W.Save(ctx, "exact.bin", strings.NewReader(strings.Repeat("x", 1000)), 1000); err != nil || got.Size != 1000 {
		t.Errorf("Save of exactly maxBytes = %+v, %v", got, err)
	}
	// A reader that fails: nothing is left, and the error says so.
	_, err = s.W.Save(ctx, "broken", io.MultiReader(strings.NewReader("part"), errReader{}), 0)
	if err == nil {
		t.Error("Save from a failing reader succeeded")
	}
	_, err = s.W.Stat(ctx, "broken")
	wantErr(t, "what a failed Save left", err, errdefs.ErrNotFound)
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("client went away") }

func paths(es []workspace.Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Path+":"+e.Type)
	}
	return out
}

func testListMakeDirRenameRemove(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	ctx := ctxOf(t)
	if err := s.W.MakeDir(ctx, "a/b/c"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "MakeDir(existing)", s.W.MakeDir(ctx, "a/b"), errdefs.ErrAlreadyExists)
	save(t, s.W, "a/f1", "1")
	save(t, s.W, "a/b/f2", "22")
	sandbox(t, s, "ln -s f1 a/link && mkdir -p mine && echo m > mine/m")
	l, truncated, err := s.W.List(ctx, "a", false, 0)
	if got := strings.Join(paths(l), " "); err != nil || truncated || got != "a/b:dir a/f1:file a/link:symlink" {
		t.Errorf("List(a) = %q, %v, %v", got, truncated, err)
	}
	l, _, err = s.W.List(ctx, "a", true, 0)
	if got := strings.Join(paths(l), " "); err != nil || got != "a/b:dir a/b/c:dir a/b/f2:file a/f1:file a/link:symlink" {
		t.Errorf("List(a, recursive) = %q, %v", got, err)
	}
	l, truncated, err = s.W.List(ctx, "a", true, 2)
	if err != nil || !truncated || len(l) != 2 {
		t.Errorf("List(a, recursive, 2) = %v, %v, %v; want 2 entries, truncated", paths(l), truncated, err)
	}
	if l, _, err := s.W.List(ctx, "a/f1", false, 0); err != nil || len(l) != 1 || l[0].Path != "a/f1" || l[0].Size != 1 {
		t.Errorf("List(a file) = %+v, %v", l, err)
	}
	if e, err := s.W.Stat(ctx, "a/link"); err != nil || e.Type != "symlink" || e.Target != "f1" {
		t.Errorf("Stat(link) = %+v, %v", e, err)
	}
	_, _, err = s.W.List(ctx, "nope", false, 0)
	wantErr(t, "List(nope)", err, errdefs.ErrNotFound)

	if err := s.W.Rename(ctx, "a/f1", "a/b/moved"); err != nil {
		t.Fatal(err)
	}
	if c := read(t, s.W, "a/b/moved"); c != "1" {
		t.Errorf("moved file reads %q", c)
	}
	_, err = s.W.Stat(ctx, "a/f1")
	wantErr(t, "Stat of what moved away", err, errdefs.ErrNotFound)
	wantErr(t, "Rename into itself", s.W.Rename(ctx, "a", "a/b/a"), errdefs.ErrInvalidArgument)
	wantErr(t, "Rename of the workspace", s.W.Rename(ctx, ".", "x"), errdefs.ErrInvalidArgument)
	wantErr(t, "Rename of nothing", s.W.Rename(ctx, "nope", "x"), errdefs.ErrNotFound)

	wantErr(t, "Remove(dir) without recursive", s.W.Remove(ctx, "a/b", false), errdefs.ErrInvalidArgument)
	if err := s.W.Remove(ctx, "a/link", false); err != nil {
		t.Errorf("Remove(link): %v", err)
	}
	if err := s.W.Remove(ctx, "a", true); err != nil {
		t.Errorf("Remove(a, recursive): %v", err)
	}
	_, err = s.W.Stat(ctx, "a")
	wantErr(t, "Stat after Remove", err, errdefs.ErrNotFound)
	wantErr(t, "Remove(nope)", s.W.Remove(ctx, "nope", false), errdefs.ErrNotFound)
	wantErr(t, "Remove(.)", s.W.Remove(ctx, ".", true), errdefs.ErrInvalidArgument)
	if c := read(t, s.W, "mine/m"); c != "m\n" {
		t.Errorf("the sandbox's own file reads %q", c)
	}
}

func testBadPaths(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	ctx := ctxOf(t)
	for _, p := range []string{"../x", "a/../../x", "/etc/passwd", "/workspace/x", "a\x00b", "a\\b", "\xff", strings.Repeat("x/", 3000)} {
		_, err := s.W.Save(ctx, p, strings.NewReader("x"), 0)
		wantErr(t, fmt.Sprintf("Save(%q)", p), err, errdefs.ErrInvalidArgument)
		_, err = s.W.Open(ctx, p)
		wantErr(t, fmt.Sprintf("Open(%q)", p), err, errdefs.ErrInvalidArgument)
		_, err = s.W.Stat(ctx, p)
		wantErr(t, fmt.Sprintf("Stat(%q)", p), err, errdefs.ErrInvalidArgument)
		_, _, err = s.W.List(ctx, p, false, 0)
		wantErr(t, fmt.Sprintf("List(%q)", p), err, errdefs.ErrInvalidArgument)
		wantErr(t, fmt.Sprintf("MakeDir(%q)", p), s.W.MakeDir(ctx, p), errdefs.ErrInvalidArgument)
		wantErr(t, fmt.Sprintf("Remove(%q)", p), s.W.Remove(ctx, p, true), errdefs.ErrInvalidArgument)
		wantErr(t, fmt.Sprintf("Rename(x, %q)", p), s.W.Rename(ctx, "x", p), errdefs.ErrInvalidArgument)
	}
	// What sbx manages is not the client's to write by its plain name.
	for _, p := range []string{"uploads/x", "uploads", ".resources/x", ".resources"} {
		_, err := s.W.Save(ctx, p, strings.NewReader("x"), 0)
		wantErr(t, fmt.Sprintf("Save(%q)", p), err, errdefs.ErrInvalidArgument)
		wantErr(t, fmt.Sprintf("Remove(%q)", p), s.W.Remove(ctx, p, true), errdefs.ErrInvalidArgument)
	}
}

// testPlantedLinks: the sandbox plants links out of the workspace and
// into what sbx manages; no call follows them out or writes through them.
func testPlantedLinks(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	ctx := ctxOf(t)
	sandbox(t, s, "ln -s /etc etc && ln -s ../../../../.. up && ln -s /etc/passwd pw && ln -s uploads u && ln -s loop loop && mkdir real && echo in > real/f && ln -s real inlink")
	for _, p := range []string{"etc/passwd", "up/etc/passwd", "pw", "loop"} {
		_, err := s.W.Open(ctx, p)
		wantErr(t, fmt.Sprintf("Open(%q)", p), err, errdefs.ErrInvalidArgument)
		_, _, err = s.W.List(ctx, p, false, 0)
		if !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("List(%q) = %v, want refused", p, err)
		}
	}
	for _, p := range []string{"etc/x", "up/tmp/x", "u/c1/temparea/x", "inlink/x"} {
		_, err := s.W.Save(ctx, p, strings.NewReader("pwned"), 0)
		wantErr(t, fmt.Sprintf("Save(%q) through a link", p), err, errdefs.ErrInvalidArgument)
		wantErr(t, fmt.Sprintf("MakeDir(%q) through a link", p), s.W.MakeDir(ctx, p), errdefs.ErrInvalidArgument)
	}
	// Reads may follow a link that stays inside.
	if c := read(t, s.W, "inlink/f"); c != "in\n" {
		t.Errorf("read through a link inside: %q", c)
	}
	// A link itself is replaced or removed, never what it points to.
	save(t, s.W, "pw", "mine")
	if e, err := s.W.Stat(ctx, "pw"); err != nil || e.Type != "file" {
		t.Errorf("Save over a link: %+v, %v", e, err)
	}
	if err := s.W.Remove(ctx, "etc", true); err != nil {
		t.Errorf("Remove(a link to /etc): %v", err)
	}
	if out := sandbox(t, s, "test -f /etc/passwd && echo ok"); out != "ok\n" {
		t.Errorf("/etc/passwd after removing a link to /etc: %q", out)
	}
	if err := s.W.Rename(ctx, "inlink", "moved"); err != nil {
		t.Errorf("Rename(a link): %v", err)
	}
	if e, err := s.W.Stat(ctx, "moved"); err != nil || e.Type != "symlink" || e.Target != "real" {
		t.Errorf("the moved link: %+v, %v", e, err)
	}
}

func testSpecialFiles(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	ctx := ctxOf(t)
	sandbox(t, s, "mkfifo fifo")
	done := make(chan error, 1)
	go func() {
		_, err := s.W.Open(ctx, "fifo")
		done <- err
	}()
	select {
	case err := <-done:
		wantErr(t, "Open(a FIFO)", err, errdefs.ErrInvalidArgument)
	case <-time.After(time.Minute):
		t.Fatal("Open(a FIFO) waits for a writer")
	}
	if e, err := s.W.Stat(ctx, "fifo"); err != nil || e.Type != "other" {
		t.Errorf("Stat(fifo) = %+v, %v", e, err)
	}
	save(t, s.W, "fifo", "replaced")
	if c := read(t, s.W, "fifo"); c != "replaced" {
		t.Errorf("a FIFO replaced by Save reads %q", c)
	}
}

func testUploads(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	ctx := ctxOf(t)
	got, err := s.W.SaveUpload(ctx, "c1", "docs/a.pdf", strings.NewReader("pdf"), 0)
	if err != nil || got.Path != "uploads/c1/temparea/docs/a.pdf" || got.Size != 3 {
		t.Fatalf("SaveUpload = %+v, %v", got, err)
	}
	if e, err := s.W.Stat(ctx, got.Path); err != nil || e.Owner != workspace.OwnerRoot {
		t.Errorf("Stat(upload) = %+v, %v; want the sandbox root's", e, err)
	}
	// Code reads it and cannot change, replace or remove it.
	if s.InConversation == nil {
		if out := sandbox(t, s, "cat uploads/c1/temparea/docs/a.pdf"); out != "pdf" {
			t.Errorf("the sandbox reads %q", out)
		}
	} else {
		for _, p := range []string{"uploads/c1/temparea/docs/a.pdf", "uploads/temparea/docs/a.pdf"} {
			if out, err := s.InConversation(ctx, "c1", "cat "+p); err != nil || out != "pdf" {
				t.Errorf("code of conversation c1 reads %s: %q, %v", p, out, err)
			}
			if out, err := s.InConversation(ctx, "c2", "cat "+p); err == nil {
				t.Errorf("code of conversation c2 read %s: %q", p, out)
			}
			if out, err := s.Sandbox(ctx, "cat "+p); err == nil {
				t.Errorf("code of no conversation read %s: %q", p, out)
			}
		}
	}
	for _, script := range []string{
		"echo x > uploads/c1/temparea/docs/a.pdf",
		"rm -f uploads/c1/temparea/docs/a.pdf",
		"echo x > uploads/c1/temparea/new",
		"mv uploads/c1 uploads/c2",
	} {
		if out, err := s.Sandbox(ctx, script); err == nil {
			t.Errorf("the sandbox could %q: %s", script, out)
		}
	}
	for _, cid := range []string{"", "../x", ".hidden", "a/b", strings.Repeat("c", 200)} {
		_, err := s.W.SaveUpload(ctx, cid, "f", strings.NewReader("x"), 0)
		wantErr(t, fmt.Sprintf("SaveUpload(cid %q)", cid), err, errdefs.ErrInvalidArgument)
	}
	_, err = s.W.SaveUpload(ctx, "c1", "../../x", strings.NewReader("x"), 0)
	wantErr(t, "SaveUpload(../../x)", err, errdefs.ErrInvalidArgument)
	_, err = s.W.SaveUpload(ctx, "c1", "big", strings.NewReader("xx"), 1)
	wantErr(t, "SaveUpload over maxBytes", err, errdefs.ErrTooLarge)
	// The uploads are removed by their own calls only.
	wantErr(t, "Remove(an upload)", s.W.Remove(ctx, got.Path, false), errdefs.ErrInvalidArgument)
	if err := s.W.RemoveUpload(ctx, got.Path, false); err != nil {
		t.Errorf("RemoveUpload: %v", err)
	}
	s.W.SaveUpload(ctx, "c1", "b.txt", strings.NewReader("b"), 0)
	if err := s.W.RemoveConversation(ctx, "c1"); err != nil {
		t.Errorf("RemoveConversation: %v", err)
	}
	_, err = s.W.Stat(ctx, "uploads/c1")
	wantErr(t, "Stat of a removed conversation", err, errdefs.ErrNotFound)
	if err := s.W.RemoveConversation(ctx, "c9"); err != nil {
		t.Errorf("RemoveConversation of none: %v", err)
	}
	wantErr(t, "RemoveConversation(../x)", s.W.RemoveConversation(ctx, "../x"), errdefs.ErrInvalidArgument)
	// The sandbox renames uploads/ away and makes its own: a client's
	// write still cannot go to the renamed one by its new name.
	if _, err := s.W.SaveUpload(ctx, "c3", "f", strings.NewReader("f"), 0); err != nil {
		t.Fatal(err)
	}
	sandbox(t, s, "mv uploads theirs && mkdir uploads")
	_, err = s.W.Save(ctx, "theirs/c3/temparea/f", strings.NewReader("pwned"), 0)
	wantErr(t, "Save into the renamed uploads/", err, errdefs.ErrInvalidArgument)
}

func testResources(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	ctx := ctxOf(t)
	contents := map[string]string{sum("skill one"): "skill one", sum("data"): "data"}
	content := func(ctx context.Context, sha string) (io.ReadCloser, int64, error) {
		c, ok := contents[sha]
		if !ok {
			return nil, 0, errdefs.ErrNotFound
		}
		return io.NopCloser(strings.NewReader(c)), int64(len(c)), nil
	}
	want := []workspace.Resource{
		{Name: "skills/one.md", SHA256: sum("skill one"), Size: 9},
		{Name: "data.csv", SHA256: sum("data"), Size: 4},
		{Name: "missing.bin", SHA256: sum("none"), Size: 4},
	}
	want, err := workspace.CheckManifest(want)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.W.SyncResources(ctx, want, content)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Needed) != 1 || res.Needed[0].Name != "missing.bin" || len(res.Added) != 2 {
		t.Errorf("SyncResources = %+v", res)
	}
	if c := read(t, s.W, ".resources/skills/one.md"); c != "skill one" {
		t.Errorf("resource reads %q", c)
	}
	have, err := s.W.Resources(ctx)
	if err != nil || len(have) != 2 {
		t.Errorf("Resources = %+v, %v", have, err)
	}
	if out, err := s.Sandbox(ctx, "echo x > .resources/data.csv"); err == nil {
		t.Errorf("the sandbox could change a resource: %s", out)
	}
	// Content that does not match its hash is refused, and nothing of it
	// is put in place.
	contents[sum("none")] = "evil"
	if _, err := s.W.SyncResources(ctx, want, content); err == nil {
		t.Error("content that does not match its SHA-256 was placed")
	}
	_, err = s.W.Stat(ctx, ".resources/missing.bin")
	wantErr(t, "a resource whose content did not match", err, errdefs.ErrNotFound)
	res, err = s.W.SyncResources(ctx, want[:1], content)
	if err != nil || len(res.Removed) != 1 {
		t.Errorf("SyncResources to fewer = %+v, %v", res, err)
	}
}

func testUsage(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	ctx := ctxOf(t)
	b0, f0, err := s.W.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	save(t, s.W, "a", "12345")
	sandbox(t, s, "mkdir d && printf 123 > d/b && ln -s a l")
	b, f, err := s.W.Usage(ctx)
	if err != nil || b-b0 != 8 || f-f0 != 3 {
		t.Errorf("Usage = %d bytes %d files (from %d, %d), %v; want 8 more bytes, 3 more files", b, f, b0, f0, err)
	}
}

// tree is what a workspace holds, as the suite compares it.
func tree(t *testing.T, w workspace.Workspace) map[string]string {
	t.Helper()
	l, truncated, err := w.List(ctxOf(t), ".", true, 0)
	if err != nil || truncated {
		t.Fatalf("List: %v (truncated %v)", err, truncated)
	}
	out := map[string]string{}
	for _, e := range l {
		v := fmt.Sprintf("%s %o %s", e.Type, e.Mode, e.Owner)
		switch e.Type {
		case "file":
			v += " " + read(t, w, e.Path) + " " + e.ModTime.UTC().Format(time.RFC3339Nano) // to the nanosecond: a round trip keeps it
		case "symlink":
			st, err := w.Stat(ctxOf(t), e.Path)
			if err != nil {
				t.Fatal(err)
			}
			v += " -> " + st.Target
		}
		out[e.Path] = v
	}
	return out
}

func testExportImport(t *testing.T, fresh func(*testing.T) Subject) {
	a, b := fresh(t), fresh(t)
	ctx := ctxOf(t)
	save(t, a.W, "dir/a.txt", "hello")
	save(t, a.W, "big.bin", strings.Repeat("\x00\x01", 300_000))
	if _, err := a.W.SaveUpload(ctx, "c1", "up.pdf", strings.NewReader("pdf"), 0); err != nil {
		t.Fatal(err)
	}
	sandbox(t, a, "mkdir -p deep/er/est && echo x > deep/er/est/f && chmod 600 deep/er/est/f && chmod 700 deep && ln -s dir/a.txt link && ln -s /etc/passwd out && mkfifo fifo")
	save(t, b.W, "stale.txt", "goes")
	var buf bytes.Buffer
	if err := a.W.Export(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	if err := b.W.Import(ctx, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	want, got := tree(t, a.W), tree(t, b.W)
	delete(want, "fifo") // FIFOs are not kept
	for p, v := range want {
		if got[p] != v {
			t.Errorf("%s: imported %q, exported %q", p, got[p], v)
		}
	}
	for p, v := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: imported %q, which was not exported", p, v)
		}
	}
	// The imported uploads are still out of the sandbox's reach, and its
	// own files are still its own.
	if out, err := b.Sandbox(ctx, "echo x > uploads/c1/temparea/up.pdf"); err == nil {
		t.Errorf("the sandbox could change an imported upload: %s", out)
	}
	sandbox(t, b, "echo more >> deep/er/est/f")
	// An archive of an archive is the same tree.
	var buf2 bytes.Buffer
	if err := b.W.Export(ctx, &buf2); err != nil {
		t.Fatal(err)
	}
	c := fresh(t)
	if err := c.W.Import(ctx, &buf2); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, c.W); got["deep/er/est/f"] == "" || got["link"] != want["link"] {
		t.Errorf("re-imported tree: %v", got)
	}
}

// testExportOrder: an archive lists a directory's entries by name, right
// after the directory (the order of a snapshot's manifest, which a
// snapshot saved from an archive depends on), whatever order the file
// system lists them in.
func testExportOrder(t *testing.T, fresh func(*testing.T) Subject) {
	s := fresh(t)
	ctx := ctxOf(t)
	sandbox(t, s, "mkdir -p a/b a-b && for i in $(seq 100 160); do echo $i > f$i; echo $i > a/g$i; done && echo x > a/b/c && echo y > a-b/d && echo z > a.txt")
	var buf bytes.Buffer
	if err := s.W.Export(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	var last string
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := strings.TrimSuffix(h.Name, "/")
		if n > 0 && !pathBefore(last, p) {
			t.Fatalf("entry %d, %q, comes after %q", n, p, last)
		}
		last = p
	}
}

// pathBefore orders paths component by component ("a", "a/b", "a-b").
func pathBefore(a, b string) bool {
	return slices.Compare(strings.Split(a, "/"), strings.Split(b, "/")) < 0
}

// testHostileArchives: an archive is input. None of these may write
// outside the workspace or leave a link followed; each is refused.
func testHostileArchives(t *testing.T, fresh func(*testing.T) Subject) {
	type entry struct {
		name, link string
		typ        byte
		body       string
	}
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{"dot-dot", []entry{{name: "../escape", typ: tar.TypeReg, body: "x"}}},
		{"absolute", []entry{{name: "/tmp/escape", typ: tar.TypeReg, body: "x"}}},
		{"through its own link", []entry{{name: "l", link: "/tmp", typ: tar.TypeSymlink}, {name: "l/escape", typ: tar.TypeReg, body: "x"}}},
		{"through its own link to a dir inside", []entry{{name: "d/", typ: tar.TypeDir}, {name: "l", link: "d", typ: tar.TypeSymlink}, {name: "l/f", typ: tar.TypeReg, body: "x"}}},
		{"hard link", []entry{{name: "h", link: "/etc/passwd", typ: tar.TypeLink}}},
		{"device", []entry{{name: "dev", typ: tar.TypeChar}}},
		{"fifo", []entry{{name: "p", typ: tar.TypeFifo}}},
		{"overlong link", []entry{{name: "l", link: strings.Repeat("a/", 3000), typ: tar.TypeSymlink}}},
		{"control character", []entry{{name: "a\x01b", typ: tar.TypeReg, body: "x"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fresh(t)
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, e := range tc.entries {
				h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)), Uid: 1000, Gid: 1000, Format: tar.FormatPAX}
				if e.typ != tar.TypeReg {
					h.Size = 0
				}
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
				io.WriteString(tw, e.body)
			}
			tw.Close()
			err := s.W.Import(ctxOf(t), &buf)
			if err == nil {
				t.Fatalf("Import of %s succeeded", tc.name)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Import of %s: %v, want ErrInvalidArgument", tc.name, err)
			}
			if out, _ := s.Sandbox(ctxOf(t), "ls /tmp/escape 2>/dev/null; true"); out != "" {
				t.Errorf("Import of %s wrote outside: %q", tc.name, out)
			}
		})
	}
	t.Run("not an archive", func(t *testing.T) {
		s := fresh(t)
		err := s.W.Import(ctxOf(t), strings.NewReader(strings.Repeat("garbage!", 200)))
		wantErr(t, "Import of garbage", err, errdefs.ErrInvalidArgument)
	})
	t.Run("cut short", func(t *testing.T) {
		s := fresh(t)
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 1000, Mode: 0o644})
		tw.Write(make([]byte, 100))
		err := s.W.Import(ctxOf(t), bytes.NewReader(buf.Bytes()[:buf.Len()]))
		if err == nil {
			t.Error("Import of a cut archive succeeded")
		}
	})
}
