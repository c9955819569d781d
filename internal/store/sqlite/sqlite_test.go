package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
	"github.com/sbx-sandbox/sbx/internal/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func open(t testing.TB) *sqlite.Store {
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
}

func TestReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sbx.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSession(ctx, &store.Session{Tenant: "t", ID: "s", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("database file mode = %v, %v; want 0600", fi.Mode(), err)
	}

	s, err = sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	if _, err := s.GetSession(ctx, "t", "s"); err != nil {
		t.Errorf("after reopening: %v", err)
	}
	s.Close()

	// A file from a newer binary is refused rather than misread.
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(`PRAGMA user_version = 1000`)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s, err := sqlite.Open(ctx, path); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		if s != nil {
			s.Close()
		}
		t.Errorf("opening a newer schema = %v, want ErrFailedPrecondition", err)
	}
}

func TestOpenBadPath(t *testing.T) {
	for _, p := range []string{"", "a?b", filepath.Join(t.TempDir(), "no", "such", "dir", "sbx.db")} {
		if s, err := sqlite.Open(context.Background(), p); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", p)
		}
	}
}

// TestAfterClose: calls on a closed store fail rather than hang or panic.
func TestAfterClose(t *testing.T) {
	s := open(t)
	s.Close()
	if _, err := s.GetSession(context.Background(), "t", "s"); err == nil {
		t.Error("GetSession after Close succeeded")
	}
	if err := s.CreateSession(context.Background(), &store.Session{Tenant: "t", ID: "s", CreatedAt: time.Now()}); err == nil {
		t.Error("CreateSession after Close succeeded")
	}
}
