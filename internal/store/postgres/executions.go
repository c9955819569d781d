package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

const executionColumns = `id, tenant, session_id, status, language, conversation_id, context_id, request, result,
	created_at, started_at, finished_at, owner`

// writeColumns are executionColumns and the record's size in bytes.
const writeColumns = executionColumns + `, bytes`

// summaryColumns are the columns of a listing: no request, no result (a
// row's can be tens of MiB; a page has up to 1,000 rows). Not selected,
// they stay in their TOAST table, unread.
const summaryColumns = `id, tenant, session_id, status, language, conversation_id, context_id,
	created_at, started_at, finished_at`

// CreateExecution implements store.Store.
func (s *Store) CreateExecution(ctx context.Context, x *store.Execution) error {
	args, err := executionArgs(x)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO executions (`+writeColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`, args...)
	if isDuplicate(err) {
		return fmt.Errorf("execution %q: %w", x.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return dbErr(fmt.Sprintf("create execution %q", x.ID), err)
	}
	return nil
}

// UpdateExecution implements store.Store.
func (s *Store) UpdateExecution(ctx context.Context, x *store.Execution) error {
	args, err := executionArgs(x)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE executions SET session_id = $3, status = $4, language = $5, conversation_id = $6,
		context_id = $7, request = $8, result = $9, created_at = $10, started_at = $11, finished_at = $12, owner = $13, bytes = $14
		WHERE id = $1 AND tenant = $2 AND status IN ('pending', 'running')`, args...)
	if err != nil {
		return dbErr(fmt.Sprintf("update execution %q", x.ID), err)
	}
	if tag.RowsAffected() == 0 {
		// Absent, or finished: say which.
		if _, err := s.GetExecution(ctx, x.Tenant, x.ID); err != nil {
			return err
		}
		return fmt.Errorf("execution %q is finished; its record is final: %w", x.ID, errdefs.ErrConflict)
	}
	return nil
}

// GetExecution implements store.Store.
func (s *Store) GetExecution(ctx context.Context, tenant, id string) (*store.Execution, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+executionColumns+` FROM executions WHERE id = $1 AND tenant = $2`, id, tenant)
	x, err := scanExecution(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("execution %q: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, dbErr(fmt.Sprintf("get execution %q", id), err)
	}
	return x, nil
}

// ListExecutions implements store.Store.
func (s *Store) ListExecutions(ctx context.Context, tenant, sessionID string, limit int, pageToken string) ([]*store.ExecutionSummary, string, error) {
	limit, err := store.PageSize(limit)
	if err != nil {
		return nil, "", err
	}
	// One more than a page tells whether there is a next one.
	q := `SELECT ` + summaryColumns + ` FROM executions WHERE tenant = $1 AND session_id = $2`
	args := []any{tenant, sessionID, limit + 1}
	if pageToken != "" {
		at, id, err := store.DecodePageToken(pageToken)
		if err != nil {
			return nil, "", err
		}
		q += ` AND (created_at, id) < ($4, $5)`
		args = append(args, at, id)
	}
	q += ` ORDER BY created_at DESC, id DESC LIMIT $3`
	out, err := s.querySummaries(ctx, q, args...)
	if err != nil {
		return nil, "", dbErr(fmt.Sprintf("list executions of session %q", sessionID), err)
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		last := out[limit-1]
		next = store.EncodePageToken(last.CreatedAt, last.ID)
	}
	return out, next, nil
}

// ListUnfinishedExecutions implements store.Store.
func (s *Store) ListUnfinishedExecutions(ctx context.Context) ([]*store.Execution, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+executionColumns+` FROM executions
		WHERE status IN ('pending', 'running') ORDER BY created_at, id`)
	if err != nil {
		return nil, dbErr("list unfinished executions", err)
	}
	defer rows.Close()
	var out []*store.Execution
	for rows.Next() {
		x, err := scanExecution(rows)
		if err != nil {
			return nil, dbErr("list unfinished executions", err)
		}
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr("list unfinished executions", err)
	}
	return out, nil
}

// CountExecutions implements store.Store.
func (s *Store) CountExecutions(ctx context.Context) (map[string]int, error) {
	return s.countByStatus(ctx, "executions")
}

// DeleteExecutions implements store.Store.
func (s *Store) DeleteExecutions(ctx context.Context, tenant, sessionID string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM executions WHERE tenant = $1 AND session_id = $2`, tenant, sessionID); err != nil {
		return dbErr(fmt.Sprintf("delete executions of session %q", sessionID), err)
	}
	return nil
}

