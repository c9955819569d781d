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

// TryLease implements store.Store. Its clock is this process's: an SQLite
// file has one server. One statement on the one write connection, so
// callers take turns.
func (s *Store) TryLease(ctx context.Context, name, holder string, ttl time.Duration) (int64, bool, error) {
	if err := store.CheckLease(name, holder); err != nil {
		return 0, false, err
	}
	us, err := store.LeaseMicros(ttl)
	if err != nil {
		return 0, false, fmt.Errorf("lease %q: %w", name, err)
	}
	now := time.Now().UnixMicro()
	var token int64
	err = s.write(ctx, func(tx *sql.Tx) error {
		// The token grows when the lease changes hands, not when its
		// holder renews it. An upsert whose WHERE fails changes and
		// returns nothing: the lease is another's.
		return tx.QueryRowContext(ctx, `INSERT INTO leases (name, holder, token, expires_at) VALUES (?, ?, 1, ?)
			ON CONFLICT (name) DO UPDATE SET
				token = CASE WHEN holder = excluded.holder THEN token ELSE token + 1 END,
				holder = excluded.holder, expires_at = excluded.expires_at
			WHERE holder = excluded.holder OR expires_at <= ?
			RETURNING token`, name, holder, now+us, now).Scan(&token)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, dbErr(fmt.Sprintf("lease %q", name), err)
	}
	return token, true, nil
}

// LeaseHolder implements store.Store.
func (s *Store) LeaseHolder(ctx context.Context, name string) (string, bool, error) {
	if err := store.CheckLease(name, "-"); err != nil {
		return "", false, err
	}
	var (
		holder  string
		expires int64
	)
	err := s.r.QueryRowContext(ctx, `SELECT holder, expires_at FROM leases WHERE name = ?`, name).Scan(&holder, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, dbErr(fmt.Sprintf("lease %q", name), err)
	}
	return holder, expires > time.Now().UnixMicro(), nil
}

// ReleaseLease implements store.Store: the lease expires at the epoch,
// which has passed, keeping its token.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string) error {
	if err := store.CheckLease(name, holder); err != nil {
		return err
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE leases SET expires_at = 0 WHERE name = ? AND holder = ?`, name, holder)
		return err
	})
	if err != nil {
		return dbErr(fmt.Sprintf("release lease %q", name), err)
	}
	return nil
}

// LiveLeases implements store.Store. Names compare as bytes (SQLite's
// BINARY collation), so the names that begin with prefix are those from
// prefix up to, not including, prefix followed by byte 0xFF, which no
// UTF-8 text holds.
func (s *Store) LiveLeases(ctx context.Context, prefix string) ([]string, error) {
	if prefix == "" {
		return nil, fmt.Errorf("live leases: prefix is required: %w", errdefs.ErrInvalidArgument)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT name FROM leases WHERE name >= ? AND name < ? AND expires_at > ? ORDER BY name`,
		prefix, prefix+"\xff", time.Now().UnixMicro())
	if err != nil {
		return nil, dbErr(fmt.Sprintf("live leases %q", prefix), err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, dbErr(fmt.Sprintf("live leases %q", prefix), err)
		}
		names = append(names, name)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(fmt.Sprintf("live leases %q", prefix), err)
	}
	return names, nil
}
