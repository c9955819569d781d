package files_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/files"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// fakeSessions stands for the session lifecycle: one session "t"/"s",
// its workspace a directory of the test, opened for each call. It counts
// the calls still open, which the policy must close.
type fakeSessions struct {
	dir    string
	owners workspace.Owners
	sess   *session.Session
	open   atomic.Int32
}

func (f *fakeSessions) OpenFiles(_ context.Context, tenant, id string) (*session.FileCall, error) {
	if tenant != f.sess.Tenant || id != f.sess.ID {
		return nil, fmt.Errorf("session %q: %w", id, errdefs.ErrNotFound)
	}
	ws, err := workspace.Open(f.dir, f.owners)
	if err != nil {
		return nil, err
	}
	f.open.Add(1)
	return &session.FileCall{Session: f.sess, Workspace: countedWorkspace{ws, &f.open}}, nil
}

// countedWorkspace uncounts its call when closed.
type countedWorkspace struct {
	workspace.Workspace
	open *atomic.Int32
}

func (w countedWorkspace) Close() error {
	w.open.Add(-1)
	return w.Workspace.Close()
}

type harness struct {
	svc      *files.Service
	sessions *fakeSessions
	st       store.Store
	uploads  *failingUploads
}

// failingUploads is the real store's upload records, whose PutUpload of
// a written file (one with a hash) fails while fail is set.
type failingUploads struct {
	files.Uploads
	fail atomic.Bool
}

func (u *failingUploads) PutUpload(ctx context.Context, up *store.Upload) error {
	if u.fail.Load() && up.SHA256 != "" {
		return fmt.Errorf("the store is down: %w", errdefs.ErrUnavailable)
	}
	return u.Uploads.PutUpload(ctx, up)
}

func newHarness(t *testing.T, upload session.UploadConfig) *harness {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	me := workspace.Owner{UID: os.Getuid(), GID: os.Getgid()}
	owners := workspace.Owners{Root: me, User: me}
	wsDir := filepath.Join(dir, "ws")
	ws, err := workspace.Create(wsDir, owners)
	if err != nil {
		t.Fatal(err)
	}
	ws.Close()
	if upload.MaxFileSize == 0 {
		upload.MaxFileSize, upload.MaxFileSizeUnit = 1, "KB"
	}
	sess := &session.Session{Config: session.Config{Upload: upload}}
	sess.Tenant, sess.ID = "t", "s"
	h := &harness{sessions: &fakeSessions{dir: wsDir, owners: owners, sess: sess}, st: st, uploads: &failingUploads{Uploads: st}}
	h.svc = files.New(files.Options{Sessions: h.sessions, Uploads: h.uploads})
	t.Cleanup(func() {
		if n := h.sessions.open.Load(); n != 0 {
			t.Errorf("%d file calls left open", n)
		}
	})
	return h
}

// call runs fn in one file call.
func (h *harness) call(t *testing.T, fn func(c *files.Call) error) error {
	t.Helper()
	c, err := h.svc.Open(context.Background(), "t", "s")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return fn(c)
}

func (h *harness) write(t *testing.T, w files.FileWrite) error {
	t.Helper()
	return h.call(t, func(c *files.Call) error {
		_, err := c.Write(context.Background(), w)
		return err
	})
}

// recorded lists the paths of the session's upload records of one
// conversation ("" the session's own).
func (h *harness) recorded(t *testing.T, cid string) []string {
	t.Helper()
	ups, err := h.st.ListUploads(context.Background(), "t", "s", cid)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, u := range ups {
		out = append(out, u.Path)
	}
	return out
}

func (h *harness) exists(rel string) bool {
	_, err := os.Lstat(filepath.Join(h.sessions.dir, filepath.FromSlash(rel)))
	return err == nil
}

