package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// PutDocument implements store.Store.
func (s *Store) PutDocument(ctx context.Context, d *store.Document) error {
	if err := store.CheckDocument(d); err != nil {
		return err
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	what := fmt.Sprintf("document %s/%s", d.Kind, d.Key)
	var created sql.NullInt64
	err := s.write(ctx, func(tx *sql.Tx) error {
		if d.Revision == 0 {
			_, err := tx.ExecContext(ctx, `INSERT INTO documents (kind, tenant, key, value, revision, created_at, updated_at)
				VALUES (?, ?, ?, ?, 1, ?, ?)`, d.Kind, d.Tenant, d.Key, []byte(d.Value), now.UnixMicro(), now.UnixMicro())
			if isDuplicate(err) {
				return fmt.Errorf("%s: %w", what, errdefs.ErrAlreadyExists)
			}
			created = sql.NullInt64{Int64: now.UnixMicro(), Valid: true}
			return err
		}
		err := tx.QueryRowContext(ctx, `UPDATE documents SET value = ?, revision = revision + 1, updated_at = ?
			WHERE kind = ? AND tenant = ? AND key = ? AND revision = ? RETURNING created_at`,
			[]byte(d.Value), now.UnixMicro(), d.Kind, d.Tenant, d.Key, d.Revision).Scan(&created)
		if errors.Is(err, sql.ErrNoRows) {
			return docMissing(ctx, tx, d.Kind, d.Tenant, d.Key, what)
		}
		return err
	})
	if err != nil {
		if errors.Is(err, errdefs.ErrAlreadyExists) || errors.Is(err, errdefs.ErrConflict) || errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
		return dbErr(what, err)
	}
	d.Revision++
	d.CreatedAt, d.UpdatedAt = fromMicros(created), now
	return nil
}

// docMissing says why a compare-and-swap of a document changed nothing:
// the document is gone, or at another revision.
func docMissing(ctx context.Context, tx *sql.Tx, kind, tenant, key, what string) error {
	var n int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM documents WHERE kind = ? AND tenant = ? AND key = ?`, kind, tenant, key).Scan(&n)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	case err != nil:
		return err
	}
	return fmt.Errorf("%s: written since it was read: %w", what, errdefs.ErrConflict)
}

// GetDocument implements store.Store.
func (s *Store) GetDocument(ctx context.Context, kind, tenant, key string) (*store.Document, error) {
	if err := required("document", "kind", kind, "tenant", tenant, "key", key); err != nil {
		return nil, err
	}
	rows, err := s.r.QueryContext(ctx, `SELECT kind, tenant, key, value, revision, created_at, updated_at FROM documents
		WHERE kind = ? AND tenant = ? AND key = ?`, kind, tenant, key)
	if err != nil {
		return nil, dbErr("get document", err)
	}
	docs, err := scanDocuments(rows)
	if err != nil {
		return nil, dbErr("get document", err)
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("document %s/%s: %w", kind, key, errdefs.ErrNotFound)
	}
	return docs[0], nil
}

// ListDocuments implements store.Store. Keys compare as bytes, so those
// that begin with prefix run from prefix up to prefix followed by 0xFF.
func (s *Store) ListDocuments(ctx context.Context, kind, tenant, prefix, after string, limit int) ([]*store.Document, error) {
	if err := store.CheckListDocuments(kind, tenant, limit); err != nil {
		return nil, err
	}
	rows, err := s.r.QueryContext(ctx, `SELECT kind, tenant, key, value, revision, created_at, updated_at FROM documents
		WHERE kind = ? AND tenant = ? AND key >= ? AND key < ? AND key > ? ORDER BY key LIMIT ?`,
		kind, tenant, prefix, prefix+"\xff", after, limit)
	if err != nil {
		return nil, dbErr("list documents", err)
	}
	docs, err := scanDocuments(rows)
	if err != nil {
		return nil, dbErr("list documents", err)
	}
	return docs, nil
}

func scanDocuments(rows *sql.Rows) ([]*store.Document, error) {
	defer rows.Close()
	var docs []*store.Document
	for rows.Next() {
		var (
			d                store.Document
			value            []byte
			created, updated sql.NullInt64
		)
		if err := rows.Scan(&d.Kind, &d.Tenant, &d.Key, &value, &d.Revision, &created, &updated); err != nil {
			return nil, err
		}
		d.Value = value
		d.CreatedAt, d.UpdatedAt = fromMicros(created), fromMicros(updated)
		docs = append(docs, &d)
	}
	return docs, rows.Err()
}

// DeleteDocument implements store.Store.
func (s *Store) DeleteDocument(ctx context.Context, kind, tenant, key string, revision int64) error {
	if err := required("document", "kind", kind, "tenant", tenant, "key", key); err != nil {
		return err
	}
	what := fmt.Sprintf("document %s/%s", kind, key)
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM documents WHERE kind = ? AND tenant = ? AND key = ? AND (? = 0 OR revision = ?)`,
			kind, tenant, key, revision, revision)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n > 0 {
			return err
		}
		return docMissing(ctx, tx, kind, tenant, key, what)
	})
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrConflict) {
		return dbErr(what, err)
	}
	return err
}

