// Command bench measures sbx against its baselines in one run and prints a
// table: sandbox create to first result, execution round trips, pandas in
// the zygote against a fresh interpreter, and idle memory; baselines are a
// fresh `runc run` and a fresh `bwrap` per execution over the same rootfs.
// The control plane is measured over HTTP on loopback (http.go): session
// create, the execution round trip against the executor alone, uploads,
// many sessions at once and the cost of session records; and the session
// lifecycle (lifecycle.go): pause, resume, hibernate, restore, snapshots.
// With -only scale (scale.go), the production backends against the
// embedded ones in one run: PostgreSQL against SQLite, MinIO against
// local files, on throwaway servers. With -only kube (kube.go), the
// kubernetes runtime (sandboxes as Pods of the test cluster) against runc
// in one run: warm-pool claims, cold creates, round trips, transfers,
// hibernation and 100 sessions at once, each with its kube/runc ratio.
//
//	make bench            # or: go run ./bench -n 200
//	go run ./bench -only scale
//	go run ./bench -only kube   # scripts/kube.sh up first; make build
//
// Needs root and the built templates (it builds them on first use).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/template"
)

var (
	rounds    = flag.Int("n", 300, "round trips for the round-trip measures")
	pause     = flag.Duration("pause", 50*time.Millisecond, "idle time between paced round trips (an agent thinks between steps)")
	creates   = flag.Int("creates", 15, "sandboxes for create-to-first-result")
	fresh     = flag.Int("fresh", 10, "runs of each fresh-process baseline")
	exePath   = flag.String("executor", "bin/sbx-executor", "static sbx-executor binary")
	dataDir   = flag.String("data-dir", envOr("SBX_DATA_DIR", "/var/lib/sbx"), "where templates are built")
	skipDS    = flag.Bool("skip-datascience", false, "skip the python-datascience measures")
	skipHTTP  = flag.Bool("skip-http", false, "skip the control-plane (HTTP) measures")
	only      = flag.String("only", "", "run only this measure: records, resources, mcp or manyfiles (no sandbox); trace (spans on and off, against -trace-baseline; trace.go); scale (PostgreSQL and MinIO against SQLite and local files: all of scale-http, scale-records, scale-blob, scale-reaper; scale.go); kube (Pods of a Kubernetes cluster against runc; kube.go)")
	stateRoot = "/run/sbx-bench"
)

