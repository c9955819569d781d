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