// max_file_count holds against writes that come at once, as a hostile
// client sends them: of many writes racing for the last slots, no more
// succeed than there are slots, and the records agree with the writes
// that succeeded.
// Replacing a recorded file takes no slot; a refused or failed write
// leaves no record behind.
func TestMaxFileCountUnderConcurrency(t *testing.T) {
	const limit = 3
	h := newHarness(t, session.UploadConfig{MaxFileCount: limit})
	ctx := context.Background()
	write := func(p string) error {
		c, err := h.svc.Open(ctx, "t", "s")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(ctx, files.FileWrite{Path: p, Body: strings.NewReader("x")})
		return err
	}
	for round := range 5 {
		var wg sync.WaitGroup
		errs := make([]error, 16)
		start := make(chan struct{})
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = write(fmt.Sprintf("r%d/f%d.txt", round, i))
			}()
		}
		close(start)
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, errdefs.ErrFailedPrecondition):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		n, err := h.st.CountUploads(ctx, "t", "s")
		if err != nil {
			t.Fatal(err)
		}
		if ok > limit || n != ok {
			t.Fatalf("round %d: %d writes succeeded and %d are recorded; max_file_count is %d", round, ok, n, limit)
		}
		// Free the slots for the next round. (Writes racing for the
		// slots may all have been refused: then there is nothing.)
		err = h.call(t, func(c *files.Call) error { return c.Remove(ctx, fmt.Sprintf("r%d", round), true) })
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatal(err)
		}
	}
	// At the limit, a recorded file may be replaced, and a new one not.
	for i := range limit {
		if err := write(fmt.Sprintf("keep%d.txt", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := write("keep0.txt"); err != nil {
		t.Fatalf("replacing a recorded file at the limit: %v", err)
	}
	if err := write("one-more.txt"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("one file past the limit: %v", err)
	}
	if n, err := h.st.CountUploads(ctx, "t", "s"); err != nil || n != limit {
		t.Fatalf("records after a refused write: %d, %v; want %d", n, err, limit)
	}
}

// A write the session's limits refuse, or that names no file or a
// hostile conversation id, stores nothing and records nothing, and each
// refusal carries the category its edge maps.
func TestWriteRefusals(t *testing.T) {
	h := newHarness(t, session.UploadConfig{MaxFileCount: 10, MaxFileSize: 1, MaxFileSizeUnit: "KB", AllowedFileTypes: []string{"csv", "image/*"}})
	for _, c := range []struct {
		name string
		w    files.FileWrite
		want error
		path string // what must not exist after
	}{
		{"too large", files.FileWrite{Path: "big.csv", Body: strings.NewReader(strings.Repeat("x", 1025))}, errdefs.ErrTooLarge, "big.csv"},
		{"type", files.FileWrite{Path: "run.sh", Body: strings.NewReader("x")}, errdefs.ErrUnsupportedType, "run.sh"},
		{"declared type", files.FileWrite{Path: "page.html", MediaType: "text/html", Body: strings.NewReader("x")}, errdefs.ErrUnsupportedType, "page.html"},
		{"no file", files.FileWrite{Path: "/", Body: strings.NewReader("x")}, errdefs.ErrInvalidArgument, ""},
		{"escape", files.FileWrite{Path: "../out.csv", Body: strings.NewReader("x")}, errdefs.ErrInvalidArgument, "../out.csv"},
		{"conversation escape", files.FileWrite{Path: "a.csv", ConversationID: "..", Body: strings.NewReader("x")}, errdefs.ErrInvalidArgument, "uploads/a.csv"},
		{"conversation slash", files.FileWrite{Path: "a.csv", ConversationID: "c/../../x", Body: strings.NewReader("x")}, errdefs.ErrInvalidArgument, "x/a.csv"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := h.write(t, c.w); !errors.Is(err, c.want) {
				t.Fatalf("%v, want %v", err, c.want)
			}
			if c.path != "" && h.exists(c.path) {
				t.Errorf("%s exists after a refused write", c.path)
			}
			if n, err := h.st.CountUploads(context.Background(), "t", "s"); err != nil || n != 0 {
				t.Errorf("%d records, %v: want none", n, err)
			}
		})
	}
	// What the limits allow goes through: by extension, by declared type.
	if err := h.write(t, files.FileWrite{Path: "ok.CSV", Body: strings.NewReader(strings.Repeat("x", 1024))}); err != nil {
		t.Fatalf("a file at max_file_size: %v", err)
	}
	if err := h.write(t, files.FileWrite{Path: "pic", MediaType: "image/png; q=1", Body: strings.NewReader("x")}); err != nil {
		t.Fatalf("a declared image: %v", err)
	}
	if got := h.recorded(t, ""); strings.Join(got, ",") != "ok.CSV,pic" {
		t.Errorf("records %q", got)
	}
}

// A write whose record cannot be written does not stay: the file and the
// slot it held go, so an outage of the store cannot be used to store
// files past max_file_count.
func TestWriteUndoneWhenRecordFails(t *testing.T) {
	h := newHarness(t, session.UploadConfig{MaxFileCount: 1})
	h.uploads.fail.Store(true)
	if err := h.write(t, files.FileWrite{Path: "a.txt", Body: strings.NewReader("x")}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("write while the store fails: %v", err)
	}
	if h.exists("a.txt") {
		t.Error("the file stayed without its record")
	}
	if n, err := h.st.CountUploads(context.Background(), "t", "s"); err != nil || n != 0 {
		t.Fatalf("%d records, %v: the held slot stayed", n, err)
	}
	h.uploads.fail.Store(false)
	if err := h.write(t, files.FileWrite{Path: "b.txt", Body: strings.NewReader("x")}); err != nil {
		t.Fatalf("the one slot after the failed write: %v", err)
	}
}

// A move takes its records along, so moving files does not free slots of
// max_file_count, and what it replaced loses its record. A remove drops
// the records at and below its path even when sandboxed code removed the
// files first, or the slots would never come back.
func TestMoveAndRemoveKeepRecords(t *testing.T) {
	h := newHarness(t, session.UploadConfig{MaxFileCount: 3})
	ctx := context.Background()
	for _, p := range []string{"d/a.txt", "d/b.txt", "c.txt"} {
		if err := h.write(t, files.FileWrite{Path: p, Body: strings.NewReader(p)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.call(t, func(c *files.Call) error { return c.Move(ctx, "d", "e") }); err != nil {
		t.Fatal(err)
	}
	if got := h.recorded(t, ""); strings.Join(got, ",") != "c.txt,e/a.txt,e/b.txt" {
		t.Fatalf("records after a move: %q", got)
	}
	if err := h.write(t, files.FileWrite{Path: "new.txt", Body: strings.NewReader("x")}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a move freed a slot: %v", err)
	}
	if err := h.call(t, func(c *files.Call) error { return c.Move(ctx, "c.txt", "e/a.txt") }); err != nil {
		t.Fatal(err)
	}
	if got := h.recorded(t, ""); strings.Join(got, ",") != "e/a.txt,e/b.txt" {
		t.Fatalf("records after a move over a recorded file: %q", got)
	}
	// Sandboxed code removes e/ itself; the call's remove finds nothing
	// but still frees the slots.
	if err := os.RemoveAll(filepath.Join(h.sessions.dir, "e")); err != nil {
		t.Fatal(err)
	}
	err := h.call(t, func(c *files.Call) error { return c.Remove(ctx, "e", true) })
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("removing what is gone: %v, want not found", err)
	}
	if got := h.recorded(t, ""); len(got) != 0 {
		t.Fatalf("records after the remove: %q", got)
	}
}

// A conversation's uploads land in its temp area, are counted with the
// session's, and go with RemoveConversation, records and all; another
// conversation's stay.
func TestConversationUploads(t *testing.T) {
	h := newHarness(t, session.UploadConfig{MaxFileCount: 2})
	ctx := context.Background()
	for _, cid := range []string{"c1", "c2"} {
		if err := h.write(t, files.FileWrite{Path: "in.txt", ConversationID: cid, Body: strings.NewReader(cid)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.write(t, files.FileWrite{Path: "x.txt", Body: strings.NewReader("x")}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a third file with two conversation uploads held: %v", err)
	}
	err := h.call(t, func(c *files.Call) error {
		f, err := c.Open(ctx, "uploads/c1/temparea/in.txt")
		if err != nil {
			return err
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err == nil && string(b) != "c1" {
			err = fmt.Errorf("read %q", b)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.call(t, func(c *files.Call) error { return c.RemoveConversation(ctx, "c1") }); err != nil {
		t.Fatal(err)
	}
	if h.exists("uploads/c1") || !h.exists("uploads/c2/temparea/in.txt") {
		t.Error("removing c1 did not remove c1's uploads alone")
	}
	if got1, got2 := h.recorded(t, "c1"), h.recorded(t, "c2"); len(got1) != 0 || len(got2) != 1 {
		t.Errorf("records after removing c1: %q and %q", got1, got2)
	}
	// An unknown session is the lifecycle's answer, passed on.
	if _, err := h.svc.Open(ctx, "t", "other"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("open of another session: %v", err)
	}
}