func main() {
	flag.Parse()
	if os.Geteuid() != 0 {
		log.Fatal("bench: needs root")
	}
	ctx := context.Background()
	if *only != "" {
		var rows []row
		add := func(r row) { rows = append(rows, r) }
		switch *only {
		case "records":
			benchRecords(ctx, add)
		case "resources":
			benchResources(ctx, add)
		case "mcp":
			benchMCP(ctx, add)
		case "manyfiles":
			benchManyFiles(ctx, add)
		case "trace":
			benchTrace(ctx, add)
		case "kube":
			benchKube(ctx, add)
		case "scale", "scale-http", "scale-records", "scale-blob", "scale-reaper":
			benchScale(ctx, *only, add)
		default:
			log.Fatalf("bench: -only %q: want records, resources, mcp, manyfiles, trace, kube, scale, scale-http, scale-records, scale-blob or scale-reaper", *only)
		}
		printTable(rows)
		return
	}
	store := template.NewStore(filepath.Join(*dataDir, "templates"))
	py := ensure(ctx, store, "python")
	rt := newRuntime(&benchDirs, &benchDirs)
	ws := filepath.Join(*dataDir, "bench")
	os.RemoveAll(ws)
	if err := os.MkdirAll(ws, 0o711); err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(ws)

	var rows []row
	add := func(r row) {
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "bench: %-55s p50 %s\n", r.name, fmtDur(r.p50))
	}

	// Baselines first, over the same rootfs, so the ratios compare like
	// with like.
	hostPy := measure(*fresh, func() { mustRun(exec.Command("/usr/bin/python3", "-c", "print(1)")) })
	add(row{name: "baseline: host python3 -c print(1)", p50: hostPy.p(50), p99: hostPy.p(99)})
	bw := measure(*fresh, func() { mustRun(bwrapCmd(py.Rootfs, "print(1)")) })
	add(row{name: "baseline: fresh bwrap ... python3 -c print(1)", p50: bw.p(50), p99: bw.p(99)})
	rr := measure(*fresh, func() { runcOnce(py.Rootfs, "print(1)") })
	add(row{name: "baseline: fresh runc run ... python3 -c print(1)", p50: rr.p(50), p99: rr.p(99)})

	// (a) sandbox create -> first result.
	i := 0
	cr := measure(*creates, func() {
		i++
		s := newSandbox(ctx, rt, fmt.Sprintf("bench-create-%d", i), py, ws)
		s.run(ctx, "python", "print(1)")
		s.destroy(ctx)
	})
	add(row{name: "(a) create sandbox -> first result (python)", p50: cr.p(50), p99: cr.p(99), goal: "< 150 ms",
		vs: ratio(cr.p(50), rr.p(50), "fresh runc")})

	// (b) round trip in a running sandbox.
	s := newSandbox(ctx, rt, "bench-rt", py, ws)
	for j := 0; j < 20; j++ {
		s.run(ctx, "python", "print(1)")
	}
	rtp := measurePaced(*rounds, *pause, func() { s.run(ctx, "python", "print(1)") })
	add(row{name: fmt.Sprintf("(b) round trip print(1), running sandbox, %v apart", *pause), p50: rtp.p(50), p99: rtp.p(99), goal: "p50 < 5 ms, p99 < 20 ms",
		vs: ratio(rtp.p(50), rr.p(50), "fresh runc") + ", " + ratio(rtp.p(50), bw.p(50), "fresh bwrap")})
	rtc := measure(*rounds, func() { s.run(ctx, "python", "print(1)") })
	add(row{name: "    round trip print(1), back to back", p50: rtc.p(50), p99: rtc.p(99)})
	rtb := measurePaced(*rounds/3, *pause, func() { s.run(ctx, "bash", "echo 1") })
	add(row{name: "    round trip echo 1 (bash), paced", p50: rtb.p(50), p99: rtb.p(99)})
	rtx := measure(*rounds, func() { s.runIn(ctx, "ctx", "print(1)") })
	add(row{name: "    round trip print(1) in a stateful context", p50: rtx.p(50), p99: rtx.p(99)})
	add(row{name: "    idle memory, python sandbox", mem: s.memory(ctx, rt)})
	s.destroy(ctx)

	if !*skipHTTP {
		benchRecords(ctx, add) // first: its memory measure wants a lean process
		benchResources(ctx, add)
		benchHTTP(ctx, rt, rtp, add)
		benchLifecycle(ctx, rt, add)
		benchLive(ctx, rt, add)
	}

	if !*skipDS {
		ds := ensure(ctx, store, "python-datascience")
		d := newSandbox(ctx, rt, "bench-ds", ds, ws)
		t0 := time.Now()
		d.waitReady(ctx)
		add(row{name: "    datascience sandbox: preload ready after create", p50: time.Since(t0)})
		const df = "import pandas as pd\ndf = pd.DataFrame({'a': range(1000), 'b': range(1000)})\nreturn float((df.a * df.b).mean())"
		for j := 0; j < 5; j++ {
			d.run(ctx, "python", df)
		}
		z := measurePaced(*rounds/3, *pause, func() { d.run(ctx, "python", df) })
		zb := measure(*rounds/3, func() { d.run(ctx, "python", df) })
		f := measure(*fresh, func() {
			d.run(ctx, "bash", "python3 -c \"import pandas as pd; df = pd.DataFrame({'a': range(1000), 'b': range(1000)}); print(float((df.a * df.b).mean()))\"")
		})
		add(row{name: "    pandas DataFrame op, fresh interpreter in sandbox", p50: f.p(50), p99: f.p(99)})
		add(row{name: "(c) pandas DataFrame op, zygote (python-datascience), paced", p50: z.p(50), p99: z.p(99), goal: "< 20 ms",
			vs: ratio(z.p(50), f.p(50), "fresh interpreter")})
		add(row{name: "    pandas DataFrame op, zygote, back to back", p50: zb.p(50), p99: zb.p(99)})
		time.Sleep(time.Second)
		add(row{name: "    idle memory, datascience sandbox (pandas loaded)", mem: d.memory(ctx, rt), goal: "< 50 MB"})
		d.destroy(ctx)
	}
	printTable(rows)
}

// benchDirs names the bench's images and workspaces to its runtime
// (newSandbox adds them).
var benchDirs oci.Dirs

// newRuntime is the sandbox runtime every measure uses: runc, with its
// state in stateRoot and its cgroups under sbx-bench, resolving images
// and volumes through images and volumes.
func newRuntime(images oci.Images, volumes oci.Volumes) *oci.Runtime {
	rt, err := oci.New(oci.Config{StateDir: stateRoot, ExecutorPath: *exePath, CgroupParent: "sbx-bench",
		Images: images, Volumes: volumes,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		log.Fatal(err)
	}
	return rt
}

type row struct {
	name     string
	p50, p99 time.Duration
	mem      uint64
	// goal is the target; "(SPEC floor)" marks one of the performance
	// floor in docs/REQUIREMENTS.md.
	goal, vs string
}

func printTable(rows []row) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "measure\tp50\tp99\tgoal\tvs baseline (same run)")
	for _, r := range rows {
		p50, p99 := fmtDur(r.p50), fmtDur(r.p99)
		if r.mem > 0 {
			p50, p99 = fmt.Sprintf("%.1f MB", float64(r.mem)/(1<<20)), ""
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.name, p50, p99, r.goal, r.vs)
	}
	w.Flush()
}

func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return ""
	case d < time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
}

func ratio(a, b time.Duration, what string) string {
	if a == 0 || b == 0 {
		return ""
	}
	if a < b {
		return fmt.Sprintf("%.1fx faster than %s", float64(b)/float64(a), what)
	}
	return fmt.Sprintf("%.1fx slower than %s", float64(a)/float64(b), what)
}

