package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestResourceSync(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	for _, id := range []string{"r1", "r2"} {
		if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id}); err != nil {
			t.Fatal(err)
		}
	}
	skills := map[string][]byte{
		"skills/pdf/SKILL.md":  []byte("# Reading PDFs\nUse pdftotext.\n"),
		"skills/xlsx/SKILL.md": []byte("# Spreadsheets\nUse openpyxl.\n"),
		"commands/review.md":   []byte("Review the diff.\n"),
	}
	first, err := c.SyncResources(ctx, "r1", skills)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Complete || len(first.Uploaded) != 3 || len(first.Added) != 3 || first.Requests != 5 || first.Path != "/workspace/.resources" {
		t.Fatalf("first sync: %+v %+v", first, first.ResourceSync)
	}
	ws := filepath.Join(ts.dir, "workspaces", "default", "r1", ".resources")
	if b, err := os.ReadFile(filepath.Join(ws, "skills/pdf/SKILL.md")); err != nil || string(b) != string(skills["skills/pdf/SKILL.md"]) {
		t.Fatalf("resource in the workspace: %q %v", b, err)
	}

	// Unchanged: one request, nothing sent.
	again, err := c.SyncResources(ctx, "r1", skills)
	if err != nil || again.Requests != 1 || len(again.Uploaded) != 0 || again.Unchanged != 3 || !again.Complete {
		t.Fatalf("unchanged sync: %v %+v", err, again)
	}

	// A changed skill travels alone; a removed one goes.
	skills["skills/pdf/SKILL.md"] = []byte("# Reading PDFs\nUse pdftotext -layout.\n")
	delete(skills, "commands/review.md")
	changed, err := c.SyncResources(ctx, "r1", skills)
	if err != nil || !slices.Equal(changed.Uploaded, []string{"skills/pdf/SKILL.md"}) ||
		!slices.Equal(changed.Changed, []string{"skills/pdf/SKILL.md"}) || !slices.Equal(changed.Removed, []string{"commands/review.md"}) || changed.Unchanged != 1 {
		t.Fatalf("changed sync: %v %+v %+v", err, changed, changed.ResourceSync)
	}
	if _, err := os.Stat(filepath.Join(ws, "commands")); !os.IsNotExist(err) {
		t.Fatalf("removed resource's directory: %v", err)
	}
	list, err := c.ListResources(ctx, "r1")
	if err != nil || len(list.Resources) != 2 || list.Resources[0].Name != "skills/pdf/SKILL.md" {
		t.Fatalf("list: %v %+v", err, list)
	}

	// Another session with the same skills sends no content, and the
	// content is in the blob store once: an object per content, a chunk
	// per object (each is under 4 MiB).
	other, err := c.SyncResources(ctx, "r2", skills)
	if err != nil || len(other.Uploaded) != 0 || len(other.Added) != 2 || other.Requests != 1 {
		t.Fatalf("second session: %v %+v", err, other)
	}
	count := func(dir string) int {
		n := 0
		filepath.WalkDir(filepath.Join(ts.dir, "blobs", "snapshots", dir), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				n++
			}
			return nil
		})
		return n
	}
	// Both versions of the pdf skill, the xlsx one, the removed command.
	if objs, chunks := count("manifests/default/_objects"), count("tenants/default/chunks"); objs != 4 || chunks != 4 {
		t.Fatalf("%d objects and %d chunks in the blob store, want 4 and 4", objs, chunks)
	}
	if _, err := os.Stat(filepath.Join(ts.dir, "resources")); !os.IsNotExist(err) {
		t.Errorf("content on the local disk: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(ts.dir, "workspaces", "default", "r2", ".resources", "skills/xlsx/SKILL.md")); err != nil || string(b) != string(skills["skills/xlsx/SKILL.md"]) {
		t.Fatalf("the second session's copy: %q %v", b, err)
	}

	// Only resource sync changes them: the file endpoints refuse.
	if _, err := c.Upload(ctx, "r1", client.UploadOptions{Path: ".resources/skills/pdf/SKILL.md"}, client.UploadFile{Name: "f", Reader: strings.NewReader("x")}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("an upload over a resource: %v, want invalid argument", err)
	}
	for _, p := range []string{".resources", ".resources/skills/pdf/SKILL.md"} {
		if err := c.DeleteFile(ctx, "r1", p, true); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("delete %s: %v, want invalid argument", p, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ws, "skills/pdf/SKILL.md")); err != nil || string(b) != string(skills["skills/pdf/SKILL.md"]) {
		t.Errorf("the resource after refused writes: %q %v", b, err)
	}
}

