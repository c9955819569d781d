package main

// The scale measures (-only scale, or one of them with -only scale-http,
// scale-records, scale-blob or scale-reaper): the backends of a
// deployment with several servers against the embedded defaults, side by
// side in one run, each ratio against the default measured in that run.
//
//	(n) HTTP execution round trip, and create -> first result: the
//	    PostgreSQL metadata store against SQLite.
//	(o) creating a session record with 10,000 in the store: PostgreSQL
//	    against SQLite (measureRecords, as -only records).
//	(p) hibernating and restoring a 100 MB workspace: the blob store on
//	    MinIO (s3://) against local files (file://).
//	(q) a reaper pass over 10,000 hibernated sessions: PostgreSQL against
//	    SQLite.
//
// PostgreSQL and MinIO are throwaway servers this process starts, as the
// tests do (internal/testenv/pgtest, miniotest), on loopback: the
// figures are the backends' own cost, without a network between hosts.
// The cluster is the tests' one, tuned for speed (fsync and
// synchronous_commit off); SQLite runs as sbx serve runs it (WAL,
// synchronous=NORMAL), so neither waits for the disk at commit. Without
// the binaries (scripts/setup.sh installs both) a measure says so and is
// skipped.

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv/miniotest"
	"github.com/sbx-sandbox/sbx/internal/testenv/pgtest"
)

// scaleEnv starts PostgreSQL and MinIO when a measure first needs them.
type scaleEnv struct {
	pg       *pgtest.Cluster
	pgErr    error
	minio    bool
	minioErr error
}

// benchScale runs the scale measures which names: "scale" for all.
func benchScale(ctx context.Context, which string, add func(row)) {
	var env scaleEnv
	defer env.stop()
	all := which == "scale"
	if all || which == "scale-http" {
		benchScaleHTTP(ctx, &env, add)
	}
	if all || which == "scale-records" {
		benchScaleRecords(ctx, &env, add)
	}
	if all || which == "scale-blob" {
		benchScaleBlob(ctx, &env, add)
	}
	if all || which == "scale-reaper" {
		benchScaleReaper(ctx, &env, add)
	}
}

// postgres returns the URL of a fresh database, starting the cluster on
// first use; without one it adds a row saying the measure is skipped.
func (e *scaleEnv) postgres(measure string, add func(row)) (string, bool) {
	if e.pg == nil && e.pgErr == nil {
		if e.pgErr = pgtest.Available(); e.pgErr == nil {
			fmt.Fprintln(os.Stderr, "bench: starting a throwaway PostgreSQL")
			e.pg, e.pgErr = pgtest.Start()
		}
	}
	if e.pgErr != nil {
		skipped(measure, e.pgErr, add)
		return "", false
	}
	url, err := e.pg.NewDatabase()
	if err != nil {
		log.Fatal(err)
	}
	return url, true
}

// bucket returns the URL of a fresh MinIO bucket, starting MinIO on first
// use; without it it adds a row saying the measure is skipped.
func (e *scaleEnv) bucket(measure string, add func(row)) (string, bool) {
	if e.minioErr == nil {
		b, err := miniotest.Start("bench")
		if err == nil {
			if !e.minio {
				fmt.Fprintln(os.Stderr, "bench: started a throwaway MinIO at", b.Endpoint)
			}
			e.minio = true
			return b.URL, true
		}
		e.minioErr = err
	}
	skipped(measure, e.minioErr, add)
	return "", false
}

func skipped(measure string, why error, add func(row)) {
	fmt.Fprintf(os.Stderr, "bench: %s: skipped: %v\n", measure, why)
	add(row{name: measure + ": skipped", vs: why.Error()})
}

func (e *scaleEnv) stop() {
	if e.minio {
		miniotest.Stop()
	}
	if e.pg != nil {
		if err := e.pg.Stop(); err != nil {
			log.Print(err)
		}
	}
}

func withStore(url string) func(*app.Config) { return func(c *app.Config) { c.Store = url } }

// scaleDir is the data directory of one of the scale measures' control
// planes.
func scaleDir(name string) string { return filepath.Join(*dataDir, "bench-scale-"+name) }

