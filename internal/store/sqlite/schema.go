package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// migrations[i] takes the schema from version i to i+1; PRAGMA user_version
// holds the version a file is at. Append to change the schema; never edit
// an entry a release has shipped.
var migrations = []string{
	// 1: the first schema.
	//
	// Times are INTEGER microseconds since the epoch, NULL when zero.
	// WITHOUT ROWID: every table is looked up by its text primary key, so
	// clustering the rows on it saves a second b-tree lookup.
	`
CREATE TABLE sessions (
	tenant           TEXT NOT NULL,
	id               TEXT NOT NULL,
	status           TEXT NOT NULL,
	template_id      TEXT NOT NULL,
	sandbox_id       TEXT NOT NULL,
	error_message    TEXT NOT NULL,
	metadata         TEXT NOT NULL, -- JSON object: what reads return
	config           BLOB,
	created_at       INTEGER NOT NULL,
	updated_at       INTEGER,
	last_activity_at INTEGER,
	expires_at       INTEGER,
	PRIMARY KEY (tenant, id)
) WITHOUT ROWID;
CREATE INDEX sessions_by_created ON sessions (tenant, created_at, id);
CREATE INDEX sessions_by_status ON sessions (tenant, status, created_at, id);

-- session_metadata repeats sessions.metadata one pair a row, and the
-- session's created_at, so that the sessions with a pair, newest first, are
-- a walk of one index that stops when the page is full: no scan of the
-- tenant's sessions, no sort of the matches.
CREATE TABLE session_metadata (
	tenant     TEXT NOT NULL,
	session_id TEXT NOT NULL,
	key        TEXT NOT NULL,
	value      TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (tenant, session_id, key)
) WITHOUT ROWID;
CREATE INDEX session_metadata_by_pair ON session_metadata (tenant, key, value, created_at, session_id);

CREATE TABLE executions (
	id              TEXT NOT NULL PRIMARY KEY,
	tenant          TEXT NOT NULL,
	session_id      TEXT NOT NULL,
	status          TEXT NOT NULL,
	language        TEXT NOT NULL,
	conversation_id TEXT NOT NULL,
	context_id      TEXT NOT NULL,
	request         BLOB,
	result          BLOB,
	created_at      INTEGER NOT NULL,
	started_at      INTEGER,
	finished_at     INTEGER
) WITHOUT ROWID;
CREATE INDEX executions_by_session ON executions (tenant, session_id, created_at, id);
-- Counting by status and finding the unfinished at start read only this.
CREATE INDEX executions_by_status ON executions (status);

CREATE TABLE uploads (
	tenant          TEXT NOT NULL,
	session_id      TEXT NOT NULL,
	path            TEXT NOT NULL,
	conversation_id TEXT NOT NULL,
	size            INTEGER NOT NULL,
	sha256          TEXT NOT NULL,
	created_at      INTEGER,
	PRIMARY KEY (tenant, session_id, path)
) WITHOUT ROWID;
CREATE INDEX uploads_by_conversation ON uploads (tenant, session_id, conversation_id, path);
`,
	// 2: the reaper's schedule. A partial index: sessions that are never
	// due (terminated ones) cost it nothing.
	`
ALTER TABLE sessions ADD COLUMN due_at INTEGER;
CREATE INDEX sessions_by_due ON sessions (due_at) WHERE due_at IS NOT NULL;
`,
	// 3: what a session may store, summed per tenant for its quota.
	// Sessions made before it count 0.
	`
ALTER TABLE sessions ADD COLUMN disk_mb INTEGER NOT NULL DEFAULT 0;
`,
	// 4: a session's revision, the compare-and-swap of UpdateSession.
	// Sessions made before it are at revision 1, as if just created.
	`
ALTER TABLE sessions ADD COLUMN revision INTEGER NOT NULL DEFAULT 1;
`,
	// 5: leases, expiring at microseconds of this server's clock. A
	// released lease keeps its row, expired, so that its token keeps
	// growing.
	`
CREATE TABLE leases (
	name       TEXT NOT NULL PRIMARY KEY,
	holder     TEXT NOT NULL,
	token      INTEGER NOT NULL,
	expires_at INTEGER NOT NULL
) WITHOUT ROWID;
`,
	// 6: the server that runs an execution; '' for those made before.
	`
ALTER TABLE executions ADD COLUMN owner TEXT NOT NULL DEFAULT '';
`,
	// 7: documents (templates, webhooks, conversations) and events,
	// numbered per tenant by event_seqs so that a tenant's numbers neither
	// show another tenant's activity nor start again after a trim.
	`
CREATE TABLE documents (
	kind       TEXT NOT NULL,
	tenant     TEXT NOT NULL,
	key        TEXT NOT NULL,
	value      BLOB NOT NULL,
	revision   INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (kind, tenant, key)
) WITHOUT ROWID;
CREATE TABLE event_seqs (
	tenant TEXT NOT NULL PRIMARY KEY,
	seq    INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE events (
	tenant     TEXT NOT NULL,
	seq        INTEGER NOT NULL,
	session_id TEXT NOT NULL,
	type       TEXT NOT NULL,
	data       BLOB,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (tenant, seq)
) WITHOUT ROWID;
CREATE INDEX events_by_session ON events (tenant, session_id, seq);
CREATE INDEX events_by_time ON events (created_at);
`,
	// 8: what each execution's record takes (request and result, in
	// bytes), so that a tenant's history is held to a size: a walk of
	// the tenant's rows in this index, newest first, never reads a
	// request or a result.
	`
ALTER TABLE executions ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
UPDATE executions SET bytes = COALESCE(length(CAST(request AS BLOB)), 0) + COALESCE(length(CAST(result AS BLOB)), 0);
CREATE INDEX executions_by_tenant ON executions (tenant, created_at, id, status, bytes);
`,
}

// migrate brings the schema to the newest version. It runs in one
// IMMEDIATE transaction, so two processes opening a new file at once
// migrate it once.
func migrate(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return dbErr("migrate", err)
	}
	defer tx.Rollback()
	var v int
	if err := tx.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil {
		return dbErr("migrate", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this binary's %d: %w", v, len(migrations), errdefs.ErrFailedPrecondition)
	}
	if v == len(migrations) {
		return nil
	}
	for i := v; i < len(migrations); i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return dbErr(fmt.Sprintf("migrate to version %d", i+1), err)
		}
	}
	// PRAGMA takes no parameters; the value is an int.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, len(migrations))); err != nil {
		return dbErr("migrate", err)
	}
	if err := tx.Commit(); err != nil {
		return dbErr("migrate", err)
	}
	return nil
}
