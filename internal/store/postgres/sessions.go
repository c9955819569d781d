package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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
	err = s.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO sessions (`+sessionColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, 1)`, args...)
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
	row := s.pool.QueryRow(ctx, `SELECT `+sessionColumns+` FROM sessions WHERE tenant = $1 AND id = $2`, tenant, id)
	sess, err := scanSession(row)
	if errors.Is(err, pgx.ErrNoRows) {
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
	args = append(args, sess.Revision)
	err = s.tx(ctx, func(tx pgx.Tx) error {
		// The UPDATE locks the session's row, and an update that waited
		// for the lock tests the revision again on the row as the other
		// left it (READ COMMITTED re-checks the WHERE): of concurrent
		// updates from one read, one changes the row and its metadata rows,
		// and the others change nothing.
		tag, err := tx.Exec(ctx, `UPDATE sessions SET status = $3, template_id = $4, sandbox_id = $5, error_message = $6,
			metadata = $7, config = $8, created_at = $9, updated_at = $10, last_activity_at = $11, expires_at = $12,
			due_at = $13, disk_mb = $14, revision = revision + 1
			WHERE tenant = $1 AND id = $2 AND revision = $15`, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return missOrConflict(ctx, tx, sess)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM session_metadata WHERE tenant = $1 AND session_id = $2`, sess.Tenant, sess.ID); err != nil {
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
func missOrConflict(ctx context.Context, tx pgx.Tx, sess *store.Session) error {
	var rev int64
	err := tx.QueryRow(ctx, `SELECT revision FROM sessions WHERE tenant = $1 AND id = $2`, sess.Tenant, sess.ID).Scan(&rev)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("session %q: %w", sess.ID, errdefs.ErrNotFound)
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("session %q: read at revision %d, now at %d: %w", sess.ID, sess.Revision, rev, errdefs.ErrConflict)
}

// DeleteSession implements store.Store.
func (s *Store) DeleteSession(ctx context.Context, tenant, id string) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		for _, q := range []string{
			`DELETE FROM sessions WHERE tenant = $1 AND id = $2`,
			`DELETE FROM session_metadata WHERE tenant = $1 AND session_id = $2`,
			`DELETE FROM executions WHERE tenant = $1 AND session_id = $2`,
			`DELETE FROM uploads WHERE tenant = $1 AND session_id = $2`,
		} {
			if _, err := tx.Exec(ctx, q, tenant, id); err != nil {
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
	var (
		q    strings.Builder
		args []any
	)
	// arg adds a parameter and returns its placeholder.
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	// The keyset position and the order name the columns of the index
	// the query walks, newest first, so that it stops when the page is
	// full.
	at, id := "s.created_at", "s.id"
	if len(f.Metadata) == 0 {
		q.WriteString(`SELECT ` + prefixed("s.", sessionColumns) + ` FROM sessions AS s WHERE s.tenant = ` + arg(f.Tenant))
	} else {
		// The first pair's index yields its sessions in page order (it
		// holds created_at); the other pairs are tested per session.
		keys := slices.Sorted(maps.Keys(f.Metadata)) // one filter, one statement
		q.WriteString(`SELECT ` + prefixed("s.", sessionColumns) + ` FROM session_metadata AS m
			JOIN sessions AS s ON s.tenant = m.tenant AND s.id = m.session_id
			WHERE m.tenant = ` + arg(f.Tenant) + ` AND m.key = ` + arg(keys[0]) + ` AND m.value = ` + arg(f.Metadata[keys[0]]))
		for _, k := range keys[1:] {
			q.WriteString(` AND EXISTS (SELECT 1 FROM session_metadata AS o
				WHERE o.tenant = m.tenant AND o.session_id = m.session_id AND o.key = ` + arg(k) + ` AND o.value = ` + arg(f.Metadata[k]) + `)`)
		}
		at, id = "m.created_at", "m.session_id"
	}
	if f.Status != "" {
		q.WriteString(` AND s.status = ` + arg(f.Status))
	}
	if f.PageToken != "" {
		t, pid, err := store.DecodePageToken(f.PageToken)
		if err != nil {
			return nil, "", err
		}
		q.WriteString(` AND (` + at + `, ` + id + `) < (` + arg(t) + `, ` + arg(pid) + `)`)
	}
	// One more than a page tells whether there is a next one.
	q.WriteString(` ORDER BY ` + at + ` DESC, ` + id + ` DESC LIMIT ` + arg(limit+1))

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
		WHERE due_at IS NOT NULL AND due_at <= $1 ORDER BY due_at LIMIT $2`, ts(before), limit)
}

// ListSandboxSessions implements store.Store.
func (s *Store) ListSandboxSessions(ctx context.Context) ([]*store.Session, error) {
	return s.querySessions(ctx, "list sandbox sessions", `SELECT `+sessionColumns+` FROM sessions
		WHERE sandbox_id != '' AND status != 'terminated'`)
}

func (s *Store) querySessions(ctx context.Context, what, q string, args ...any) ([]*store.Session, error) {
	rows, err := s.pool.Query(ctx, q, args...)
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
	// sum(bigint) is numeric: back to bigint, which it fits.
	err := s.pool.QueryRow(ctx, `SELECT count(*), COALESCE(sum(disk_mb), 0)::bigint FROM sessions
		WHERE tenant = $1 AND status != 'terminated'`, tenant).Scan(&u.Sessions, &u.DiskMB)
	if err != nil {
		return u, dbErr(fmt.Sprintf("usage of tenant %q", tenant), err)
	}
	return u, nil
}

// TotalUsage implements store.Store.
func (s *Store) TotalUsage(ctx context.Context) (store.TenantUsage, error) {
	var u store.TenantUsage
	err := s.pool.QueryRow(ctx, `SELECT count(*), COALESCE(sum(disk_mb), 0)::bigint FROM sessions
		WHERE status != 'terminated'`).Scan(&u.Sessions, &u.DiskMB)
	if err != nil {
		return u, dbErr("usage of every tenant", err)
	}
	return u, nil
}

// countByStatus counts the rows of table by status; table is a constant.
func (s *Store) countByStatus(ctx context.Context, table string) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT status, count(*) FROM `+table+` GROUP BY status`)
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
		sess.Tenant, sess.ID, sess.Status, sess.TemplateID, sess.SandboxID, sess.Error, meta, rawJSON(sess.Config),
		ts(sess.CreatedAt), ts(sess.UpdatedAt), ts(sess.LastActivityAt), ts(sess.ExpiresAt), ts(sess.DueAt), sess.DiskMB,
	}, nil
}

// putMetadata writes the session's metadata rows, all in one statement.
func putMetadata(ctx context.Context, tx pgx.Tx, sess *store.Session) error {
	if len(sess.Metadata) == 0 {
		return nil
	}
	keys := slices.Collect(maps.Keys(sess.Metadata))
	values := make([]string, len(keys))
	for i, k := range keys {
		values[i] = sess.Metadata[k]
	}
	_, err := tx.Exec(ctx, `INSERT INTO session_metadata (tenant, session_id, key, value, created_at)
		SELECT $1, $2, m.key, m.value, $3 FROM unnest($4::text[], $5::text[]) AS m (key, value)`,
		sess.Tenant, sess.ID, ts(sess.CreatedAt), keys, values)
	return err
}

// prefixed qualifies each of a list of columns with prefix.
func prefixed(prefix, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

func scanSession(row pgx.Row) (*store.Session, error) {
	var (
		sess                  store.Session
		config                []byte
		created, updated      pgtype.Timestamptz
		lastActivity, expires pgtype.Timestamptz
		due                   pgtype.Timestamptz
	)
	// metadata is never JSON null (see sessionArgs), so this makes a map.
	if err := row.Scan(&sess.Tenant, &sess.ID, &sess.Status, &sess.TemplateID, &sess.SandboxID, &sess.Error, &sess.Metadata, &config,
		&created, &updated, &lastActivity, &expires, &due, &sess.DiskMB, &sess.Revision); err != nil {
		return nil, err
	}
	sess.Config = fromRawJSON(config)
	sess.CreatedAt, sess.UpdatedAt = fromTS(created), fromTS(updated)
	sess.LastActivityAt, sess.ExpiresAt = fromTS(lastActivity), fromTS(expires)
	sess.DueAt = fromTS(due)
	return &sess, nil
}