// noSandboxes is the runtime of a control plane that only keeps records
// and files.
func noSandboxes(string) (runtime.Runtime, error) {
	return nil, fmt.Errorf("records and files only: %w", errdefs.ErrUnavailable)
}

// plus is a's p50 against the baseline's: the difference and the ratio.
func plus(a, base time.Duration, what string) string {
	d := a - base
	sign := "+"
	if d < 0 {
		sign, d = "-", -d
	}
	return fmt.Sprintf("%s%s, %s", sign, fmtDur(d), ratio(a, base, what))
}

// benchScaleHTTP (n) measures the execution round trip over HTTP and a new
// session's first result with the PostgreSQL store against SQLite: two
// control planes up at once, their samples taken in turn, so that the
// other load on the machine falls on both alike.
func benchScaleHTTP(ctx context.Context, env *scaleEnv, add func(row)) {
	const measureName = "(n) HTTP round trip, PostgreSQL store vs SQLite"
	url, ok := env.postgres(measureName, add)
	if !ok {
		return
	}
	ensure(ctx, template.NewStore(filepath.Join(*dataDir, "templates")), "python")
	var withRT func(string) (runtime.Runtime, error) // the bench's runc (startControlPlane)
	lite := startControlPlane(scaleDir("http-sqlite"), withRT)
	defer lite.stop()
	pg := startControlPlane(scaleDir("http-pg"), withRT, withStore(url))
	defer pg.stop()
	// The same two without lifecycle events, as they were before
	// them: what recording an execution's start and end costs its round
	// trip, measured in the same turns.
	offURL, ok := env.postgres(measureName, add)
	if !ok {
		return
	}
	eventsOff := func(c *app.Config) { c.Events.Off = true }
	liteOff := startControlPlane(scaleDir("http-sqlite-off"), withRT, eventsOff)
	defer liteOff.stop()
	pgOff := startControlPlane(scaleDir("http-pg-off"), withRT, withStore(offURL), eventsOff)
	defer pgOff.stop()
	cps := [4]*controlPlane{lite, pg, liteOff, pgOff}

	for _, cp := range cps {
		if _, _, err := cp.c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "rt", TemplateID: "python"}); err != nil {
			log.Fatal(err)
		}
		for range 20 {
			mustExec(ctx, cp.c, "rt", "print(1)")
		}
	}
	var trip [4]samples
	for range *rounds {
		for j, cp := range cps {
			time.Sleep(*pause)
			t0 := time.Now()
			mustExec(ctx, cp.c, "rt", "print(1)")
			trip[j] = append(trip[j], time.Since(t0))
		}
	}
	// The cluster's transaction counter counts both databases' writes:
	// each server's are counted while it alone runs.
	writesOf := func(cp *controlPlane) float64 {
		const n = 50
		w0 := pgWrites(ctx, url)
		for range n {
			time.Sleep(*pause)
			mustExec(ctx, cp.c, "rt", "print(1)")
		}
		return float64(pgWrites(ctx, url)-w0-1) / n
	}
	writes, writesOff := writesOf(pg), writesOf(pgOff)
	var first [4]samples
	for i := range *httpCreates {
		for j, cp := range cps {
			id := fmt.Sprintf("first-%d", i)
			t0 := time.Now()
			if _, _, err := cp.c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: "python"}); err != nil {
				log.Fatal(err)
			}
			mustExec(ctx, cp.c, id, "print(1)")
			first[j] = append(first[j], time.Since(t0))
		}
	}
	for _, cp := range cps {
		for i := range *httpCreates {
			cp.c.DeleteSession(ctx, fmt.Sprintf("first-%d", i))
		}
		cp.c.DeleteSession(ctx, "rt")
	}
	ping := pgPing(ctx, url)
	for j := range cps {
		sortSamples(trip[j])
		sortSamples(first[j])
	}
	add(row{name: fmt.Sprintf("(n) HTTP round trip print(1), %v apart: SQLite store", *pause), p50: trip[0].p(50), p99: trip[0].p(99),
		vs: "p95 " + fmtDur(trip[0].p(95))})
	add(row{name: "    same, PostgreSQL store", p50: trip[1].p(50), p99: trip[1].p(99), goal: "< +1 ms p50",
		vs: fmt.Sprintf("p95 %s; %s", fmtDur(trip[1].p(95)), plus(trip[1].p(50), trip[0].p(50), "SQLite"))})
	add(row{name: "    PostgreSQL: SELECT 1 from Go (pgx), one round trip", p50: ping.p(50), p99: ping.p(99),
		vs: fmt.Sprintf("%.1f write transactions per execution (%.1f without events)", writes, writesOff)})
	add(row{name: "    HTTP create session -> first result (python, lazy): SQLite", p50: first[0].p(50), p99: first[0].p(99)})
	add(row{name: "    same, PostgreSQL store", p50: first[1].p(50), p99: first[1].p(99),
		vs: plus(first[1].p(50), first[0].p(50), "SQLite")})
	for j, store := range []string{"SQLite", "PostgreSQL"} {
		on, off := trip[j], trip[j+2]
		add(row{name: "    round trip without events (before R-87): " + store, p50: off.p(50), p99: off.p(99),
			vs: fmt.Sprintf("with events p50 %s (%s), p95 ratio %.3f; ratio %.3f", fmtDur(on.p(50)), signed(on.p(50)-off.p(50)),
				float64(on.p(95))/float64(off.p(95)), float64(on.p(50))/float64(off.p(50)))})
		add(row{name: "    create -> first result without events: " + store, p50: first[j+2].p(50), p99: first[j+2].p(99),
			vs: fmt.Sprintf("with events %s, ratio %.3f", fmtDur(first[j].p(50)), float64(first[j].p(50))/float64(first[j+2].p(50)))})
	}
}

