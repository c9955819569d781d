package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

var (
	httpCreates = flag.Int("http-creates", 10, "sessions for create -> running over HTTP")
	concurrent  = flag.Int("concurrent", 250, "sessions running an execution at once")
	records     = flag.Int("records", 10000, "session records for the store measure")
)

// controlPlane is an sbx server in this process on a loopback port, with
// its own data directory.
type controlPlane struct {
	app    *app.App
	url    string
	c      *client.Client
	cancel context.CancelFunc
	done   chan struct{}
	dir    string
}

var wsQuota = flag.String("workspace-quota", "auto", "the control planes' workspace quotas: auto (as sbx serve) or off, to measure what the quota costs")

// startControlPlane starts a control plane over dir with the runtime rt
// makes; nil: the bench's runc (newRuntime), resolving the control
// plane's template builds and workspace volumes.
func startControlPlane(dir string, rt func(string) (runtime.Runtime, error), configure ...func(*app.Config)) *controlPlane {
	if rt == nil {
		r := newRuntime(template.NewStore(filepath.Join(*dataDir, "templates")), workspace.Volumes(filepath.Join(dir, "workspaces")))
		rt = func(string) (runtime.Runtime, error) { return r, nil }
	}
	// A run killed halfway leaves the workspace image mounted.
	quota.Unmount(filepath.Join(dir, "workspaces"))
	os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	cfg := app.Config{
		DataDir: dir, StateDir: stateRoot, TemplateDir: filepath.Join(*dataDir, "templates"),
		ExecutorPath: *exePath, Runtime: rt, WorkspaceQuota: *wsQuota,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	}
	for _, f := range configure {
		f(&cfg)
	}
	a, err := app.Open(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	cp := &controlPlane{app: a, url: url, c: client.New(url), cancel: cancel, done: make(chan struct{}), dir: dir}
	go func() {
		defer close(cp.done)
		a.Serve(ctx, ln)
	}()
	return cp
}

func (cp *controlPlane) stop() {
	cp.cancel()
	<-cp.done
	cp.app.Close()
	// The server leaves its workspace image mounted for a successor; the
	// benchmark has none. Lazily: sandboxes may still be going.
	if err := quota.Unmount(filepath.Join(cp.dir, "workspaces")); err != nil {
		log.Print(err)
	}
}

// waitRunning polls a new session until its sandbox is up.
func waitRunning(ctx context.Context, c *client.Client, id string) {
	for {
		s, err := c.GetSession(ctx, id)
		if err != nil {
			log.Fatal(err)
		}
		switch s.Status {
		case api.StatusRunning:
			return
		case api.StatusPending:
			time.Sleep(2 * time.Millisecond)
		default:
			log.Fatalf("session %s: %s: %s", id, s.Status, s.Error)
		}
	}
}

// benchHTTP measures the control plane over HTTP. inProcess is the
// executor round trip measured directly in this run, the baseline of the
// HTTP round trip.
func benchHTTP(ctx context.Context, rt *oci.Runtime, inProcess samples, add func(row)) {
	cp := startControlPlane(filepath.Join(*dataDir, "bench-http"), nil)
	defer cp.stop()
	c := cp.c

	i := 0
	cr := measure(*httpCreates, func() {
		i++
		id := fmt.Sprintf("create-%d", i)
		if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: "python", WarmUp: true}); err != nil {
			log.Fatal(err)
		}
		waitRunning(ctx, c, id)
	})
	add(row{name: "(d) HTTP: create session with warm_up -> running (python, no pool)", p50: cr.p(50), p99: cr.p(99), goal: "< 5 s (SPEC floor)"})
	for j := 1; j <= i; j++ {
		c.DeleteSession(ctx, fmt.Sprintf("create-%d", j))
	}

	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "rt", TemplateID: "python"}); err != nil {
		log.Fatal(err)
	}
	waitRunning(ctx, c, "rt")
	exec := func() {
		res, err := c.Execute(ctx, "rt", api.ExecuteRequest{Code: "print(1)"})
		if err != nil || res.Status != api.ExecCompleted {
			log.Fatalf("execute: %+v %v", res, err)
		}
	}
	for range 20 {
		exec()
	}
	hp := measurePaced(*rounds, *pause, exec)
	add(row{name: fmt.Sprintf("(e) HTTP round trip print(1), ?wait=true, %v apart", *pause), p50: hp.p(50), p99: hp.p(99), goal: "p50 < 5 ms",
		vs: fmt.Sprintf("+%s over the executor alone (%s)", fmtDur(hp.p(50)-inProcess.p(50)), fmtDur(inProcess.p(50)))})
	hb := measure(*rounds, exec)
	add(row{name: "    HTTP round trip print(1), back to back", p50: hb.p(50), p99: hb.p(99)})

	for _, mb := range []int{10, 50} {
		data := bytes.Repeat([]byte("0123456789abcdef"), mb<<16)
		up := measure(5, func() {
			if _, err := c.Upload(ctx, "rt", client.UploadOptions{}, client.UploadFile{Name: fmt.Sprintf("up%d.bin", mb), Reader: bytes.NewReader(data)}); err != nil {
				log.Fatal(err)
			}
		})
		goal := "< 2 s (SPEC floor)"
		if mb == 50 {
			goal = "< 0.5 s"
		}
		add(row{name: fmt.Sprintf("(f) HTTP upload %d MB", mb), p50: up.p(50), p99: up.p(99), goal: goal,
			vs: fmt.Sprintf("%.0f MB/s", float64(mb)/up.p(50).Seconds())})
	}
	c.DeleteSession(ctx, "rt")

	benchConcurrent(ctx, c, add)
}

