package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
)

// TestMigrateRevision: sessions a file held before revisions come out of
// the migration at revision 1, and can be updated from there.
func TestMigrateRevision(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sbx.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range migrations[:3] {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	_, err = db.ExecContext(ctx, `INSERT INTO sessions (tenant, id, status, template_id, sandbox_id, error_message, metadata, created_at)
		VALUES ('t', 's', 'running', 'python', '', '', '{}', 1)`)
	if err == nil {
		_, err = db.ExecContext(ctx, `PRAGMA user_version = 3`)
	}
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	s, err := Open(ctx, path)
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
	var v int
	if err := s.r.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil || v != len(migrations) {
		t.Errorf("user_version = %d, %v; want %d", v, err, len(migrations))
	}
}

// TestMigrateRecordBytes: executions a file held before records had a
// size come out of the migration counted at the size of their request
// and result, so a tenant's history bound holds for them too.
func TestMigrateRecordBytes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sbx.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range migrations[:7] {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	_, err = db.ExecContext(ctx, `INSERT INTO executions (id, tenant, session_id, status, language, conversation_id, context_id, request, result, created_at)
		VALUES ('x', 't', 's', 'completed', 'python', '', '', CAST('{"code":"1"}' AS BLOB), CAST('{"stdout":"é"}' AS BLOB), 1)`)
	if err == nil {
		_, err = db.ExecContext(ctx, `PRAGMA user_version = 7`)
	}
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// 12 bytes of request, 15 of result (é is two).
	if n, kept, err := s.TrimTenantExecutions(ctx, "t", 1000); err != nil || n != 0 || kept != 27 {
		t.Errorf("an execution from before sizes: %d removed, %d kept, %v; want 27 bytes", n, kept, err)
	}
}