// signed is a difference of durations with its sign.
func signed(d time.Duration) string {
	if d < 0 {
		return "-" + fmtDur(-d)
	}
	return "+" + fmtDur(d)
}

// pgWrites is the database's transaction counter: its difference over a
// stretch counts the transactions that wrote (each takes an id), plus one
// for the call itself. It is read at once, unlike pg_stat_database, which
// backends update up to seconds late.
func pgWrites(ctx context.Context, url string) int64 {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&n); err != nil {
		log.Fatal(err)
	}
	return n
}

// pgPing is the floor under every store call: one query's round trip.
func pgPing(ctx context.Context, url string) samples {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	one := func() {
		var n int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&n); err != nil {
			log.Fatal(err)
		}
	}
	for range 20 {
		one()
	}
	return measure(500, one)
}

// benchScaleRecords (o) fills a PostgreSQL store and an SQLite one with
// -records session records over HTTP, then creates more with them full.
func benchScaleRecords(ctx context.Context, env *scaleEnv, add func(row)) {
	const measureName = "(o) session records, PostgreSQL vs SQLite"
	url, ok := env.postgres(measureName, add)
	if !ok {
		return
	}
	lite := measureRecords(ctx, scaleDir("records-sqlite"))
	pg := measureRecords(ctx, scaleDir("records-pg"), withStore(url))
	add(row{name: fmt.Sprintf("(o) HTTP create session record, %d already in the store: SQLite", *records), p50: lite.more.p(50), p99: lite.more.p(99), goal: "~1 ms (SPEC floor)"})
	add(row{name: "    same, PostgreSQL store", p50: pg.more.p(50), p99: pg.more.p(99), goal: "~1 ms (SPEC floor)",
		vs: plus(pg.more.p(50), lite.more.p(50), "SQLite")})
	add(row{name: fmt.Sprintf("    filling the store to %d: SQLite", *records), p50: lite.fill.p(50), p99: lite.fill.p(99)})
	add(row{name: "    same, PostgreSQL store", p50: pg.fill.p(50), p99: pg.fill.p(99), vs: plus(pg.fill.p(50), lite.fill.p(50), "SQLite")})
	add(row{name: "    list sessions filtered by user_id among them: SQLite", p50: lite.list.p(50), p99: lite.list.p(99)})
	add(row{name: "    same, PostgreSQL store", p50: pg.list.p(50), p99: pg.list.p(99), vs: plus(pg.list.p(50), lite.list.p(50), "SQLite")})
}