// benchConcurrent creates many sessions and runs one execution in each, all
// at once.
func benchConcurrent(ctx context.Context, c *client.Client, add func(row)) {
	r := runConcurrent(ctx, c, *concurrent)
	name := fmt.Sprintf("(g) %d sessions created at once, one execution each", r.n)
	add(row{name: name + ": all done", p50: r.total, goal: "0 errors", vs: fmt.Sprintf("%d errors", len(r.errs))})
	add(row{name: "    submit -> result per session (sandbox start included)", p50: r.lat.p(50), p99: r.lat.p(99)})
	add(row{name: fmt.Sprintf("    delete %d sessions (sandboxes killed)", r.n), p50: r.del})
}

// concurrentRun is what runConcurrent measured: the wall time until every
// session had its result, each session's submit -> result (sorted), the
// failures, and the wall time of deleting them all at once.
type concurrentRun struct {
	n          int
	total, del time.Duration
	lat        samples
	errs       []error
}

// runConcurrent creates n sessions and runs one execution in each, all at
// once, then deletes them all at once. The first errors go to stderr.
func runConcurrent(ctx context.Context, c *client.Client, n int) concurrentRun {
	t0 := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	r := concurrentRun{n: n}
	for k := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("conc-%d", k)
			fail := func(err error) {
				mu.Lock()
				r.errs = append(r.errs, fmt.Errorf("%s: %w", id, err))
				mu.Unlock()
			}
			if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: "python"}); err != nil {
				fail(err)
				return
			}
			s0 := time.Now()
			res, err := c.Execute(ctx, id, api.ExecuteRequest{Code: fmt.Sprintf("return %d * 2", k)})
			switch {
			case err != nil:
				fail(err)
				return
			case res.Status != api.ExecCompleted || string(res.ReturnValue) != strconv.Itoa(2*k):
				fail(fmt.Errorf("%s: %s %+v", res.ExecutionID, res.Status, res.Error))
				return
			}
			mu.Lock()
			r.lat = append(r.lat, time.Since(s0))
			mu.Unlock()
		}()
	}
	wg.Wait()
	r.total = time.Since(t0)
	sortSamples(r.lat)
	for _, err := range r.errs[:min(len(r.errs), 5)] {
		fmt.Fprintln(os.Stderr, "bench: error:", err)
	}
	t1 := time.Now()
	for k := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.DeleteSession(ctx, fmt.Sprintf("conc-%d", k))
		}()
	}
	wg.Wait()
	r.del = time.Since(t1)
	return r
}

// benchRecords measures what a session record costs the control plane:
// create latency over HTTP, filling the store and with it full, and the
// server's memory with that many sessions. Sessions are lazy, so
// no sandbox is involved; the runtime would refuse if one were. -only
// scale-records (scale.go) measures the same on PostgreSQL beside SQLite.
func benchRecords(ctx context.Context, add func(row)) {
	r := measureRecords(ctx, filepath.Join(*dataDir, "bench-records"))
	add(row{name: fmt.Sprintf("(h) HTTP create session record (%d records, no sandbox)", *records), p50: r.fill.p(50), p99: r.fill.p(99), goal: "~1 ms (SPEC floor)"})
	add(row{name: fmt.Sprintf("    process RSS growth holding %d sessions", *records), mem: max(r.rss-min(r.rss, r.rss0), 1), goal: "tens of MB",
		vs: fmt.Sprintf("RSS %.0f MB before, %.0f MB after", float64(r.rss0)/(1<<20), float64(r.rss)/(1<<20))})
	add(row{name: fmt.Sprintf("    create session record with %d already in the store", *records), p50: r.more.p(50), p99: r.more.p(99)})
	add(row{name: "    list sessions filtered by user_id among them", p50: r.list.p(50), p99: r.list.p(99)})
}

// recordCosts is what measureRecords measured: the creates that filled
// the store with -records sessions, the server's RSS before and after,
// a tenth as many creates more with the store full, and a filtered list.
type recordCosts struct {
	fill, more, list samples
	rss0, rss        uint64
}

// measureRecords fills a control plane's store, in dir and configured by
// configure, with session records over HTTP.
func measureRecords(ctx context.Context, dir string, configure ...func(*app.Config)) recordCosts {
	noRuntime := func(string) (runtime.Runtime, error) {
		return nil, fmt.Errorf("records only: %w", errdefs.ErrUnavailable)
	}
	cp := startControlPlane(dir, noRuntime, configure...)
	defer cp.stop()
	i := 0
	create := func() {
		i++
		_, _, err := cp.c.CreateSession(ctx, api.CreateSessionRequest{
			SessionID: fmt.Sprintf("rec-%06d", i), Metadata: map[string]string{"user_id": fmt.Sprintf("u%d", i%100), "agent_id": "a"},
		})
		var ae *client.APIError
		if err != nil && !errors.As(err, &ae) {
			log.Fatal(err)
		}
	}
	var r recordCosts
	r.rss0 = rssBytes()
	r.fill = measure(*records, create)
	r.rss = rssBytes()
	r.more = measure(max(*records/10, 1), create)
	r.list = measure(100, func() {
		if _, err := cp.c.ListSessions(ctx, client.ListSessionsOptions{UserID: "u7", Limit: 100}); err != nil {
			log.Fatal(err)
		}
	})
	return r
}

// rssBytes is the process's resident memory after a full collection has
// handed back what it could, so that two samples compare live data.
func rssBytes() uint64 {
	debug.FreeOSMemory()
	return statusBytes("VmRSS:")
}

// statusBytes is a kB field of /proc/self/status, in bytes.
func statusBytes(field string) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field) {
			kb, _ := strconv.ParseUint(strings.Fields(line)[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func sortSamples(s samples) {
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
}
