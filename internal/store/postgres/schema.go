package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// migrations[i] takes the schema from version i to i+1; schema_migrations
// records the versions a database has. Append to change the schema; never
// edit an entry a release has shipped.
var migrations = []string{
	// 1: the schema of sqlite's version 3.
	//
	// Every text column is COLLATE "C": byte order, whatever the
	// database's default, so that ids and paths sort as Go compares them
	// and a path's subtree is the range [path/, path0) (see DeleteUploads).
	// Times are timestamptz (microseconds), NULL when zero.
	`
CREATE TABLE sessions (
	tenant           text COLLATE "C" NOT NULL,
	id               text COLLATE "C" NOT NULL,
	status           text COLLATE "C" NOT NULL,
	template_id      text COLLATE "C" NOT NULL,
	sandbox_id       text COLLATE "C" NOT NULL,
	error_message    text COLLATE "C" NOT NULL,
	metadata         jsonb NOT NULL, -- an object: what reads return
	config           json,
	created_at       timestamptz NOT NULL,
	updated_at       timestamptz,
	last_activity_at timestamptz,
	expires_at       timestamptz,
	due_at           timestamptz,
	disk_mb          bigint NOT NULL,
	PRIMARY KEY (tenant, id)
);
CREATE INDEX sessions_by_created ON sessions (tenant, created_at, id);
CREATE INDEX sessions_by_status ON sessions (tenant, status, created_at, id);
-- The reaper's schedule. Partial: sessions that are never due (terminated
-- ones) cost it nothing.
CREATE INDEX sessions_by_due ON sessions (due_at) WHERE due_at IS NOT NULL;

-- session_metadata repeats sessions.metadata one pair a row, and the
-- session's created_at, so that the sessions with a pair, newest first, are
-- a walk of one index that stops when the page is full.
CREATE TABLE session_metadata (
	tenant     text COLLATE "C" NOT NULL,
	session_id text COLLATE "C" NOT NULL,
	key        text COLLATE "C" NOT NULL,
	value      text COLLATE "C" NOT NULL,
	created_at timestamptz NOT NULL,
	PRIMARY KEY (tenant, session_id, key)
);
CREATE INDEX session_metadata_by_pair ON session_metadata (tenant, key, value, created_at, session_id);

-- request and result are json, not jsonb: the store never looks inside
-- them, json keeps them as sent without parsing them into a tree (a result
-- can be tens of MiB), and jsonb refuses \u0000, which a program's output
-- can hold.
CREATE TABLE executions (
	id              text COLLATE "C" NOT NULL PRIMARY KEY,
	tenant          text COLLATE "C" NOT NULL,
	session_id      text COLLATE "C" NOT NULL,
	status          text COLLATE "C" NOT NULL,
	language        text COLLATE "C" NOT NULL,
	conversation_id text COLLATE "C" NOT NULL,
	context_id      text COLLATE "C" NOT NULL,
	request         json,
	result          json,
	created_at      timestamptz NOT NULL,
	started_at      timestamptz,
	finished_at     timestamptz
);
CREATE INDEX executions_by_session ON executions (tenant, session_id, created_at, id);
-- Counting by status and finding the unfinished at start read only this.
CREATE INDEX executions_by_status ON executions (status);

CREATE TABLE uploads (
	tenant          text COLLATE "C" NOT NULL,
	session_id      text COLLATE "C" NOT NULL,
	path            text COLLATE "C" NOT NULL,
	conversation_id text COLLATE "C" NOT NULL,
	size            bigint NOT NULL,
	sha256          text COLLATE "C" NOT NULL,
	created_at      timestamptz,
	PRIMARY KEY (tenant, session_id, path)
);
CREATE INDEX uploads_by_conversation ON uploads (tenant, session_id, conversation_id, path);
`,
	// 2: a session's revision, the compare-and-swap of UpdateSession.
	// Sessions made before it are at revision 1, as if just created. (A
	// constant default: PostgreSQL adds the column without rewriting the
	// table.)
	`
ALTER TABLE sessions ADD COLUMN revision bigint NOT NULL DEFAULT 1;
`,
	// 3: leases. A released lease keeps its row, expired, so that its
	// token keeps growing.
	`
CREATE TABLE leases (
	name       text COLLATE "C" NOT NULL PRIMARY KEY,
	holder     text COLLATE "C" NOT NULL,
	token      bigint NOT NULL,
	expires_at timestamptz NOT NULL
);
`,
	// 4: the server that runs an execution; '' for those made before.
	`
ALTER TABLE executions ADD COLUMN owner text COLLATE "C" NOT NULL DEFAULT '';
`,
	// 5: documents (templates, webhooks, conversations) and events,
	// numbered per tenant by event_seqs: its row lock, held until the
	// appending transaction commits, makes a tenant's numbers follow
	// commit order, so a reader that saw n has seen everything before n.
	`
CREATE TABLE documents (
	kind       text COLLATE "C" NOT NULL,
	tenant     text COLLATE "C" NOT NULL,
	key        text COLLATE "C" NOT NULL,
	value      jsonb NOT NULL,
	revision   bigint NOT NULL,
	created_at timestamptz NOT NULL,
	updated_at timestamptz NOT NULL,
	PRIMARY KEY (kind, tenant, key)
);
CREATE TABLE event_seqs (
	tenant text COLLATE "C" NOT NULL PRIMARY KEY,
	seq    bigint NOT NULL
);
CREATE TABLE events (
	tenant     text COLLATE "C" NOT NULL,
	seq        bigint NOT NULL,
	session_id text COLLATE "C" NOT NULL,
	type       text COLLATE "C" NOT NULL,
	data       jsonb,
	created_at timestamptz NOT NULL,
	PRIMARY KEY (tenant, seq)
);
CREATE INDEX events_by_session ON events (tenant, session_id, seq);
CREATE INDEX events_by_time ON events (created_at);
`,
	// 6: what each execution's record takes (request and result, in
	// bytes), so that a tenant's history is held to a size: a walk of the
	// tenant's rows in this index, newest first, never reads a request or
	// a result.
	`
ALTER TABLE executions ADD COLUMN bytes bigint NOT NULL DEFAULT 0;
UPDATE executions SET bytes = COALESCE(octet_length(request::text), 0) + COALESCE(octet_length(result::text), 0);
CREATE INDEX executions_by_tenant ON executions (tenant, created_at, id) INCLUDE (status, bytes);
`,
}