// TrimExecutions implements store.Store.
func (s *Store) TrimExecutions(ctx context.Context, tenant, sessionID string, keep int) (int, error) {
	if keep < 1 {
		return 0, fmt.Errorf("trim executions: keep %d: want at least 1: %w", keep, errdefs.ErrInvalidArgument)
	}
	// The newest keep rows of the session's index, and everything older
	// that has finished. Without a keep-th row the subquery is NULL and
	// nothing goes.
	tag, err := s.pool.Exec(ctx, `DELETE FROM executions WHERE tenant = $1 AND session_id = $2
		AND status NOT IN ('pending', 'running')
		AND (created_at, id) < (
			SELECT created_at, id FROM executions WHERE tenant = $1 AND session_id = $2
			ORDER BY created_at DESC, id DESC LIMIT 1 OFFSET $3)`,
		tenant, sessionID, keep-1)
	if err != nil {
		return 0, dbErr(fmt.Sprintf("trim executions of session %q", sessionID), err)
	}
	return int(tag.RowsAffected()), nil
}

func (s *Store) querySummaries(ctx context.Context, q string, args ...any) ([]*store.ExecutionSummary, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.ExecutionSummary
	for rows.Next() {
		var (
			x                          store.ExecutionSummary
			created, started, finished pgtype.Timestamptz
		)
		if err := rows.Scan(&x.ID, &x.Tenant, &x.SessionID, &x.Status, &x.Language, &x.ConversationID, &x.ContextID,
			&created, &started, &finished); err != nil {
			return nil, err
		}
		x.CreatedAt, x.StartedAt, x.FinishedAt = fromTS(created), fromTS(started), fromTS(finished)
		out = append(out, &x)
	}
	return out, rows.Err()
}

// executionArgs checks x and returns its columns in writeColumns order.
func executionArgs(x *store.Execution) ([]any, error) {
	if x == nil {
		return nil, fmt.Errorf("execution: nil: %w", errdefs.ErrInvalidArgument)
	}
	if err := required("execution", "tenant", x.Tenant, "id", x.ID, "session id", x.SessionID); err != nil {
		return nil, err
	}
	if x.CreatedAt.IsZero() {
		return nil, fmt.Errorf("execution %q: created_at is required: %w", x.ID, errdefs.ErrInvalidArgument)
	}
	return []any{
		x.ID, x.Tenant, x.SessionID, x.Status, x.Language, x.ConversationID, x.ContextID, rawJSON(x.Request), rawJSON(x.Result),
		ts(x.CreatedAt), ts(x.StartedAt), ts(x.FinishedAt), x.Owner, store.RecordBytes(x),
	}, nil
}

func scanExecution(row pgx.Row) (*store.Execution, error) {
	var (
		x                          store.Execution
		req, res                   []byte
		created, started, finished pgtype.Timestamptz
	)
	if err := row.Scan(&x.ID, &x.Tenant, &x.SessionID, &x.Status, &x.Language, &x.ConversationID, &x.ContextID, &req, &res,
		&created, &started, &finished, &x.Owner); err != nil {
		return nil, err
	}
	x.Request, x.Result = fromRawJSON(req), fromRawJSON(res)
	x.CreatedAt, x.StartedAt, x.FinishedAt = fromTS(created), fromTS(started), fromTS(finished)
	return &x, nil
}

// TrimTenantExecutions implements store.Store.
func (s *Store) TrimTenantExecutions(ctx context.Context, tenant string, keepBytes int64) (int, int64, error) {
	if keepBytes < 0 {
		return 0, 0, fmt.Errorf("trim executions: keep %d bytes: want 0 or more: %w", keepBytes, errdefs.ErrInvalidArgument)
	}
	what := fmt.Sprintf("trim executions of tenant %q", tenant)
	rows, err := s.pool.Query(ctx, `SELECT created_at, id, status, bytes FROM executions WHERE tenant = $1
		ORDER BY created_at DESC, id DESC`, tenant)
	if err != nil {
		return 0, 0, dbErr(what, err)
	}
	var w store.TrimWalk
	for rows.Next() {
		var (
			at         pgtype.Timestamptz
			id, status string
			n          int64
		)
		if err := rows.Scan(&at, &id, &status, &n); err != nil {
			rows.Close()
			return 0, 0, dbErr(what, err)
		}
		w.Add(keepBytes, fromTS(at), id, status, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, dbErr(what, err)
	}
	if !w.Cut() {
		return 0, w.Total, nil
	}
	at, id := w.CutAt()
	tag, err := s.pool.Exec(ctx, `DELETE FROM executions WHERE tenant = $1 AND status NOT IN ('pending', 'running')
		AND (created_at, id) <= ($2, $3)`, tenant, ts(at), id)
	if err != nil {
		return 0, 0, dbErr(what, err)
	}
	return int(tag.RowsAffected()), w.Kept(), nil
}
