package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// startServer runs a real server without sandboxes (every call but an
// execution works) until the test ends.
func startServer(t *testing.T) *httptest.Server {
	t.Helper()
	dir := t.TempDir()
	a, err := app.Open(context.Background(), app.Config{
		DataDir: dir, StateDir: filepath.Join(dir, "state"), TemplateDir: filepath.Join(dir, "templates"),
		WorkspaceQuota: "off", // no sandboxes: nothing to hold to a quota
		Runtime:        func(string) (runtime.Runtime, error) { return nil, errdefs.ErrUnavailable },
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(a.Server.Handler())
	t.Cleanup(func() {
		ts.Close()
		a.Close()
	})
	return ts
}

// `sbx session resources ID DIR` against a real server (no sandboxes).
func TestSessionResources(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t)
	if _, _, err := client.New(ts.URL).CreateSession(context.Background(), api.CreateSessionRequest{SessionID: "s"}); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "skills")
	os.MkdirAll(filepath.Join(src, "pdf"), 0o755)
	os.WriteFile(filepath.Join(src, "pdf", "SKILL.md"), []byte("pdf"), 0o644)
	os.WriteFile(filepath.Join(src, "README"), []byte("readme"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))

	sync := func() client.ResourceSyncResult {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{"session", "resources", "--server", ts.URL, "s", src}, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		var out struct {
			client.ResourceSyncResult
			api.ResourceSync
		}
		if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
			t.Fatalf("%v: %s", err, stdout.String())
		}
		out.ResourceSyncResult.ResourceSync = &out.ResourceSync
		return out.ResourceSyncResult
	}
	if got := sync(); len(got.Uploaded) != 2 || len(got.Added) != 2 || !got.Complete {
		t.Fatalf("first sync: %+v %+v", got, got.ResourceSync)
	}
	os.WriteFile(filepath.Join(src, "README"), []byte("readme v2"), 0o644)
	if got := sync(); len(got.Uploaded) != 1 || got.Uploaded[0] != "README" || got.Unchanged != 1 {
		t.Fatalf("second sync: %+v %+v", got, got.ResourceSync)
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"session", "resources", "--server", ts.URL, "s"}, &stdout, &stderr); code != 0 {
		t.Fatalf("list: exit %d: %s", code, stderr.String())
	}
	var list api.ResourceList
	if json.Unmarshal(stdout.Bytes(), &list); len(list.Resources) != 2 || list.Resources[0].Name != "README" {
		t.Fatalf("list: %s", stdout.String())
	}
}