// AppendEvent implements store.Store.
func (s *Store) AppendEvent(ctx context.Context, e *store.Event) error {
	return s.AppendEvents(ctx, []*store.Event{e})
}

// AppendEvents implements store.Store: one write transaction takes each
// tenant's next numbers and records the events, and SQLite has one
// writer, so numbers follow commit order.
func (s *Store) AppendEvents(ctx context.Context, events []*store.Event) error {
	for _, e := range events {
		if err := store.CheckEvent(e); err != nil {
			return err
		}
	}
	seqs := make([]int64, len(events))
	err := s.write(ctx, func(tx *sql.Tx) error {
		for _, i := range store.ByTenant(events) {
			e := events[i]
			if err := tx.QueryRowContext(ctx, `INSERT INTO event_seqs (tenant, seq) VALUES (?, 1)
				ON CONFLICT (tenant) DO UPDATE SET seq = seq + 1 RETURNING seq`, e.Tenant).Scan(&seqs[i]); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO events (tenant, seq, session_id, type, data, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
				e.Tenant, seqs[i], e.SessionID, e.Type, rawJSON(e.Data), e.CreatedAt.UnixMicro()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return dbErr("append events", err)
	}
	for i, e := range events {
		e.Seq = seqs[i]
	}
	return nil
}

// ListEvents implements store.Store.
func (s *Store) ListEvents(ctx context.Context, f store.EventFilter) ([]*store.Event, error) {
	limit, err := store.CheckEventFilter(f)
	if err != nil {
		return nil, err
	}
	q := `SELECT tenant, seq, session_id, type, data, created_at FROM events WHERE tenant = ? AND seq > ?`
	args := []any{f.Tenant, f.After}
	if f.SessionID != "" {
		q += ` AND session_id = ?`
		args = append(args, f.SessionID)
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY seq LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, dbErr("list events", err)
	}
	defer rows.Close()
	var out []*store.Event
	for rows.Next() {
		var (
			e       store.Event
			data    []byte
			created sql.NullInt64
		)
		if err := rows.Scan(&e.Tenant, &e.Seq, &e.SessionID, &e.Type, &data, &created); err != nil {
			return nil, dbErr("list events", err)
		}
		e.Data, e.CreatedAt = fromRawJSON(data), fromMicros(created)
		out = append(out, &e)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr("list events", err)
	}
	return out, nil
}

// TrimEvents implements store.Store. event_seqs keeps each tenant's last
// number, so numbering goes on after its events are gone.
func (s *Store) TrimEvents(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM events WHERE created_at < ?`, before.UnixMicro())
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, dbErr("trim events", err)
	}
	return int(n), nil
}