func TestResourceSyncErrors(t *testing.T) {
	ts := start(t, "key-one-1:t1", "key-two-2:t2")
	c1, c2 := ts.client("key-one-1"), ts.client("key-two-2")
	ctx := context.Background()
	c1.CreateSession(ctx, api.CreateSessionRequest{SessionID: "s"})
	c2.CreateSession(ctx, api.CreateSessionRequest{SessionID: "s"})
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

	for _, tc := range []struct {
		what, method, path, body, ctype string
		status                          int
	}{
		{"wrong hash", "PUT", "/api/v1/resources/" + sum("a"), "b", "application/octet-stream", 400},
		{"not a hash", "PUT", "/api/v1/resources/xyz", "b", "application/octet-stream", 400},
		{"upper-case hash", "PUT", "/api/v1/resources/" + strings.ToUpper(sum("a")), "a", "application/octet-stream", 400},
		{"traversal", "PUT", "/api/v1/sessions/s/resources", `{"resources":[{"name":"../x","sha256":"` + sum("a") + `","size":1}]}`, "application/json", 400},
		{"own name", "PUT", "/api/v1/sessions/s/resources", `{"resources":[{"name":".sbx-manifest.json","sha256":"` + sum("a") + `","size":1}]}`, "application/json", 400},
		{"twice", "PUT", "/api/v1/sessions/s/resources", `{"resources":[{"name":"a","sha256":"` + sum("a") + `","size":1},{"name":"a","sha256":"` + sum("a") + `","size":1}]}`, "application/json", 400},
		{"unknown field", "PUT", "/api/v1/sessions/s/resources", `{"resources":[],"x":1}`, "application/json", 400},
		{"no session", "PUT", "/api/v1/sessions/nope/resources", `{"resources":[]}`, "application/json", 404},
	} {
		resp, b := ts.do(t, tc.method, tc.path, tc.ctype, strings.NewReader(tc.body), "Authorization", "Bearer key-one-1")
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.what, resp.StatusCode, b, tc.status)
		}
	}
	// New content is 201, content stored already 200; content over the
	// limit 413.
	for i, want := range []int{201, 200} {
		resp, b := ts.do(t, "PUT", "/api/v1/resources/"+sum("fresh"), "application/octet-stream", strings.NewReader("fresh"), "Authorization", "Bearer key-one-1")
		if resp.StatusCode != want {
			t.Errorf("put %d: %d %s, want %d", i+1, resp.StatusCode, b, want)
		}
	}
	zeros := io.LimitReader(zeroReader{}, 256<<20+1)
	if resp, b := ts.do(t, "PUT", "/api/v1/resources/"+sum("x"), "application/octet-stream", zeros, "Authorization", "Bearer key-one-1"); resp.StatusCode != 413 {
		t.Errorf("content over the limit, streamed: %d %s", resp.StatusCode, b)
	}
	// Content is per tenant: t2 cannot use, or learn of, what t1 sent.
	if err := c1.PutContent(ctx, []byte("secret skill")); err != nil {
		t.Fatal(err)
	}
	res, err := c2.SyncResources(ctx, "s", map[string][]byte{"x": []byte("secret skill")})
	if err != nil || !slices.Equal(res.Uploaded, []string{"x"}) {
		t.Fatalf("t2's sync: %v %+v", err, res)
	}
	// A manifest whose size lies about the content is refused.
	resp, b := ts.do(t, "PUT", "/api/v1/sessions/s/resources", "application/json",
		strings.NewReader(`{"resources":[{"name":"x","sha256":"`+sum("secret skill")+`","size":3}]}`), "Authorization", "Bearer key-one-1")
	if resp.StatusCode != 400 {
		t.Errorf("size mismatch: %d %s", resp.StatusCode, b)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// One session's resource sync that hangs (here: its content's manifest
// in the blob store is a FIFO nobody writes to) holds up no other
// session's: not another tenant's, of which there are more sessions than
// a lock shared by several sessions could keep apart, nor another of its
// own tenant's. Once the content comes, the hung sync ends as usual.
func TestResourceSyncLockPerSession(t *testing.T) {
	ts := start(t, "key-alpha-1:alpha", "key-beta-2:beta")
	ca, cb := ts.client("key-alpha-1"), ts.client("key-beta-2")
	ctx := context.Background()
	for _, id := range []string{"slow", "quick"} {
		if _, _, err := ca.CreateSession(ctx, api.CreateSessionRequest{SessionID: id}); err != nil {
			t.Fatal(err)
		}
	}
	content := []byte("# A skill whose content hangs\n")
	if err := ca.PutContent(ctx, content); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(content)
	sum := hex.EncodeToString(h[:])
	manifests, _ := filepath.Glob(filepath.Join(ts.dir, "blobs", "snapshots", "manifests", "*", "_objects", sum))
	if len(manifests) != 1 {
		t.Fatalf("the content's manifest in the blob store: %v", manifests)
	}
	saved, err := os.ReadFile(manifests[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(manifests[0]); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(manifests[0], 0o600); err != nil {
		t.Fatal(err)
	}
	hung := make(chan error, 1)
	go func() {
		_, err := ca.SyncResources(ctx, "slow", map[string][]byte{"skills/slow/SKILL.md": content})
		hung <- err
	}()
	// Opening the FIFO for writing returns once the server has opened it
	// for reading: the sync of "slow" is then inside its lock, and stays
	// there until the manifest is written.
	fifo, err := os.OpenFile(manifests[0], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fifo.Close()

	// Every other session syncs meanwhile. 65 of another tenant's: with
	// 64 locks shared between sessions one of them would wait on "slow"'s.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // a deadlock's bound, not a measurement
	defer cancel()
	other := map[string][]byte{"skills/other/SKILL.md": []byte("# Another skill\n")}
	if err := cb.PutContent(wctx, other["skills/other/SKILL.md"]); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 66)
	var wg sync.WaitGroup
	for i := range 65 {
		id := fmt.Sprintf("b%02d", i)
		if _, _, err := cb.CreateSession(wctx, api.CreateSessionRequest{SessionID: id}); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := cb.SyncResources(wctx, id, other)
			if err == nil && !res.Complete {
				err = fmt.Errorf("session %s: incomplete: %+v", id, res)
			}
			errs <- err
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := ca.SyncResources(wctx, "quick", other)
		errs <- err
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a sync while another session's hung: %v", err)
		}
	}
	select {
	case err := <-hung:
		t.Fatalf("the hung sync ended before its content came: %v", err)
	default:
	}

	if _, err := fifo.Write(saved); err != nil {
		t.Fatal(err)
	}
	fifo.Close()
	if err := <-hung; err != nil {
		t.Fatalf("the hung sync, once its content came: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(ts.dir, "workspaces", "alpha", "slow", ".resources", "skills", "slow", "SKILL.md")); err != nil || string(b) != string(content) {
		t.Fatalf("the hung sync's resource: %q %v", b, err)
	}
}
