package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

const sessionColumns = `tenant, id, status, template_id, sandbox_id, error_message, metadata, config,
	created_at, updated_at, last_activity_at, expires_at, due_at, disk_mb, revision`

// CreateSession implements store.Store.
func (s *Store) CreateSession(ctx context.Context, sess *store.Session) error {
	args, err := sessionArgs(sess)
	if err != nil {
		return err
	}
	err = s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO sessions (`+sessionColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)`, args...)
		if isDuplicate(err) {
			return fmt.Errorf("session %q: %w", sess.ID, errdefs.ErrAlreadyExists)
		}
		if err != nil {
			return err
		}
		return putMetadata(ctx, tx, sess)
	})
	if err != nil {
		if !errors.Is(err, errdefs.ErrAlreadyExists) {
			err = dbErr(fmt.Sprintf("create session %q", sess.ID), err)
		}
		return err
	}
	sess.Revision = 1
	return nil
}

// GetSession implements store.Store.
func (s *Store) GetSession(ctx context.Context, tenant, id string) (*store.Session, error) {
	row := s.r.QueryRowContext(ctx, `SELECT `+sessionColumns+` FROM sessions WHERE tenant = ? AND id = ?`, tenant, id)
	sess, err := scanSession(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("session %q: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, dbErr(fmt.Sprintf("get session %q", id), err)
	}
	return sess, nil
}

// UpdateSession implements store.Store.
func (s *Store) UpdateSession(ctx context.Context, sess *store.Session) error {
	args, err := sessionArgs(sess)
	if err != nil {
		return err
	}
	// The key and the revision read go last, for the WHERE.
	args = append(args[2:], sess.Tenant, sess.ID, sess.Revision)
	err = s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE sessions SET status = ?, template_id = ?, sandbox_id = ?, error_message = ?,
			metadata = ?, config = ?, created_at = ?, updated_at = ?, last_activity_at = ?, expires_at = ?, due_at = ?, disk_mb = ?,
			revision = revision + 1
			WHERE tenant = ? AND id = ? AND revision = ?`, args...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return missOrConflict(ctx, tx, sess)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM session_metadata WHERE tenant = ? AND session_id = ?`, sess.Tenant, sess.ID); err != nil {
			return err
		}
		return putMetadata(ctx, tx, sess)
	})
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrConflict) {
			err = dbErr(fmt.Sprintf("update session %q", sess.ID), err)
		}
		return err
	}
	sess.Revision++
	return nil
}

// missOrConflict says why an update of sess changed no row: the session
// is absent, or at another revision than the one sess was read at.
func missOrConflict(ctx context.Context, tx *sql.Tx, sess *store.Session) error {
	var rev int64
	err := tx.QueryRowContext(ctx, `SELECT revision FROM sessions WHERE tenant = ? AND id = ?`, sess.Tenant, sess.ID).Scan(&rev)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("session %q: %w", sess.ID, errdefs.ErrNotFound)
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("session %q: read at revision %d, now at %d: %w", sess.ID, sess.Revision, rev, errdefs.ErrConflict)
}

