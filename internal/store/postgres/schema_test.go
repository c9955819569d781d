package postgres

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sbx-sandbox/sbx/internal/testenv/pgtest"
)

// TestMigrateOnce runs migrations that would show being applied twice (an
// INSERT counts each run) from many pools at once, then a failing one.
func TestMigrateOnce(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	list := []string{
		`CREATE TABLE runs (version int NOT NULL); INSERT INTO runs VALUES (1)`,
		`INSERT INTO runs VALUES (2)`,
		`INSERT INTO runs VALUES (3)`,
	}
	const n = 8
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make([]error, n)
	)
	for i := range n {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		wg.Go(func() {
			<-start
			errs[i] = migrate(ctx, pool, list)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("migrate %d: %v", i, err)
		}
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	count := func(q string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := count(`SELECT count(*) FROM runs`); got != 3 {
		t.Errorf("the migrations ran %d times in all, want 3 (once each)", got)
	}
	if got := count(`SELECT count(DISTINCT version) FROM schema_migrations WHERE version BETWEEN 1 AND 3`); got != 3 {
		t.Errorf("schema_migrations has %d of versions 1..3", got)
	}

	// Each migration is a transaction of its own: a failing one leaves
	// those before it applied, and nothing of itself.
	list = append(list, `INSERT INTO runs VALUES (4)`, `INSERT INTO runs VALUES (5); SELECT 1/0`)
	if err := migrate(ctx, pool, list); err == nil {
		t.Fatal("a failing migration succeeded")
	}
	if got := count(`SELECT max(version) FROM schema_migrations`); got != 4 {
		t.Errorf("after a failing version 5 the schema is at version %d, want 4", got)
	}
	if got := count(`SELECT count(*) FROM runs`); got != 4 {
		t.Errorf("runs has %d rows after a failing version 5, want 4", got)
	}
}

// TestMigrateRevision: sessions a database held before revisions come out
// of the migration at revision 1, and can be updated from there.
func TestMigrateRevision(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migrate(ctx, pool, migrations[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO sessions (tenant, id, status, template_id, sandbox_id, error_message, metadata, created_at, disk_mb)
		VALUES ('t', 's', 'running', 'python', '', '', '{}', now(), 0)`); err != nil {
		t.Fatal(err)
	}

	s, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sess, err := s.GetSession(ctx, "t", "s")
	if err != nil || sess.Revision != 1 {
		t.Fatalf("a session from before revisions = %+v, %v; want revision 1", sess, err)
	}
	if err := s.UpdateSession(ctx, sess); err != nil || sess.Revision != 2 {
		t.Errorf("updating it = %v, revision %d; want nil, 2", err, sess.Revision)
	}
}

// TestMigrateRecordBytes: executions a database held before records had
// a size come out of the migration counted at the size of their request
// and result, so a tenant's history bound holds for them too.
func TestMigrateRecordBytes(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migrate(ctx, pool, migrations[:5]); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO executions (id, tenant, session_id, status, language, conversation_id, context_id, request, result, created_at)
		VALUES ('x', 't', 's', 'completed', 'python', '', '', '{"code":"1"}', '{"stdout":"é"}', now())`); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// 12 bytes of request, 15 of result (é is two).
	if n, kept, err := s.TrimTenantExecutions(ctx, "t", 1000); err != nil || n != 0 || kept != 27 {
		t.Errorf("an execution from before sizes: %d removed, %d kept, %v; want 27 bytes", n, kept, err)
	}
}