// benchScaleBlob (p) hibernates and restores a workspace of 100 MB (one
// 50 MB file and fifty of 1 MB, random: incompressible, as in (k)) with
// the blob store on MinIO and on local files, in turn. The files are
// written into the workspace from this process; no sandbox is involved,
// and a file call restores the workspace without starting one.
func benchScaleBlob(ctx context.Context, env *scaleEnv, add func(row)) {
	const measureName = "(p) hibernate and restore on MinIO vs local files"
	bucket, ok := env.bucket(measureName, add)
	if !ok {
		return
	}
	local := startControlPlane(scaleDir("blob-file"), noSandboxes)
	defer local.stop()
	remote := startControlPlane(scaleDir("blob-s3"), noSandboxes, func(c *app.Config) { c.Blob = bucket })
	defer remote.stop()
	cps := [2]*controlPlane{local, remote}

	data := make([]byte, 100<<20)
	rand.NewChaCha8([32]byte{14}).Read(data)
	const sid = "big"
	for _, cp := range cps {
		if _, _, err := cp.c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid, Resources: &api.Resources{Disk: 512}}); err != nil {
			log.Fatal(err)
		}
		dir := filepath.Join(cp.dir, "workspaces", "default", sid, "data")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			log.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "big.bin"), data[:50<<20], 0o644); err != nil {
			log.Fatal(err)
		}
		for i := range 50 {
			part := data[(50+i)<<20 : (51+i)<<20]
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("part%02d.bin", i)), part, 0o644); err != nil {
				log.Fatal(err)
			}
		}
	}
	hibernate := func(cp *controlPlane) time.Duration {
		t0 := time.Now()
		if _, err := cp.c.HibernateSession(ctx, sid); err != nil {
			log.Fatal(err)
		}
		return time.Since(t0)
	}
	var first [2]time.Duration
	for j, cp := range cps {
		first[j] = hibernate(cp)
	}
	var restore, again [2]samples
	for range 5 {
		for j, cp := range cps {
			t0 := time.Now()
			if l, err := cp.c.ListFiles(ctx, sid, client.ListFilesOptions{Path: "data"}); err != nil || len(l.Files) != 51 {
				log.Fatalf("restoring: %v, %+v", err, l)
			}
			restore[j] = append(restore[j], time.Since(t0))
		}
		for j, cp := range cps {
			again[j] = append(again[j], hibernate(cp))
		}
	}
	for j := range cps {
		sortSamples(restore[j])
		sortSamples(again[j])
	}
	add(row{name: "(p) HTTP hibernate a 100 MB workspace, first time: local files (file://)", p50: first[0]})
	add(row{name: "    same, MinIO (s3://)", p50: first[1], vs: ratio(first[1], first[0], "local files")})
	add(row{name: "    HTTP hibernate again, content unchanged: local files", p50: again[0].p(50), p99: again[0].p(99)})
	add(row{name: "    same, MinIO", p50: again[1].p(50), p99: again[1].p(99), vs: ratio(again[1].p(50), again[0].p(50), "local files")})
	add(row{name: "    HTTP restore the 100 MB workspace (file call): local files", p50: restore[0].p(50), p99: restore[0].p(99), goal: "< 1 s"})
	add(row{name: "    same, from MinIO", p50: restore[1].p(50), p99: restore[1].p(99), goal: "< 1 s",
		vs: ratio(restore[1].p(50), restore[0].p(50), "local files")})
}