// migrationLock is the key of the advisory lock a migration holds: any
// fixed number, the same in every release. Advisory locks are per
// database, so stores of other databases on the server do not wait on it.
const migrationLock = 0x7362785f6d696772 // "sbx_migr"

// migrate brings the schema to the newest version of list, one migration
// per transaction. Servers starting at once migrate a database once: each
// transaction first takes the advisory lock, then reads the version, so
// the second server to get the lock sees what the first committed.
func migrate(ctx context.Context, pool *pgxpool.Pool, list []string) error {
	for {
		done, err := migrateOne(ctx, pool, list)
		if err != nil || done {
			return err
		}
	}
}

// migrateOne applies the first migration of list the database lacks, and
// reports whether there was none.
func migrateOne(ctx context.Context, pool *pgxpool.Pool, list []string) (done bool, err error) {
	// READ COMMITTED: each statement sees what was committed before it
	// began, so the version read after the lock is granted is current. In
	// REPEATABLE READ the snapshot would date from before the wait.
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    integer PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var v int
		if err := tx.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
			return err
		}
		switch {
		case v > len(list):
			return fmt.Errorf("schema version %d is newer than this binary's %d: %w", v, len(list), errdefs.ErrFailedPrecondition)
		case v == len(list):
			done = true
			return nil
		}
		if _, err := tx.Exec(ctx, list[v]); err != nil {
			return fmt.Errorf("migrate to version %d: %w", v+1, err)
		}
		_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, v+1)
		return err
	})
	return done, err
}