// DeleteSession implements store.Store.
func (s *Store) DeleteSession(ctx context.Context, tenant, id string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		for _, q := range []string{
			`DELETE FROM sessions WHERE tenant = ? AND id = ?`,
			`DELETE FROM session_metadata WHERE tenant = ? AND session_id = ?`,
			`DELETE FROM executions WHERE tenant = ? AND session_id = ?`,
			`DELETE FROM uploads WHERE tenant = ? AND session_id = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, tenant, id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return dbErr(fmt.Sprintf("delete session %q", id), err)
	}
	return nil
}

// ListSessions implements store.Store.
func (s *Store) ListSessions(ctx context.Context, f store.SessionFilter) ([]*store.Session, string, error) {
	if f.Tenant == "" {
		return nil, "", fmt.Errorf("list sessions: tenant is required: %w", errdefs.ErrInvalidArgument)
	}
	limit, err := store.PageSize(f.Limit)
	if err != nil {
		return nil, "", err
	}
	var q strings.Builder
	var args []any
	if len(f.Metadata) == 0 {
		q.WriteString(`SELECT ` + sessionColumns + ` FROM sessions WHERE tenant = ?`)
		args = append(args, f.Tenant)
	} else {
		// The first pair's index yields its sessions in page order (it
		// holds created_at), and CROSS JOIN makes SQLite start from it:
		// left to itself it walks all the tenant's sessions and tests each,
		// 10,000 row lookups for a filter that matches ten. The other
		// pairs are tested per session.
		keys := slices.Sorted(maps.Keys(f.Metadata)) // one filter, one statement
		q.WriteString(`SELECT ` + prefixed("s.", sessionColumns) + ` FROM session_metadata AS m
			CROSS JOIN sessions AS s ON s.tenant = m.tenant AND s.id = m.session_id
			WHERE m.tenant = ? AND m.key = ? AND m.value = ?`)
		args = append(args, f.Tenant, keys[0], f.Metadata[keys[0]])
		for _, k := range keys[1:] {
			q.WriteString(` AND EXISTS (SELECT 1 FROM session_metadata AS o
				WHERE o.tenant = m.tenant AND o.session_id = m.session_id AND o.key = ? AND o.value = ?)`)
			args = append(args, k, f.Metadata[k])
		}
	}
	if f.Status != "" {
		q.WriteString(` AND status = ?`)
		args = append(args, f.Status)
	}
	// The keyset position and the order name the columns of the table
	// the query walks, so that SQLite sees the walk is already in order.
	at, id := "created_at", "id"
	if len(f.Metadata) > 0 {
		at, id = "m.created_at", "m.session_id"
	}
	if f.PageToken != "" {
		t, pid, err := store.DecodePageToken(f.PageToken)
		if err != nil {
			return nil, "", err
		}
		q.WriteString(` AND (` + at + `, ` + id + `) < (?, ?)`)
		args = append(args, t.UnixMicro(), pid)
	}
	// One more than a page tells whether there is a next one.
	q.WriteString(` ORDER BY ` + at + ` DESC, ` + id + ` DESC LIMIT ?`)
	args = append(args, limit+1)

	out, err := s.querySessions(ctx, "list sessions", q.String(), args...)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		last := out[limit-1]
		next = store.EncodePageToken(last.CreatedAt, last.ID)
	}
	return out, next, nil
}

// ListDueSessions implements store.Store.
func (s *Store) ListDueSessions(ctx context.Context, before time.Time, limit int) ([]*store.Session, error) {
	if limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("list due sessions: limit %d: want 1..1000: %w", limit, errdefs.ErrInvalidArgument)
	}
	return s.querySessions(ctx, "list due sessions", `SELECT `+sessionColumns+` FROM sessions
		WHERE due_at IS NOT NULL AND due_at <= ? ORDER BY due_at LIMIT ?`, before.UnixMicro(), limit)
}

// ListSandboxSessions implements store.Store.
func (s *Store) ListSandboxSessions(ctx context.Context) ([]*store.Session, error) {
	return s.querySessions(ctx, "list sandbox sessions", `SELECT `+sessionColumns+` FROM sessions
		WHERE sandbox_id != '' AND status != 'terminated'`)
}

func (s *Store) querySessions(ctx context.Context, what, q string, args ...any) ([]*store.Session, error) {
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, dbErr(what, err)
	}
	defer rows.Close()
	var out []*store.Session
	for rows.Next() {
		sess, err := scanSession(rows)
		if err != nil {
			return nil, dbErr(what, err)
		}
		out = append(out, sess)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(what, err)
	}
	return out, nil
}

// CountSessions implements store.Store.
func (s *Store) CountSessions(ctx context.Context) (map[string]int, error) {
	return s.countByStatus(ctx, "sessions")
}

// TenantUsage implements store.Store.
func (s *Store) TenantUsage(ctx context.Context, tenant string) (store.TenantUsage, error) {
	var u store.TenantUsage
	err := s.r.QueryRowContext(ctx, `SELECT count(*), COALESCE(SUM(disk_mb), 0) FROM sessions WHERE tenant = ? AND status != 'terminated'`,
		tenant).Scan(&u.Sessions, &u.DiskMB)
	if err != nil {
		return u, dbErr(fmt.Sprintf("usage of tenant %q", tenant), err)
	}
	return u, nil
}

// TotalUsage implements store.Store.
func (s *Store) TotalUsage(ctx context.Context) (store.TenantUsage, error) {
	var u store.TenantUsage
	err := s.r.QueryRowContext(ctx, `SELECT count(*), COALESCE(SUM(disk_mb), 0) FROM sessions WHERE status != 'terminated'`).Scan(&u.Sessions, &u.DiskMB)
	if err != nil {
		return u, dbErr("usage of every tenant", err)
	}
	return u, nil
}

// countByStatus counts the rows of table by status; table is a constant.
func (s *Store) countByStatus(ctx context.Context, table string) (map[string]int, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT status, count(*) FROM `+table+` GROUP BY status`)
	if err != nil {
		return nil, dbErr("count "+table, err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, dbErr("count "+table, err)
		}
		out[st] = n
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr("count "+table, err)
	}
	return out, nil
}

