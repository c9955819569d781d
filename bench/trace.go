package main

// The traces measure (-only trace): what issue 15's spans cost an
// execution's HTTP round trip. `sbx serve` processes over one template
// cache, each with a session on a running python sandbox, take turns in
// every round, so that the machine's noise falls on all of them alike:
//
//	off      this tree's bin/sbx, no OTEL_ variables (how sbx serve runs
//	         unless told to trace)
//	on       the same binary with OTEL_EXPORTER_OTLP_ENDPOINT pointing at a
//	         collector in this process: every span recorded and exported
//	         over OTLP/HTTP (the batcher's default 5 s delay)
//	baseline with -trace-baseline DIR, DIR/sbx and DIR/sbx-executor built
//	         from another tree (main, before the spans: `git archive main |
//	         tar -x -C DIR && make -C DIR build` puts them in DIR/bin)
//
// They are processes, not control planes in this one, because the
// tracer provider is the process's.

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/template"
)

var (
	traceSbx      = flag.String("trace-sbx", "bin/sbx", "the sbx binary -only trace measures (sbx-executor beside it)")
	traceBaseline = flag.String("trace-baseline", "", "`DIR` holding sbx and sbx-executor of another build, for -only trace to compare with")
)

// servedProcess is an `sbx serve` this benchmark started.
type servedProcess struct {
	name   string
	cmd    *exec.Cmd
	stderr io.Closer
	dir    string
	c      *client.Client
}

func startServe(name, bin string, env []string) *servedProcess {
	dir := filepath.Join(*dataDir, "bench-trace-"+name)
	quota.Unmount(filepath.Join(dir, "workspaces"))
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		log.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		log.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--data-dir", dir, "--state-dir", filepath.Join(stateRoot, "trace-"+name),
		"--template-dir", filepath.Join(*dataDir, "templates"), "--prebuild", "", "--workspace-quota", *wsQuota)
	cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		log.Fatalf("bench: %s: %v", bin, err)
	}
	// The "serving" line has the address; the rest goes to serve.log.
	url := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			var l struct{ Msg, URL string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "serving" {
				url <- l.URL
			}
		}
		logf.Close()
	}()
	select {
	case u := <-url:
		return &servedProcess{name: name, cmd: cmd, stderr: pw, dir: dir, c: client.New(u)}
	case <-time.After(time.Minute):
		log.Fatalf("bench: %s serve did not start; see %s", name, filepath.Join(dir, "serve.log"))
	}
	return nil
}

func (p *servedProcess) stop(ctx context.Context) {
	p.c.DeleteSession(ctx, "rt") // its sandbox with it: a stopped server leaves sandboxes up
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.cmd.Wait()
	p.stderr.Close()
	if err := quota.Unmount(filepath.Join(p.dir, "workspaces")); err != nil {
		log.Print(err)
	}
}

func benchTrace(ctx context.Context, add func(row)) {
	ensure(ctx, template.NewStore(filepath.Join(*dataDir, "templates")), "python")
	var spans atomic.Int64
	col := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if proto.Unmarshal(b, &req) == nil {
			for _, rs := range req.GetResourceSpans() {
				for _, ss := range rs.GetScopeSpans() {
					spans.Add(int64(len(ss.GetSpans())))
				}
			}
		}
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	defer col.Close()
	procs := []*servedProcess{
		startServe("off", *traceSbx, nil),
		startServe("on", *traceSbx, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL}),
	}
	if *traceBaseline != "" {
		procs = append(procs, startServe("baseline", filepath.Join(*traceBaseline, "sbx"), nil))
	}
	defer func() {
		for _, p := range procs {
			p.stop(ctx)
		}
	}()
	for _, p := range procs {
		if _, _, err := p.c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "rt", TemplateID: "python"}); err != nil {
			log.Fatal(err)
		}
		for range 20 {
			mustExec(ctx, p.c, "rt", "print(1)")
		}
	}
	// What the warm-up sent is not counted: the batcher sends at most
	// every 5 s.
	time.Sleep(6 * time.Second)
	spans0 := spans.Load()
	trip := make([]samples, len(procs))
	for i := range *rounds {
		// Each round starts with the next one: none is always first.
		for k := range procs {
			j := (i + k) % len(procs)
			time.Sleep(*pause)
			t0 := time.Now()
			mustExec(ctx, procs[j].c, "rt", "print(1)")
			trip[j] = append(trip[j], time.Since(t0))
		}
	}
	for j := range procs {
		sortSamples(trip[j])
	}
	off, on := trip[0], trip[1]
	add(row{name: fmt.Sprintf("(r) HTTP round trip print(1), %v apart: traces off", *pause), p50: off.p(50), p99: off.p(99),
		vs: "p95 " + fmtDur(off.p(95))})
	if len(procs) == 3 {
		base := trip[2]
		add(row{name: "    same, baseline build (" + *traceBaseline + ")", p50: base.p(50), p99: base.p(99), goal: "off = baseline",
			vs: fmt.Sprintf("p95 %s; off/baseline p50 %.3f, p95 %.3f, p99 %.3f", fmtDur(base.p(95)),
				float64(off.p(50))/float64(base.p(50)), float64(off.p(95))/float64(base.p(95)), float64(off.p(99))/float64(base.p(99)))})
	}
	// The last batch may still be on its way: wait for the batcher's
	// delay before counting what the collector got.
	time.Sleep(6 * time.Second)
	add(row{name: "    same, traces on (every span exported over OTLP/HTTP)", p50: on.p(50), p99: on.p(99),
		vs: fmt.Sprintf("p95 %s; on/off p50 %.3f, p95 %.3f; %.1f spans per execution", fmtDur(on.p(95)),
			float64(on.p(50))/float64(off.p(50)), float64(on.p(95))/float64(off.p(95)), float64(spans.Load()-spans0)/float64(*rounds))})
	if n := spans.Load(); n == 0 {
		log.Print("bench: the collector got no spans: " + strings.Join(procs[1].cmd.Args, " "))
	}
}
