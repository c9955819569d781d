package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// PutUpload implements store.Store.
func (s *Store) PutUpload(ctx context.Context, u *store.Upload) error {
	if u == nil {
		return fmt.Errorf("upload: nil: %w", errdefs.ErrInvalidArgument)
	}
	if err := required("upload", "tenant", u.Tenant, "session id", u.SessionID, "path", u.Path); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO uploads (tenant, session_id, path, conversation_id, size, sha256, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (tenant, session_id, path) DO UPDATE SET conversation_id = excluded.conversation_id,
			size = excluded.size, sha256 = excluded.sha256, created_at = excluded.created_at`,
		u.Tenant, u.SessionID, u.Path, u.ConversationID, u.Size, u.SHA256, ts(u.CreatedAt))
	if err != nil {
		return dbErr(fmt.Sprintf("put upload %q", u.Path), err)
	}
	return nil
}

// DeleteUploads implements store.Store.
func (s *Store) DeleteUploads(ctx context.Context, tenant, sessionID, path string) error {
	q, args := `DELETE FROM uploads WHERE tenant = $1 AND session_id = $2`, []any{tenant, sessionID}
	if path != "" {
		// Under path/ is the range [path/, path0): '0' follows '/' in
		// byte order, the column's collation ("C"). Unlike LIKE it needs
		// no escaping of path and uses the primary key.
		q += ` AND (path = $3 OR (path >= $4 AND path < $5))`
		args = append(args, path, path+"/", path+"0")
	}
	if _, err := s.pool.Exec(ctx, q, args...); err != nil {
		return dbErr(fmt.Sprintf("delete uploads %q", path), err)
	}
	return nil
}

// CountUploads implements store.Store.
func (s *Store) CountUploads(ctx context.Context, tenant, sessionID string) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM uploads WHERE tenant = $1 AND session_id = $2`, tenant, sessionID).Scan(&n)
	if err != nil {
		return 0, dbErr("count uploads", err)
	}
	return n, nil
}

// ListUploads implements store.Store.
func (s *Store) ListUploads(ctx context.Context, tenant, sessionID, conversationID string) ([]*store.Upload, error) {
	rows, err := s.pool.Query(ctx, `SELECT tenant, session_id, path, conversation_id, size, sha256, created_at FROM uploads
		WHERE tenant = $1 AND session_id = $2 AND conversation_id = $3 ORDER BY path`, tenant, sessionID, conversationID)
	if err != nil {
		return nil, dbErr("list uploads", err)
	}
	defer rows.Close()
	var out []*store.Upload
	for rows.Next() {
		var u store.Upload
		var created pgtype.Timestamptz
		if err := rows.Scan(&u.Tenant, &u.SessionID, &u.Path, &u.ConversationID, &u.Size, &u.SHA256, &created); err != nil {
			return nil, dbErr("list uploads", err)
		}
		u.CreatedAt = fromTS(created)
		out = append(out, &u)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr("list uploads", err)
	}
	return out, nil
}

// DeleteConversationUploads implements store.Store.
func (s *Store) DeleteConversationUploads(ctx context.Context, tenant, sessionID, conversationID string) error {
	if conversationID == "" {
		return fmt.Errorf("delete conversation uploads: conversation id is required: %w", errdefs.ErrInvalidArgument)
	}
	_, err := s.pool.Exec(ctx, `DELETE FROM uploads WHERE tenant = $1 AND session_id = $2 AND conversation_id = $3`,
		tenant, sessionID, conversationID)
	if err != nil {
		return dbErr(fmt.Sprintf("delete uploads of conversation %q", conversationID), err)
	}
	return nil
}
