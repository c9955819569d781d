// Package sqlite is the metadata store of a single sbx server: one SQLite
// file in WAL mode, on the pure-Go driver modernc.org/sqlite.
//
// Writes go through one connection and reads through a pool of others.
// SQLite allows one writer at a time anyway; queuing writers in
// database/sql instead of in SQLite's lock means they wait their turn
// rather than fail with SQLITE_BUSY, and WAL lets the readers run beside
// the writer.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	driver "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

var _ store.Store = (*Store)(nil)

// Store is a store.Store on an SQLite file.
type Store struct {
	w *sql.DB // the one write connection
	r *sql.DB // read-only connections
}

// busyTimeout bounds the wait for a lock another process holds (a second
// server on the same file, the sqlite3 shell); within this process the
// single writer connection means no waiting on SQLite's lock.
const busyTimeout = 10 * time.Second

// Open opens the store at path, creating the file and migrating its
// schema to the current version.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" || strings.ContainsAny(path, "?#") {
		// The driver reads what follows a "?" as its options.
		return nil, fmt.Errorf("sqlite: path %q: %w", path, errdefs.ErrInvalidArgument)
	}
	// The file may hold tenants' metadata; SQLite would create it (and so
	// its -wal and -shm, which copy its mode) readable by all.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	f.Close()

	common := fmt.Sprintf("_pragma=busy_timeout(%d)&_pragma=foreign_keys(0)", busyTimeout.Milliseconds())
	// IMMEDIATE: a write transaction takes the write lock when it begins,
	// so it cannot fail to upgrade a read lock halfway through.
	w, err := sql.Open("sqlite", path+"?"+common+"&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxIdleTime(0)
	w.SetConnMaxLifetime(0)
	if err := migrate(ctx, w); err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: %s: %w", path, err)
	}

	r, err := sql.Open("sqlite", path+"?"+common+"&_pragma=query_only(1)")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	r.SetConnMaxIdleTime(0)
	r.SetConnMaxLifetime(0)
	s := &Store{w: w, r: r}
	if err := s.Ping(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Ping checks that both the writer and a reader answer.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.w.PingContext(ctx); err != nil {
		return dbErr("ping", err)
	}
	if err := s.r.PingContext(ctx); err != nil {
		return dbErr("ping", err)
	}
	return nil
}

// Close closes the connections. WAL is checkpointed when the last one
// closes.
func (s *Store) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

// write runs fn in a transaction on the write connection. fn must not use
// s.w itself: the transaction holds its only connection.
func (s *Store) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// dbErr wraps an error of the database in the operation that failed and,
// where one fits, an errdefs category.
func dbErr(op string, err error) error {
	var e *driver.Error
	if errors.As(err, &e) {
		switch e.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return fmt.Errorf("sqlite: %s: %w: %w", op, errdefs.ErrUnavailable, err)
		case sqlite3.SQLITE_FULL:
			return fmt.Errorf("sqlite: %s: %w: %w", op, errdefs.ErrResourceExhausted, err)
		}
	}
	return fmt.Errorf("sqlite: %s: %w", op, err)
}

// isDuplicate reports whether err is the violation of a primary key.
func isDuplicate(err error) bool {
	var e *driver.Error
	return errors.As(err, &e) && (e.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY || e.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE)
}

// Times are stored as microseconds since the Unix epoch (the precision
// PostgreSQL keeps too), and a zero time as NULL so that it reads back as
// zero rather than as year 1 in UTC.
func micros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

func fromMicros(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return time.UnixMicro(n.Int64).UTC()
}

// rawJSON stores an empty document as NULL, so it reads back as nil.
func rawJSON(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return []byte(b)
}

func fromRawJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	return json.RawMessage(b)
}

// required reports a missing key field as ErrInvalidArgument.
func required(what string, fields ...string) error {
	for i := 0; i < len(fields); i += 2 {
		if fields[i+1] == "" {
			return fmt.Errorf("%s: %s is required: %w", what, fields[i], errdefs.ErrInvalidArgument)
		}
	}
	return nil
}