// benchScaleReaper (q) times reaper passes (Manager.Reap, what the reaper
// does every ReapInterval) over -hibernated hibernated sessions, in a
// PostgreSQL store and in an SQLite one. The records are copies of one
// session hibernated over HTTP, written straight into the store: records
// only, no workspace and no snapshot behind them.
//
// A hibernated session is due only when its TTL runs out (state.go,
// dueAt), and a pass asks the store for the due sessions by index, so two
// passes are measured:
//   - none due, the steady state: every copy expires in an hour. The pass
//     is one indexed query that finds nothing; it should not grow with
//     the number of hibernated sessions.
//   - all due: the pass is run as of just after that hour (Reap takes the
//     time), when every TTL has run out at once. Each pass takes up to
//     ReapBatch (256) sessions and terminates them: per session a read,
//     the deletion of its executions and uploads, a listing of its
//     snapshots in the blob store (local files here; empty), and the
//     write of the terminated record. Passes run back to back until none
//     is left; a pass's time and the total are reported.
func benchScaleReaper(ctx context.Context, env *scaleEnv, add func(row)) {
	const measureName = "(q) reaper pass, PostgreSQL vs SQLite"
	url, ok := env.postgres(measureName, add)
	if !ok {
		return
	}
	n := *hibernated
	type result struct {
		idle, due samples
		total     time.Duration
		acted     int
	}
	run := func(dir string, configure ...func(*app.Config)) result {
		// The background reaper would race the measured passes.
		configure = append(configure, func(c *app.Config) { c.ReapInterval = 24 * time.Hour })
		cp := startControlPlane(dir, noSandboxes, configure...)
		defer cp.stop()
		if _, _, err := cp.c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "proto", Metadata: map[string]string{"user_id": "u", "agent_id": "a"}}); err != nil {
			log.Fatal(err)
		}
		if _, err := cp.c.HibernateSession(ctx, "proto"); err != nil {
			log.Fatal(err)
		}
		proto, err := cp.app.Store.GetSession(ctx, "default", "proto")
		if err != nil || proto.Status != api.StatusHibernated {
			log.Fatalf("the hibernated session's record: %v %+v", err, proto)
		}
		now := time.Now().UTC()
		expires := now.Add(time.Hour)
		for k := range n {
			rec := *proto
			rec.ID = fmt.Sprintf("hib-%05d", k)
			rec.CreatedAt, rec.UpdatedAt, rec.LastActivityAt = now, now, now
			rec.ExpiresAt, rec.DueAt = expires, expires
			if err := cp.app.Store.CreateSession(ctx, &rec); err != nil {
				log.Fatal(err)
			}
		}
		var r result
		for range 5 {
			cp.app.Sessions.Reaper().Pass(ctx, time.Now())
		}
		r.idle = measure(100, func() {
			if acted := cp.app.Sessions.Reaper().Pass(ctx, time.Now()); acted != 0 {
				log.Fatalf("a reaper pass acted on %d sessions; none is due", acted)
			}
		})
		later := expires.Add(time.Second)
		t0 := time.Now()
		for {
			s0 := time.Now()
			acted := cp.app.Sessions.Reaper().Pass(ctx, later)
			if acted == 0 {
				break
			}
			r.due = append(r.due, time.Since(s0))
			r.acted += acted
		}
		r.total = time.Since(t0)
		sortSamples(r.due)
		return r
	}
	lite := run(scaleDir("reaper-sqlite"))
	pg := run(scaleDir("reaper-pg"), withStore(url))
	add(row{name: fmt.Sprintf("(q) reaper pass, %d hibernated sessions, none due: SQLite", n), p50: lite.idle.p(50), p99: lite.idle.p(99)})
	add(row{name: "    same, PostgreSQL store", p50: pg.idle.p(50), p99: pg.idle.p(99), vs: plus(pg.idle.p(50), lite.idle.p(50), "SQLite")})
	perSession := func(r result) string {
		if r.acted == 0 {
			return "none acted on"
		}
		return fmt.Sprintf("%d passes, %d expired in %v, %s a session", len(r.due), r.acted, r.total.Round(time.Millisecond), fmtDur(r.total/time.Duration(r.acted)))
	}
	add(row{name: fmt.Sprintf("    reaper pass when all %d TTLs have run out (up to 256 a pass): SQLite", n), p50: lite.due.p(50), p99: lite.due.p(99),
		vs: perSession(lite)})
	add(row{name: "    same, PostgreSQL store", p50: pg.due.p(50), p99: pg.due.p(99),
		vs: perSession(pg) + "; " + "in all " + plus(pg.total, lite.total, "SQLite")})
}
