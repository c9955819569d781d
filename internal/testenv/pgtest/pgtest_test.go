package pgtest_test

import (
	"context"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/internal/testenv/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.WithCluster(m)) }

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestURL: each call is a database of its own, empty, on a cluster that
// is this process's, tuned for tests and run by an unprivileged user.
func TestURL(t *testing.T) {
	ctx := context.Background()
	a, b := pgtest.URL(t), pgtest.URL(t)
	if a == b {
		t.Fatalf("two calls gave the same URL %s", a)
	}
	ca, cb := connect(t, a), connect(t, b)
	if _, err := ca.Exec(ctx, `CREATE TABLE t (x int)`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := cb.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the second database has %d tables, %v; want none", n, err)
	}
	for setting, want := range map[string]string{
		"fsync":              "off",
		"full_page_writes":   "off",
		"synchronous_commit": "off",
		"listen_addresses":   "127.0.0.1",
	} {
		var got string
		if err := ca.QueryRow(ctx, `SELECT current_setting($1)`, setting).Scan(&got); err != nil || got != want {
			t.Errorf("%s = %q, %v; want %q", setting, got, err, want)
		}
	}
	// From PostgreSQL 15 (ICU), the default collation is not byte order
	// (see start).
	var punctuationLast bool
	if err := ca.QueryRow(ctx, `SELECT current_setting('server_version_num')::int < 150000 OR 'a.txt' > 'a/b/c'`).Scan(&punctuationLast); err != nil || !punctuationLast {
		t.Errorf("'a.txt' > 'a/b/c' = %v, %v; want true, as in en_US", punctuationLast, err)
	}
	var sockets, dataDir string
	if err := ca.QueryRow(ctx, `SELECT current_setting('unix_socket_directories'), current_setting('data_directory')`).Scan(&sockets, &dataDir); err != nil {
		t.Fatal(err)
	}
	if sockets == "/var/run/postgresql" || sockets == "/tmp" {
		t.Errorf("unix_socket_directories = %s, want the cluster's own directory", sockets)
	}
	// PostgreSQL refuses root: as root, the cluster belongs to another user.
	fi, err := os.Stat(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid == 0 {
		t.Errorf("the data directory %s belongs to root", dataDir)
	}
}

// TestStart: a program that is not a test gets a cluster of its own, with
// fresh databases, and Stop removes it.
func TestStart(t *testing.T) {
	pgtest.Require(t)
	ctx := context.Background()
	c, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop()
		}
	}()
	a, err := c.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewDatabase()
	if err != nil || a == b {
		t.Fatalf("a second database: %s, %v; the first %s", b, err, a)
	}
	conn, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	var dataDir string
	err = conn.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dataDir)
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopped = true
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("after Stop, the data directory %s: %v", dataDir, err)
	}
}
