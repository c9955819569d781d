package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	sbxsandbox "github.com/sbx-sandbox/sbx/internal/sandbox"
)

var hibernated = flag.Int("hibernated", 10000, "sessions to hibernate for the hibernated-sessions measure")

// benchLifecycle measures the session lifecycle over HTTP (R-60..R-66):
// create -> first result without a pool, pause and resume, memory of a
// paused sandbox, hibernate and restore of a 100 MB workspace, and what
// many hibernated sessions cost.
func benchLifecycle(ctx context.Context, rt *oci.Runtime, add func(row)) {
	cp := startControlPlane(filepath.Join(*dataDir, "bench-lifecycle"), nil)
	defer cp.stop()
	c := cp.c

	i := 0
	first := measure(*httpCreates, func() {
		i++
		id := fmt.Sprintf("first-%d", i)
		if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: "python"}); err != nil {
			log.Fatal(err)
		}
		mustExec(ctx, c, id, "print(1)")
	})
	add(row{name: "(i) HTTP create session -> first result (python, lazy, no pool)", p50: first.p(50), p99: first.p(99), goal: "< 5 s (SPEC floor)"})
	for j := 1; j <= i; j++ {
		c.DeleteSession(ctx, fmt.Sprintf("first-%d", j))
	}
	benchPool(ctx, rt, first, add)

	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "life", TemplateID: "python"}); err != nil {
		log.Fatal(err)
	}
	mustExec(ctx, c, "life", "print(1)")
	var ps, rs samples
	for range 30 {
		t0 := time.Now()
		if _, err := c.PauseSession(ctx, "life"); err != nil {
			log.Fatal(err)
		}
		ps = append(ps, time.Since(t0))
		t0 = time.Now()
		if _, err := c.ResumeSession(ctx, "life"); err != nil {
			log.Fatal(err)
		}
		rs = append(rs, time.Since(t0))
	}
	sortSamples(ps)
	sortSamples(rs)
	add(row{name: "(j) HTTP pause (freeze) a python sandbox", p50: ps.p(50), p99: ps.p(99), goal: "< 10 ms"})
	add(row{name: "    HTTP resume (thaw) it", p50: rs.p(50), p99: rs.p(99), goal: "< 10 ms"})
	c.PauseSession(ctx, "life")
	time.Sleep(500 * time.Millisecond)
	if id := sandboxOf(ctx, rt, "life"); id != "" {
		if st, err := rt.Stats(ctx, id); err == nil {
			add(row{name: "    memory of a paused python sandbox", mem: st.MemoryBytes})
		}
	}
	pausedExec := measure(10, func() {
		c.PauseSession(ctx, "life")
		mustExec(ctx, c, "life", "print(1)")
	})
	add(row{name: "    execute on a paused session (thaw included)", p50: pausedExec.p(50), p99: pausedExec.p(99)})

	// 100 MB: one 50 MB file and fifty of 1 MB, random (incompressible).
	mustExec(ctx, c, "life", `
import os
os.makedirs("/workspace/data", exist_ok=True)
open("/workspace/data/big.bin", "wb").write(os.urandom(50 << 20))
for i in range(50):
    open("/workspace/data/part%02d.bin" % i, "wb").write(os.urandom(1 << 20))
`)
	var hs, ws samples
	for k := range 3 {
		t0 := time.Now()
		if _, err := c.HibernateSession(ctx, "life"); err != nil {
			log.Fatal(err)
		}
		hs = append(hs, time.Since(t0))
		t0 = time.Now()
		// A file call restores the workspace and starts no sandbox.
		if _, err := c.ListFiles(ctx, "life", client.ListFilesOptions{Path: "data"}); err != nil {
			log.Fatal(err)
		}
		ws = append(ws, time.Since(t0))
		if k == 0 {
			add(row{name: "(k) HTTP hibernate, 100 MB workspace, first time", p50: hs[0]})
		}
	}
	add(row{name: "    HTTP hibernate again, content unchanged (stored once)", p50: hs[2]})
	sortSamples(ws)
	add(row{name: "    HTTP restore a hibernated 100 MB workspace (file call)", p50: ws.p(50), p99: ws[len(ws)-1], goal: "< 1 s"})
	t0 := time.Now()
	c.HibernateSession(ctx, "life")
	mustExec(ctx, c, "life", "print(1)")
	add(row{name: "    execute on a hibernated 100 MB session (restore + new sandbox)", p50: time.Since(t0)})
	s1, err := c.CreateSnapshot(ctx, "life")
	if err != nil {
		log.Fatal(err)
	}
	t0 = time.Now()
	s2, err := c.CreateSnapshot(ctx, "life")
	if err != nil {
		log.Fatal(err)
	}
	add(row{name: "    snapshot of the unchanged 100 MB workspace", p50: time.Since(t0),
		vs: fmt.Sprintf("stored %d bytes (first snapshot: %d)", *s2.NewBytes, *s1.NewBytes)})
	c.DeleteSession(ctx, "life")

	// Many hibernated sessions: what each costs the server.
	rss0 := rssBytes()
	var hib samples
	for k := range *hibernated {
		id := fmt.Sprintf("hib-%05d", k)
		if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id}); err != nil {
			log.Fatal(err)
		}
		t0 := time.Now()
		if _, err := c.HibernateSession(ctx, id); err != nil {
			log.Fatal(err)
		}
		hib = append(hib, time.Since(t0))
	}
	rss := rssBytes()
	sortSamples(hib)
	add(row{name: fmt.Sprintf("(l) HTTP hibernate an empty session (%d sessions)", *hibernated), p50: hib.p(50), p99: hib.p(99)})
	add(row{name: fmt.Sprintf("    process RSS growth holding %d hibernated sessions", *hibernated), mem: max(rss-min(rss, rss0), 1), goal: "tens of MB"})
	t0 = time.Now()
	acted := cp.app.Sessions.Reaper().Pass(ctx, time.Now())
	add(row{name: fmt.Sprintf("    a reaper pass with %d hibernated sessions (none due)", *hibernated), p50: time.Since(t0), vs: fmt.Sprintf("%d acted on", acted)})
}

