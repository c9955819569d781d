package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// PutDocument implements store.Store.
func (s *Store) PutDocument(ctx context.Context, d *store.Document) error {
	if err := store.CheckDocument(d); err != nil {
		return err
	}
	what := fmt.Sprintf("document %s/%s", d.Kind, d.Key)
	var created, updated pgtype.Timestamptz
	var err error
	if d.Revision == 0 {
		err = s.pool.QueryRow(ctx, `INSERT INTO documents (kind, tenant, key, value, revision, created_at, updated_at)
			VALUES ($1, $2, $3, $4, 1, now(), now())
			RETURNING created_at, updated_at`, d.Kind, d.Tenant, d.Key, []byte(d.Value)).Scan(&created, &updated)
		if isDuplicate(err) {
			return fmt.Errorf("%s: %w", what, errdefs.ErrAlreadyExists)
		}
	} else {
		err = s.pool.QueryRow(ctx, `UPDATE documents SET value = $5, revision = revision + 1, updated_at = now()
			WHERE kind = $1 AND tenant = $2 AND key = $3 AND revision = $4 RETURNING created_at, updated_at`,
			d.Kind, d.Tenant, d.Key, d.Revision, []byte(d.Value)).Scan(&created, &updated)
		if errors.Is(err, pgx.ErrNoRows) {
			return s.docMissing(ctx, d.Kind, d.Tenant, d.Key, what)
		}
	}
	if err != nil {
		return dbErr(what, err)
	}
	d.Revision++
	d.CreatedAt, d.UpdatedAt = fromTS(created), fromTS(updated)
	return nil
}

// docMissing says why a compare-and-swap of a document changed nothing:
// the document is gone, or at another revision.
func (s *Store) docMissing(ctx context.Context, kind, tenant, key, what string) error {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT 1 FROM documents WHERE kind = $1 AND tenant = $2 AND key = $3`, kind, tenant, key).Scan(&n)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	case err != nil:
		return dbErr(what, err)
	}
	return fmt.Errorf("%s: written since it was read: %w", what, errdefs.ErrConflict)
}

// GetDocument implements store.Store.
func (s *Store) GetDocument(ctx context.Context, kind, tenant, key string) (*store.Document, error) {
	if err := required("document", "kind", kind, "tenant", tenant, "key", key); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT kind, tenant, key, value, revision, created_at, updated_at FROM documents
		WHERE kind = $1 AND tenant = $2 AND key = $3`, kind, tenant, key)
	if err != nil {
		return nil, dbErr("get document", err)
	}
	docs, err := pgx.CollectRows(rows, scanDocument)
	if err != nil {
		return nil, dbErr("get document", err)
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("document %s/%s: %w", kind, key, errdefs.ErrNotFound)
	}
	return docs[0], nil
}

// ListDocuments implements store.Store. starts_with and COLLATE "C" do not
// depend on the database's collation.
func (s *Store) ListDocuments(ctx context.Context, kind, tenant, prefix, after string, limit int) ([]*store.Document, error) {
	if err := store.CheckListDocuments(kind, tenant, limit); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT kind, tenant, key, value, revision, created_at, updated_at FROM documents
		WHERE kind = $1 AND tenant = $2 AND starts_with(key, $3) AND key > $4 ORDER BY key LIMIT $5`,
		kind, tenant, prefix, after, limit)
	if err != nil {
		return nil, dbErr("list documents", err)
	}
	docs, err := pgx.CollectRows(rows, scanDocument)
	if err != nil {
		return nil, dbErr("list documents", err)
	}
	return docs, nil
}

func scanDocument(row pgx.CollectableRow) (*store.Document, error) {
	var (
		d                store.Document
		value            []byte
		created, updated pgtype.Timestamptz
	)
	if err := row.Scan(&d.Kind, &d.Tenant, &d.Key, &value, &d.Revision, &created, &updated); err != nil {
		return nil, err
	}
	d.Value = value
	d.CreatedAt, d.UpdatedAt = fromTS(created), fromTS(updated)
	return &d, nil
}

// DeleteDocument implements store.Store.
func (s *Store) DeleteDocument(ctx context.Context, kind, tenant, key string, revision int64) error {
	if err := required("document", "kind", kind, "tenant", tenant, "key", key); err != nil {
		return err
	}
	what := fmt.Sprintf("document %s/%s", kind, key)
	tag, err := s.pool.Exec(ctx, `DELETE FROM documents WHERE kind = $1 AND tenant = $2 AND key = $3 AND ($4 = 0 OR revision = $4)`,
		kind, tenant, key, revision)
	if err != nil {
		return dbErr(what, err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	return s.docMissing(ctx, kind, tenant, key, what)
}

// AppendEvent implements store.Store.
func (s *Store) AppendEvent(ctx context.Context, e *store.Event) error {
	return s.AppendEvents(ctx, []*store.Event{e})
}

// AppendEvents implements store.Store. The upsert of a tenant's
// event_seqs row locks it until the transaction commits, so the next
// appender for the tenant waits and takes the next number only after
// these events are visible: numbers follow commit order.
func (s *Store) AppendEvents(ctx context.Context, events []*store.Event) error {
	for _, e := range events {
		if err := store.CheckEvent(e); err != nil {
			return err
		}
	}
	seqs := make([]int64, len(events))
	err := s.tx(ctx, func(tx pgx.Tx) error {
		// Tenants' rows are locked in one order in every transaction, or
		// two batches of two tenants could each wait for the other.
		for _, i := range store.ByTenant(events) {
			e := events[i]
			if err := tx.QueryRow(ctx, `INSERT INTO event_seqs AS q (tenant, seq) VALUES ($1, 1)
				ON CONFLICT (tenant) DO UPDATE SET seq = q.seq + 1 RETURNING seq`, e.Tenant).Scan(&seqs[i]); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO events (tenant, seq, session_id, type, data, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
				e.Tenant, seqs[i], e.SessionID, e.Type, rawJSON(e.Data), ts(e.CreatedAt)); err != nil {
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
	rows, err := s.pool.Query(ctx, `SELECT tenant, seq, session_id, type, data, created_at FROM events
		WHERE tenant = $1 AND seq > $2 AND ($3 = '' OR session_id = $3) ORDER BY seq LIMIT $4`,
		f.Tenant, f.After, f.SessionID, limit)
	if err != nil {
		return nil, dbErr("list events", err)
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*store.Event, error) {
		var (
			e       store.Event
			data    []byte
			created pgtype.Timestamptz
		)
		if err := row.Scan(&e.Tenant, &e.Seq, &e.SessionID, &e.Type, &data, &created); err != nil {
			return nil, err
		}
		e.Data, e.CreatedAt = fromRawJSON(data), fromTS(created)
		return &e, nil
	})
	if err != nil {
		return nil, dbErr("list events", err)
	}
	return events, nil
}

// TrimEvents implements store.Store. event_seqs keeps each tenant's last
// number, so numbering goes on after its events are gone.
func (s *Store) TrimEvents(ctx context.Context, before time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM events WHERE created_at < $1`, ts(before))
	if err != nil {
		return 0, dbErr("trim events", err)
	}
	return int(tag.RowsAffected()), nil
}
