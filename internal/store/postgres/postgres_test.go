package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/postgres"
	"github.com/sbx-sandbox/sbx/internal/store/storetest"
	"github.com/sbx-sandbox/sbx/internal/testenv/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.WithCluster(m)) }

var ctx = context.Background()

// open opens a store on a fresh database.
func open(t testing.TB) *postgres.Store {
	s, err := postgres.Open(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// connect opens a plain connection, to look at what the store wrote.
func connect(t testing.TB, url string) *pgx.Conn {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	return conn
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
}

func TestReopen(t *testing.T) {
	url := pgtest.URL(t)
	s, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSession(ctx, &store.Session{Tenant: "t", ID: "s", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = postgres.Open(ctx, url)
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	if _, err := s.GetSession(ctx, "t", "s"); err != nil {
		t.Errorf("after reopening: %v", err)
	}
	s.Close()

	// A database a newer binary migrated is refused rather than misread.
	conn := connect(t, url)
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES (1000)`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if s, err := postgres.Open(ctx, url); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		if s != nil {
			s.Close()
		}
		t.Errorf("opening a newer schema = %v, want ErrFailedPrecondition", err)
	}
}

// TestOpenConcurrently: servers starting at once on a new database migrate
// it once, and none of them fails for the others.
func TestOpenConcurrently(t *testing.T) {
	url := pgtest.URL(t)
	const n = 8
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		stores = make([]*postgres.Store, n)
		errs   = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = postgres.Open(ctx, url)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open %d: %v", i, err)
			continue
		}
		defer stores[i].Close()
	}
	if t.Failed() {
		return
	}

	conn := connect(t, url)
	rows, err := conn.Query(ctx, `SELECT version, count(*) FROM schema_migrations GROUP BY version ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int, error) {
		var v [2]int
		return v, r.Scan(&v[0], &v[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) == 0 {
		t.Fatal("no migration recorded")
	}
	for i, c := range counts {
		if c[0] != i+1 || c[1] != 1 {
			t.Errorf("schema_migrations: version %d recorded %d times; want versions 1.. recorded once each: %v", c[0], c[1], counts)
		}
	}

	// Each store works on the schema, and sees the others' writes.
	for i, s := range stores {
		if err := s.CreateSession(ctx, &store.Session{Tenant: "t", ID: fmt.Sprint(i), CreatedAt: time.Now()}); err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	if list, _, err := stores[0].ListSessions(ctx, store.SessionFilter{Tenant: "t"}); err != nil || len(list) != n {
		t.Errorf("ListSessions = %d sessions, %v; want %d", len(list), err, n)
	}
}

// TestOpenErrors: what a misconfigured server says is one line, in its
// category, without the password.
func TestOpenErrors(t *testing.T) {
	const secret = "s3cr3t-pa55"
	good, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	wrongPassword := *good
	wrongPassword.User = url.UserPassword(good.User.Username(), secret)
	noDatabase := *good
	noDatabase.Path = "/no_such_database"

	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()

	for _, tc := range []struct {
		name, url string
		want      error  // the category, nil for none
		says      string // part of the message
	}{
		{"not a URL", "postgres://u:" + secret + "@localhost:port/db", errdefs.ErrInvalidArgument, "malformed URL"},
		{"another scheme", "mysql://u:" + secret + "@localhost/db", errdefs.ErrInvalidArgument, "want postgres://"},
		{"a DSN", "host=localhost password=" + secret, errdefs.ErrInvalidArgument, "malformed URL"},
		{"empty", "", errdefs.ErrInvalidArgument, "malformed URL"},
		{"bad parameter", "postgres://u:" + secret + "@localhost/db?sslmode=sometimes", errdefs.ErrInvalidArgument, "sslmode"},
		{"unreachable", "postgres://u:" + secret + "@" + closed + "/db", errdefs.ErrUnavailable, "connection refused"},
		{"unreachable, TLS preferred", "postgres://u:" + secret + "@" + closed + "/db?sslmode=prefer", errdefs.ErrUnavailable, "connection refused"},
		{"wrong password", wrongPassword.String(), nil, "password authentication failed"},
		{"TLS required, not served", good.String() + "&sslmode=require", nil, "TLS"},
		{"no database", noDatabase.String(), errdefs.ErrNotFound, "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := postgres.Open(ctx, tc.url)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			msg := err.Error()
			t.Log(msg)
			if strings.ContainsAny(msg, "\n\r") {
				t.Errorf("error is more than one line: %q", msg)
			}
			if strings.Contains(msg, secret) {
				t.Errorf("error shows the password: %q", msg)
			}
			if !strings.Contains(msg, tc.says) {
				t.Errorf("error %q does not say %q", msg, tc.says)
			}
			for _, kind := range []error{errdefs.ErrInvalidArgument, errdefs.ErrUnavailable, errdefs.ErrNotFound} {
				if errors.Is(err, kind) != (kind == tc.want) {
					t.Errorf("errors.Is(err, %v) = %v", kind, !(kind == tc.want))
				}
			}
		})
	}
}

// TestText: what PostgreSQL's text and JSON types refuse, and SQLite keeps,
// is an invalid argument; a NUL escaped in an execution's JSON is kept.
func TestText(t *testing.T) {
	s := open(t)
	now := time.Now()
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"NUL in an id", s.CreateSession(ctx, &store.Session{Tenant: "t", ID: "a\x00b", CreatedAt: now})},
		{"invalid UTF-8 in metadata", s.CreateSession(ctx, &store.Session{Tenant: "t", ID: "s", CreatedAt: now,
			Metadata: map[string]string{"k": "\xff"}})},
		{"config that is not JSON", s.CreateSession(ctx, &store.Session{Tenant: "t", ID: "s", CreatedAt: now,
			Config: json.RawMessage(`{"a":`)})},
	} {
		if !errors.Is(tc.err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tc.name, tc.err)
		}
	}

	// A program's output can hold NUL; encoding/json escapes it.
	res, err := json.Marshal(map[string]string{"stdout": "a\x00b"})
	if err != nil {
		t.Fatal(err)
	}
	x := &store.Execution{Tenant: "t", ID: "x", SessionID: "s", Status: "completed", Result: res, CreatedAt: now}
	if err := s.CreateExecution(ctx, x); err != nil {
		t.Fatalf("CreateExecution with \\u0000 in its result: %v", err)
	}
	got, err := s.GetExecution(ctx, "t", "x")
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]string
	if err := json.Unmarshal(got.Result, &out); err != nil || out["stdout"] != "a\x00b" {
		t.Errorf("Result = %s, %v; want %s", got.Result, err, res)
	}
}

// TestAfterClose: calls on a closed store fail rather than hang or panic.
func TestAfterClose(t *testing.T) {
	s := open(t)
	s.Close()
	if _, err := s.GetSession(ctx, "t", "s"); err == nil {
		t.Error("GetSession after Close succeeded")
	}
	if err := s.CreateSession(ctx, &store.Session{Tenant: "t", ID: "s", CreatedAt: time.Now()}); err == nil {
		t.Error("CreateSession after Close succeeded")
	}
	if err := s.Ping(ctx); err == nil {
		t.Error("Ping after Close succeeded")
	}
}

// TestOpenTimeout: a server that accepts connections and never answers
// (a wedged one, a proxy without its backend) ends in the caller's
// deadline, as unavailable.
func TestOpenTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	defer func() { l.Close(); <-done }()

	ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	s, err := postgres.Open(ctx, "postgres://u:p@"+l.Addr().String()+"/db?sslmode=disable")
	if err == nil {
		s.Close()
		t.Fatal("Open succeeded")
	}
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "timed out") || strings.Contains(err.Error(), "\n") {
		t.Errorf("Open = %q, want one line saying it timed out, ErrUnavailable", err)
	}
}