// benchPool measures a new session's first result with a sandbox from
// the warm pool, against the cold start measured just before.
func benchPool(ctx context.Context, rt *oci.Runtime, cold samples, add func(row)) {
	cp := startControlPlane(filepath.Join(*dataDir, "bench-pool"), nil,
		func(c *app.Config) { c.Pools = map[string]int{"python": 2} })
	defer cp.stop()
	waitPool := func() {
		for cp.app.Sessions.PoolSizes()["python"] < 2 {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond) // the new sandbox's preload settles
	}
	i := 0
	var warm samples
	for range *httpCreates {
		waitPool()
		i++
		id := fmt.Sprintf("pool-%d", i)
		t0 := time.Now()
		if _, _, err := cp.c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: "python"}); err != nil {
			log.Fatal(err)
		}
		mustExec(ctx, cp.c, id, "print(1)")
		warm = append(warm, time.Since(t0))
	}
	// The sessions go with their sandboxes: a stopped server leaves a
	// session's sandbox up for the next one, and these would hold the
	// workspace image mounted.
	for j := 1; j <= i; j++ {
		if _, err := cp.c.DeleteSession(ctx, fmt.Sprintf("pool-%d", j)); err != nil {
			log.Printf("deleting pool-%d: %v", j, err)
		}
	}
	sortSamples(warm)
	add(row{name: "    HTTP create session -> first result, from the warm pool", p50: warm.p(50), p99: warm.p(99), goal: "p50 < 10 ms",
		vs: ratio(warm.p(50), cold.p(50), "cold start")})
}

func mustExec(ctx context.Context, c *client.Client, id, code string) {
	res, err := c.Execute(ctx, id, api.ExecuteRequest{Code: code})
	if err != nil || res.Status != api.ExecCompleted {
		log.Fatalf("execute in %s: %+v %v", id, res, err)
	}
}

// sandboxOf is the id of the session's sandbox, "" if it has none.
func sandboxOf(ctx context.Context, rt runtime.Runtime, id string) string {
	infos, _ := rt.List(ctx)
	for _, info := range infos {
		if info.Labels[sbxsandbox.LabelSession] == id {
			return info.ID
		}
	}
	return ""
}

var live = flag.Int("live", 0, "sessions with live python sandboxes to grow to, measuring latency as they grow (0: skip; stops early below 1 GiB of available memory)")

// benchLive grows the number of sessions with a live (running, idle)
// python sandbox and measures, at each step, the round trip of a probe
// session and the memory left: how many fit before latency degrades.
func benchLive(ctx context.Context, rt *oci.Runtime, add func(row)) {
	if *live <= 0 {
		return
	}
	cp := startControlPlane(filepath.Join(*dataDir, "bench-live"), nil)
	defer cp.stop()
	c := cp.c
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "probe", TemplateID: "python"}); err != nil {
		log.Fatal(err)
	}
	mustExec(ctx, c, "probe", "print(1)")
	probe := func() samples {
		return measurePaced(30, *pause, func() { mustExec(ctx, c, "probe", "print(1)") })
	}
	base := probe()
	add(row{name: "(m) live python sandboxes: probe round trip with 1", p50: base.p(50), p99: base.p(99), vs: fmt.Sprintf("%.1f GiB available", memAvailableGiB())})
	n, step := 0, max(*live/10, 1)
	t0 := time.Now()
	defer func() {
		// Tear down in parallel; deleting 1,000 sandboxes one by one takes minutes.
		sem := make(chan struct{}, 8)
		for k := 1; k <= n; k++ {
			sem <- struct{}{}
			go func() { defer func() { <-sem }(); c.DeleteSession(ctx, fmt.Sprintf("live-%d", k)) }()
		}
		for range cap(sem) {
			sem <- struct{}{}
		}
	}()
	for n < *live {
		if memAvailableGiB() < 1 {
			add(row{name: fmt.Sprintf("    stopped at %d: under 1 GiB of memory available", n)})
			return
		}
		var wg sync.WaitGroup
		errs := make(chan error, step)
		for range step {
			n++
			id := fmt.Sprintf("live-%d", n)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: "python", IdleTimeout: 86400}); err != nil {
					errs <- err
					return
				}
				if res, err := c.Execute(ctx, id, api.ExecuteRequest{Code: "x = 1"}); err != nil || res.Status != api.ExecCompleted {
					errs <- fmt.Errorf("%s: %v %v", id, err, res)
				}
			}()
		}
		wg.Wait()
		close(errs)
		nerr := 0
		for err := range errs {
			if nerr == 0 {
				fmt.Fprintln(os.Stderr, "bench: live:", err)
			}
			nerr++
		}
		p := probe()
		add(row{name: fmt.Sprintf("    probe round trip with %d live sandboxes", n+1), p50: p.p(50), p99: p.p(99),
			vs: fmt.Sprintf("%s; %.1f GiB available; %d errors; %v so far", ratio(p.p(50), base.p(50), "with 1"), memAvailableGiB(), nerr, time.Since(t0).Round(time.Second))})
		if nerr > 0 {
			return
		}
	}
}

func memAvailableGiB() float64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "MemAvailable:") {
			kb, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
			return kb / (1 << 20)
		}
	}
	return 0
}