// sessionArgs checks sess and returns its columns in sessionColumns order,
// all but revision, which the store keeps.
func sessionArgs(sess *store.Session) ([]any, error) {
	if sess == nil {
		return nil, fmt.Errorf("session: nil: %w", errdefs.ErrInvalidArgument)
	}
	if err := required("session", "tenant", sess.Tenant, "id", sess.ID); err != nil {
		return nil, err
	}
	if sess.CreatedAt.IsZero() {
		return nil, fmt.Errorf("session %q: created_at is required: %w", sess.ID, errdefs.ErrInvalidArgument)
	}
	meta := []byte("{}")
	if len(sess.Metadata) > 0 {
		var err error
		if meta, err = json.Marshal(sess.Metadata); err != nil {
			return nil, fmt.Errorf("session %q: metadata: %w", sess.ID, err)
		}
	}
	return []any{
		sess.Tenant, sess.ID, sess.Status, sess.TemplateID, sess.SandboxID, sess.Error, string(meta), rawJSON(sess.Config),
		micros(sess.CreatedAt), micros(sess.UpdatedAt), micros(sess.LastActivityAt), micros(sess.ExpiresAt), micros(sess.DueAt), sess.DiskMB,
	}, nil
}

func putMetadata(ctx context.Context, tx *sql.Tx, sess *store.Session) error {
	for k, v := range sess.Metadata {
		if _, err := tx.ExecContext(ctx, `INSERT INTO session_metadata (tenant, session_id, key, value, created_at) VALUES (?, ?, ?, ?, ?)`,
			sess.Tenant, sess.ID, k, v, sess.CreatedAt.UnixMicro()); err != nil {
			return err
		}
	}
	return nil
}

// prefixed qualifies each of a list of columns with prefix.
func prefixed(prefix, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

func scanSession(row interface{ Scan(...any) error }) (*store.Session, error) {
	var (
		sess                  store.Session
		meta, config          []byte
		created, updated      sql.NullInt64
		lastActivity, expires sql.NullInt64
		due                   sql.NullInt64
	)
	if err := row.Scan(&sess.Tenant, &sess.ID, &sess.Status, &sess.TemplateID, &sess.SandboxID, &sess.Error, &meta, &config,
		&created, &updated, &lastActivity, &expires, &due, &sess.DiskMB, &sess.Revision); err != nil {
		return nil, err
	}
	// metadata is never "null" (see sessionArgs), so this makes a map.
	if err := json.Unmarshal(meta, &sess.Metadata); err != nil {
		return nil, fmt.Errorf("session %q: metadata: %w", sess.ID, err)
	}
	sess.Config = fromRawJSON(config)
	sess.CreatedAt, sess.UpdatedAt = fromMicros(created), fromMicros(updated)
	sess.LastActivityAt, sess.ExpiresAt = fromMicros(lastActivity), fromMicros(expires)
	sess.DueAt = fromMicros(due)
	return &sess, nil
}