type samples []time.Duration

func measure(n int, f func()) samples {
	out := make(samples, 0, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		f()
		out = append(out, time.Since(t0))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// measurePaced is measure with idle time before each sample.
func measurePaced(n int, pause time.Duration, f func()) samples {
	return measure(n, func() { time.Sleep(pause); f() }).minus(pause)
}

func (s samples) minus(d time.Duration) samples {
	for i := range s {
		s[i] -= d
	}
	return s
}

// p is the q-th percentile (nearest rank).
func (s samples) p(q int) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := (q*len(s) + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}

func ensure(ctx context.Context, store *template.Store, name string) *template.Template {
	spec, _ := template.Builtin(name)
	if t, ok := store.Lookup(spec); ok {
		return t
	}
	fmt.Fprintf(os.Stderr, "bench: building template %s\n", name)
	store.Jobs = oci.NewJobRunner(oci.Config{StateDir: stateRoot, CgroupParent: "sbx-bench"})
	t, err := store.Ensure(ctx, spec, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	return t
}

type sandbox struct {
	id     string
	client *execclient.Client
	rt     runtime.Runtime
}

func newSandbox(ctx context.Context, rt runtime.Runtime, id string, tmpl *template.Template, wsRoot string) *sandbox {
	rt.Destroy(ctx, id) // a previous run that died
	ws, err := os.MkdirTemp(wsRoot, "ws-")
	if err != nil {
		log.Fatal(err)
	}
	benchDirs.Add(tmpl.Image(), tmpl.Rootfs)
	benchDirs.Add("ws/"+id, ws)
	if _, err := rt.Create(ctx, runtime.Spec{ID: id, Image: tmpl.Image(), Volume: "ws/" + id,
		Preload: tmpl.Spec.Preload, Env: tmpl.Spec.Env, Resources: tmpl.Spec.Resources}); err != nil {
		log.Fatal(err)
	}
	return &sandbox{id: id, rt: rt, client: execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })}
}

func (s *sandbox) run(ctx context.Context, lang, code string) {
	s.do(ctx, wire.RunRequest{Language: lang, Code: code})
}

func (s *sandbox) runIn(ctx context.Context, contextID, code string) {
	s.do(ctx, wire.RunRequest{Language: "python", Code: code, ContextID: contextID})
}

func (s *sandbox) do(ctx context.Context, req wire.RunRequest) {
	res, err := s.client.Run(ctx, req, nil)
	if err != nil {
		log.Fatalf("%s: %v", s.id, err)
	}
	if res.Status != wire.StatusCompleted {
		log.Fatalf("%s: %s: %+v %s", s.id, res.Status, res.Error, res.Stderr)
	}
}

func (s *sandbox) waitReady(ctx context.Context) {
	if err := s.client.WaitReady(ctx); err != nil {
		log.Fatal(err)
	}
}

func (s *sandbox) memory(ctx context.Context, rt runtime.Runtime) uint64 {
	r, ok := runtime.StatsReaderOf(rt)
	if !ok {
		log.Fatal("the runtime reads no stats")
	}
	st, err := r.Stats(ctx, s.id)
	if err != nil {
		log.Fatal(err)
	}
	return st.MemoryBytes
}

func (s *sandbox) destroy(ctx context.Context) {
	s.client.Close()
	if err := s.rt.Destroy(ctx, s.id); err != nil {
		log.Fatal(err)
	}
}

func bwrapCmd(rootfs, code string) *exec.Cmd {
	return exec.Command("bwrap", "--ro-bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev",
		"--tmpfs", "/tmp", "--unshare-all", "--die-with-parent", "--uid", "1000", "--gid", "1000",
		"/usr/bin/python3", "-c", code)
}

func mustRun(cmd *exec.Cmd) {
	if out, err := cmd.CombinedOutput(); err != nil {
		log.Fatalf("%s: %v: %s", strings.Join(cmd.Args, " "), err, out)
	}
}

// runcOnce is the "fresh container per execution" baseline: a bundle over
// the same read-only rootfs with fresh namespaces, run in the foreground.
func runcOnce(rootfs, code string) {
	dir, err := os.MkdirTemp(stateRoot, "baseline-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := fmt.Sprintf(`{"ociVersion":"1.0.2","root":{"path":%q,"readonly":true},
"process":{"args":["/usr/bin/python3","-c",%q],"cwd":"/","user":{"uid":1000,"gid":1000},"env":["PATH=/usr/bin:/bin"],"noNewPrivileges":true},
"mounts":[{"destination":"/proc","type":"proc","source":"proc"},{"destination":"/dev","type":"tmpfs","source":"tmpfs"},{"destination":"/tmp","type":"tmpfs","source":"tmpfs"}],
"linux":{"namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"},{"type":"network"}],"cgroupsPath":"/sbx-bench/baseline"}}`, rootfs, code)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		log.Fatal(err)
	}
	mustRun(exec.Command("runc", "--root", filepath.Join(stateRoot, "baseline-runc"), "run", "--bundle", dir, filepath.Base(dir)))
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
