package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// TryLease implements store.Store in one statement, on the database's
// clock: servers whose clocks disagree still agree on when a lease ends.
// Of concurrent takers of a free lease one inserts the row; the others
// find the conflict, wait for its row lock and test the WHERE on the row
// as the winner left it, so they change nothing.
func (s *Store) TryLease(ctx context.Context, name, holder string, ttl time.Duration) (int64, bool, error) {
	if err := store.CheckLease(name, holder); err != nil {
		return 0, false, err
	}
	us, err := store.LeaseMicros(ttl)
	if err != nil {
		return 0, false, fmt.Errorf("lease %q: %w", name, err)
	}
	var token int64
	// The token grows when the lease changes hands, not when its holder
	// renews it. An upsert whose WHERE fails returns no row: the lease is
	// another's.
	err = s.pool.QueryRow(ctx, `INSERT INTO leases AS l (name, holder, token, expires_at)
		VALUES ($1, $2, 1, clock_timestamp() + $3::bigint * interval '1 microsecond')
		ON CONFLICT (name) DO UPDATE SET
			token = CASE WHEN l.holder = excluded.holder THEN l.token ELSE l.token + 1 END,
			holder = excluded.holder, expires_at = excluded.expires_at
		WHERE l.holder = excluded.holder OR l.expires_at <= clock_timestamp()
		RETURNING token`, name, holder, us).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, dbErr(fmt.Sprintf("lease %q", name), err)
	}
	return token, true, nil
}

// LeaseHolder implements store.Store, on the database's clock.
func (s *Store) LeaseHolder(ctx context.Context, name string) (string, bool, error) {
	if err := store.CheckLease(name, "-"); err != nil {
		return "", false, err
	}
	var (
		holder string
		live   bool
	)
	err := s.pool.QueryRow(ctx, `SELECT holder, expires_at > clock_timestamp() FROM leases WHERE name = $1`, name).Scan(&holder, &live)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, dbErr(fmt.Sprintf("lease %q", name), err)
	}
	return holder, live, nil
}

// ReleaseLease implements store.Store: the lease expires at -infinity,
// keeping its token.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string) error {
	if err := store.CheckLease(name, holder); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, `UPDATE leases SET expires_at = '-infinity' WHERE name = $1 AND holder = $2`, name, holder); err != nil {
		return dbErr(fmt.Sprintf("release lease %q", name), err)
	}
	return nil
}

// LiveLeases implements store.Store, on the database's clock.
// starts_with does not depend on the database's collation.
func (s *Store) LiveLeases(ctx context.Context, prefix string) ([]string, error) {
	if prefix == "" {
		return nil, fmt.Errorf("live leases: prefix is required: %w", errdefs.ErrInvalidArgument)
	}
	rows, err := s.pool.Query(ctx, `SELECT name FROM leases WHERE starts_with(name, $1) AND expires_at > clock_timestamp() ORDER BY name COLLATE "C"`, prefix)
	if err != nil {
		return nil, dbErr(fmt.Sprintf("live leases %q", prefix), err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, dbErr(fmt.Sprintf("live leases %q", prefix), err)
	}
	return names, nil
}
