// Package postgres is the metadata store of sbx servers that share one
// PostgreSQL database (scale-out), on github.com/jackc/pgx/v5 and its pool.
//
// Servers starting at once migrate the schema once (see migrate). Every
// call is one statement, or one transaction where a call writes several
// tables, in READ COMMITTED: the store keeps no state of its own, so any
// number of servers can use one database.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

var _ store.Store = (*Store)(nil)

// Store is a store.Store on a PostgreSQL database.
type Store struct {
	pool *pgxpool.Pool
}

// connectTimeout bounds each connection attempt when the URL sets no
// connect_timeout: a server that cannot reach its database says so rather
// than hang at start.
const connectTimeout = 10 * time.Second

// Open connects to the database at rawURL
// (postgres://user:password@host:port/database?sslmode=...) and migrates
// its schema to the current version. The URL may also set pgx's pool
// parameters (pool_max_conns, ...). Its error is one line, without the
// password: errdefs.ErrInvalidArgument for a malformed URL,
// errdefs.ErrUnavailable when the server cannot be reached.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	cfg, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %s", oneLine(err.Error()))
	}
	// The pool connects lazily: connect now, to fail here and clearly.
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, connectErr(cfg, err)
	}
	if err := migrate(ctx, pool, migrations); err != nil {
		pool.Close()
		return nil, dbErr("migrate", err)
	}
	return &Store{pool: pool}, nil
}

// parseURL checks rawURL and makes the pool's configuration of it.
func parseURL(rawURL string) (*pgxpool.Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error repeats the URL, password and all: keep its reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("postgres: malformed URL: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		// Not even the redacted URL: a key=value string is all path,
		// password included.
		return nil, fmt.Errorf("postgres: malformed URL: scheme %q, want postgres://user:password@host:port/database: %w",
			u.Scheme, errdefs.ErrInvalidArgument)
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		// pgx's message names the URL with its password masked.
		return nil, fmt.Errorf("postgres: malformed URL: %s: %w", oneLine(err.Error()), errdefs.ErrInvalidArgument)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	return cfg, nil
}

// connectErr makes one line of a failure to connect: pgx's lists every
// address and TLS mode it tried, on lines of their own.
func connectErr(cfg *pgxpool.Config, err error) error {
	c := cfg.ConnConfig
	where := fmt.Sprintf("postgres: connect to %s as %q, database %q", net.JoinHostPort(c.Host, fmt.Sprint(c.Port)), c.User, c.Database)
	var pgErr *pgconn.PgError
	var netErr net.Error
	switch {
	case errors.As(err, &pgErr):
		// The server answered: what it said (a bad password, no such
		// database) is the reason, whatever the other attempts hit.
		return &openError{msg: fmt.Sprintf("%s: %s (SQLSTATE %s)", where, pgErr.Message, pgErr.Code), err: pgErr, kind: category(pgErr)}
	case errors.Is(err, context.Canceled):
		return &openError{msg: where + ": canceled", err: err}
	case errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err):
		return &openError{msg: where + ": timed out", err: err, kind: errdefs.ErrUnavailable}
	case errors.As(err, &netErr):
		return &openError{msg: where + ": " + oneLine(netErr.Error()), err: err, kind: errdefs.ErrUnavailable}
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		// Closed before the server said a word: something between (a
		// proxy, a network not yet open to this client) or a server
		// going away; worth another try, as a refused one is.
		return &openError{msg: where + ": the connection was closed before the server answered", err: err, kind: errdefs.ErrUnavailable}
	}
	// pgx's own message: the last attempt's, without the user and
	// database it starts with.
	msg := err.Error()
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Unwrap() != nil {
		msg = ce.Unwrap().Error()
	}
	return &openError{msg: where + ": " + lastLine(msg), err: err}
}

// openError is Open's error: a message of one line, the driver's error
// and the errdefs category (nil for none) for errors.Is and errors.As.
type openError struct {
	msg  string
	err  error
	kind error
}

func (e *openError) Error() string {
	if e.kind == nil {
		return e.msg
	}
	return e.msg + ": " + e.kind.Error()
}

func (e *openError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.kind, e.err}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.TrimSpace(s[strings.LastIndex(s, "\n")+1:])
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return dbErr("ping", err)
	}
	return nil
}

// Close closes the connections, waiting for those in use.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// tx runs fn in a transaction.
func (s *Store) tx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
}

// dbErr wraps an error of the database in the operation that failed and,
// where one fits, an errdefs category.
func dbErr(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if kind := category(pgErr); kind != nil {
			return fmt.Errorf("postgres: %s: %w: %w", op, kind, err)
		}
		return fmt.Errorf("postgres: %s: %w", op, err)
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return fmt.Errorf("postgres: %s: %w: %w", op, errdefs.ErrUnavailable, err)
	}
	return fmt.Errorf("postgres: %s: %w", op, err)
}

// category maps the server's SQLSTATE to an errdefs category, nil for
// none (a bug, a bad password).
func category(e *pgconn.PgError) error {
	switch {
	case e.Code == "53100" || e.Code == "53200": // disk full, out of memory
		return errdefs.ErrResourceExhausted
	case e.Code == "40001" || e.Code == "40P01", // serialization failure, deadlock: retry
		strings.HasPrefix(e.Code, "08"),  // connection exception
		strings.HasPrefix(e.Code, "53"),  // too many connections, ...
		strings.HasPrefix(e.Code, "57P"): // shutting down, starting up
		return errdefs.ErrUnavailable
	case strings.HasPrefix(e.Code, "22"), // data exception: NUL in a string, JSON that is not
		strings.HasPrefix(e.Code, "54"): // program limit: an index key over 2.7 kB
		return errdefs.ErrInvalidArgument
	case e.Code == "3D000": // no such database
		return errdefs.ErrNotFound
	}
	return nil
}

// isDuplicate reports whether err is the violation of a unique key.
func isDuplicate(err error) bool {
	var e *pgconn.PgError
	return errors.As(err, &e) && e.Code == "23505"
}

// ts is a time as the store keeps it: to the microsecond, as page tokens
// do, and NULL when zero so that it reads back as zero.
func ts(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return time.UnixMicro(t.UnixMicro()).UTC()
}

func fromTS(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
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
