package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/testenv"
	"github.com/sbx-sandbox/sbx/internal/testenv/miniotest"
	"github.com/sbx-sandbox/sbx/internal/testenv/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(miniotest.WithServer(testenv.WithCleanup(m))) }

func noRuntime(string) (runtime.Runtime, error) {
	return nil, fmt.Errorf("no runtime in these tests: %w", errdefs.ErrUnavailable)
}

func config(t *testing.T) app.Config {
	dir := t.TempDir()
	return app.Config{
		DataDir: dir, StateDir: filepath.Join(dir, "state"), Runtime: noRuntime,
		WorkspaceQuota: "off", Log: slog.New(slog.DiscardHandler),
	}
}

// Bad backend URLs fail Open with one line that names the flag and says
// what is wanted, and never repeat a password.
func TestBackendURLs(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		store, blob string
		want        string
	}{
		{store: "mysql://u:hunter2@h/db", want: "--store"},
		{store: "sqlite://relative/sbx.db", want: "absolute path"},
		{store: "sqlite:///tmp/x.db?mode=ro", want: "absolute path"},
		{store: "postgres://u:hunter2@127.0.0.1:1/db?sslmode=disable&connect_timeout=2", want: "--store postgres"},
		{store: "postgres://u:hunter2@[::1/db", want: "--store"},
		{blob: "ftp://u:hunter2@h/x", want: "--blob"},
		{blob: "file://blobs", want: "--blob"},
		{blob: "s3://bucket?endpoint=http://127.0.0.1:1&region=us-east-1", want: "--blob"},
	} {
		cfg := config(t)
		cfg.Store, cfg.Blob = tc.store, tc.blob
		a, err := app.Open(ctx, cfg)
		if err == nil {
			a.Close()
			t.Errorf("store %q blob %q: opened", tc.store, tc.blob)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.want) || strings.Contains(msg, "hunter2") || strings.Contains(msg, "\n") {
			t.Errorf("store %q blob %q: %q, want one line with %q and no password", tc.store, tc.blob, msg, tc.want)
		}
	}
}

// A server on PostgreSQL and S3 (MinIO) serves sessions and snapshots,
// and /readyz names the checks it made.
func TestOpenPostgresS3(t *testing.T) {
	cfg := config(t)
	cfg.Store = pgtest.URL(t)
	cfg.Blob = miniotest.New(t).URL
	a, err := app.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ts := httptest.NewServer(a.Server.Handler())
	defer ts.Close()
	c := client.New(ts.URL)
	ctx := context.Background()
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "on-pg"}); err != nil {
		t.Fatal(err)
	}
	s, err := c.GetSession(ctx, "on-pg")
	if err != nil || s.SessionID != "on-pg" {
		t.Fatalf("get: %+v %v", s, err)
	}
	snap, err := c.CreateSnapshot(ctx, "on-pg")
	if err != nil {
		t.Fatal(err)
	}
	if snaps, err := c.ListSnapshots(ctx, "on-pg"); err != nil || len(snaps) != 1 || snaps[0].SnapshotID != snap.SnapshotID {
		t.Errorf("snapshots in S3: %+v %v", snaps, err)
	}
	resp, err := http.Get(ts.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h api.Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	// No runtime here: unavailable, but the store and blob store answer.
	if h.Checks["store"] != "ok" || h.Checks["blob"] != "ok" || h.Checks["runtime"] == "ok" {
		t.Errorf("readyz: %d %+v", resp.StatusCode, h)
	}
}

// A store that stops answering shows in /readyz.
func TestReadyzStore(t *testing.T) {
	a, err := app.Open(context.Background(), config(t))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.Store.Close()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/readyz", nil)
	req.Host = "127.0.0.1"
	a.Server.Handler().ServeHTTP(rec, req)
	var h api.Health
	json.Unmarshal(rec.Body.Bytes(), &h)
	if rec.Code != 503 || h.Checks["store"] == "ok" || h.Checks["blob"] != "ok" {
		t.Errorf("readyz with a closed store: %d %s", rec.Code, rec.Body)
	}
}

// Resource content is in the blob store, not on one server's disk: what
// a client sends to one server, another sharing only the blob store
// places in its own session's workspace without asking for it again.
func TestResourceContentInTheBlobStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		blob func(t *testing.T) string
	}{
		{"fs", func(t *testing.T) string { return "file://" + t.TempDir() }},
		{"s3", func(t *testing.T) string { return miniotest.New(t).URL }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			blobURL := tc.blob(t)
			var clients []*client.Client
			for range 2 {
				cfg := config(t) // each its own data directory and SQLite store
				cfg.Blob = blobURL
				a, err := app.Open(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(a.Close)
				ts := httptest.NewServer(a.Server.Handler())
				t.Cleanup(ts.Close)
				clients = append(clients, client.New(ts.URL))
			}
			skills := map[string][]byte{"skills/a/SKILL.md": []byte("# a\n"), "skills/b/SKILL.md": []byte("# b\n")}
			for i, c := range clients {
				if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "s"}); err != nil {
					t.Fatal(err)
				}
				res, err := c.SyncResources(ctx, "s", skills)
				if err != nil || !res.Complete || len(res.Added) != 2 {
					t.Fatalf("server %d: %v %+v", i, err, res)
				}
				if uploaded := len(res.Uploaded); uploaded != 2-2*i {
					t.Errorf("server %d uploaded %d resources, want %d", i, uploaded, 2-2*i)
				}
			}
		})
	}
}
