package scratch

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/executor"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

func mono() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func envInt(k string, d int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return v
	}
	return d
}

// TestTrace: CREATES sandboxes create->first run, then N paced + N back-to-back runs
// in the last one; every process appends to ctl/trace.log.
func TestTrace(t *testing.T) {
	e := testenv.New(t)
	rt, err := oci.New(oci.Config{StateDir: e.StateRoot + "/x", ExecutorPath: e.Executor})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := os.Getenv("TMPL")
	if name == "" {
		name = "python"
	}
	spec, _ := template.Builtin(name)
	tm, ok := template.NewStore("/var/lib/sbx/templates").Lookup(spec)
	if !ok {
		t.Fatal("no template")
	}
	code := os.Getenv("CODE")
	if code == "" {
		code = "print(1)"
	}
	out := os.Getenv("OUT")
	if out == "" {
		out = "/tmp/exp/trace.txt"
	}
	tf, _ := os.Create(out)
	defer tf.Close()
	creates := envInt("CREATES", 3)
	n := envInt("N", 40)
	pace := time.Duration(envInt("PACE_MS", 50)) * time.Millisecond
	var c *executor.Client
	for i := 0; i < creates; i++ {
		id := fmt.Sprintf("lat%d", i)
		ws, _ := os.MkdirTemp(e.WorkspaceRoot, "ws")
		bundle := filepath.Join(e.StateRoot, "x", "sandboxes", id)
		time.Sleep(300 * time.Millisecond)
		t0 := mono()
		_, err = rt.Create(ctx, runtime.Spec{ID: id, Rootfs: tm.Rootfs, Workspace: ws, Preload: tm.Spec.Preload,
			Env: map[string]string{"SBX_TRACE": "/run/sbx/trace.log"}, Resources: tm.Spec.Resources})
		if err != nil {
			t.Fatal(err)
		}
		t1 := mono()
		c = executor.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
		r, err := c.Run(ctx, executor.RunRequest{Language: "python", Code: code}, nil)
		t2 := mono()
		if err != nil || r.Status != "completed" {
			t.Fatal(err, r)
		}
		time.Sleep(500 * time.Millisecond)
		b, _ := os.ReadFile(filepath.Join(bundle, "ctl", "trace.log"))
		fmt.Fprintf(tf, "=== create %d\n%s", i, b)
		fmt.Fprintf(tf, "%d host create.start\n%d host create.done\n%d host run.done\n", t0, t1, t2)
		os.Truncate(filepath.Join(bundle, "ctl", "trace.log"), 0)
		t.Logf("create %d: create %v first-run %v", i, time.Duration(t1-t0), time.Duration(t2-t1))
		if i < creates-1 {
			c.Close()
			rt.Destroy(ctx, id)
		} else {
			defer rt.Destroy(ctx, id)
		}
	}
	id := fmt.Sprintf("lat%d", creates-1)
	bundle := filepath.Join(e.StateRoot, "x", "sandboxes", id)
	for i := 0; i < 10; i++ {
		c.Run(ctx, executor.RunRequest{Language: "python", Code: code}, nil)
	}
	time.Sleep(time.Second)
	os.Truncate(filepath.Join(bundle, "ctl", "trace.log"), 0)
	for _, mode := range []string{"paced", "b2b"} {
		var host []string
		for i := 0; i < n; i++ {
			if mode == "paced" {
				time.Sleep(pace)
			}
			t0 := mono()
			r, err := c.Run(ctx, executor.RunRequest{Language: "python", Code: code}, nil)
			t1 := mono()
			if err != nil || r.Status != "completed" {
				t.Fatal(err, r)
			}
			host = append(host, fmt.Sprintf("%d host run.start\n%d host run.done\n", t0, t1))
		}
		time.Sleep(500 * time.Millisecond)
		b, _ := os.ReadFile(filepath.Join(bundle, "ctl", "trace.log"))
		os.Truncate(filepath.Join(bundle, "ctl", "trace.log"), 0)
		fmt.Fprintf(tf, "=== %s\n", mode)
		for _, h := range host {
			fmt.Fprint(tf, h)
		}
		fmt.Fprintf(tf, "%s", b)
	}
	if os.Getenv("MEM") != "" {
		time.Sleep(2 * time.Second)
		st, _ := rt.Stats(ctx, id)
		t.Logf("stats %+v", st)
		t.Logf("bundle %s", bundle)
		time.Sleep(time.Duration(envInt("MEM", 0)) * time.Second)
	}
}
