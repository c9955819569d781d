package executor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

func TestClient(t *testing.T) {
	env := sharedEnv(t)
	ctx := context.Background()
	c := env.client

	h, err := c.Health(ctx)
	if err != nil || !h.OK || !h.Ready || h.Version != Version || h.PreloadError != "" {
		t.Errorf("health %+v %v", h, err)
	}
	if _, err := c.Run(ctx, wire.RunRequest{Language: "cobol", Code: "x"}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad language: %v", err)
	}
	var apiErr *client.APIError
	if _, err := c.Run(ctx, wire.RunRequest{Language: "python", TimeoutMs: -5}, nil); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
		t.Errorf("bad timeout: %v", err)
	}
	if ok, err := c.Cancel(ctx, "never-ran"); ok || err != nil {
		t.Errorf("cancel unknown: %v %v", ok, err)
	}
	if err := c.DeleteContext(ctx, "", "no-such-context"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("delete unknown context: %v", err)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.CgroupVersion == 0 || st.CPUUsageNs == 0 {
		t.Errorf("stats %+v %v", st, err)
	}

	// A second run with the id of a running one is refused.
	id := "dup-" + marker(t)
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var once sync.Once
		req := sh("echo up; sleep 1000")
		req.ID = id
		c.Run(ctx, req, func(_, _ string) { once.Do(func() { close(started) }) })
	}()
	<-started
	req := sh("true")
	req.ID = id
	if _, err := c.Run(ctx, req, nil); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("duplicate id: %v", err)
	}
	c.Cancel(ctx, id)
	<-done

	// Result fields that are always there.
	res := env.run(t, py("return 1"))
	if res.ID == "" || res.StartedAt.IsZero() || res.FinishedAt.Before(res.StartedAt) || res.Artifacts == nil {
		t.Errorf("result %+v", res)
	}
}

// TestWire checks the protocol as a non-Go client sees it.
func TestWire(t *testing.T) {
	env := sharedEnv(t)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", env.sock)
	}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Post("http://x/run", "application/json", strings.NewReader(`{"language":"python","code":"print('a')\nreturn '<b>'"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) != 2 || lines[0] != `{"type":"stdout","data":"a\n"}` || !strings.Contains(lines[1], `"return_value":"<b>"`) {
		t.Errorf("lines %q", lines)
	}
	resp, err = hc.Get("http://x/run")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /run: %d", resp.StatusCode)
	}
	resp, err = hc.Post("http://x/run", "application/json", strings.NewReader(`{"language":"python","code":"x","bogus":1}`))
	if err != nil {
		t.Fatal(err)
	}
	var eb wire.ErrorBody
	json.NewDecoder(resp.Body).Decode(&eb)
	resp.Body.Close()
	if resp.StatusCode != 400 || eb.Error.Code != "invalid_argument" || !strings.Contains(eb.Error.Message, "bogus") {
		t.Errorf("unknown field: %d %+v", resp.StatusCode, eb)
	}
}

// TestOutOfMemory runs an executor (this test binary) inside a memory
// cgroup of its own: an allocation beyond the limit fails the run with
// OutOfMemory, and the executor lives on. It also checks that SIGTERM
// stops the executor cleanly.
func TestOutOfMemory(t *testing.T) {
	requireRoot(t)
	base := "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(base, "memory.oom_control")); err != nil {
		t.Skip("needs a cgroup v1 memory hierarchy at " + base)
	}
	cg := filepath.Join(base, fmt.Sprintf("sbx-executor-test-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Skipf("cannot create a memory cgroup: %v", err)
	}
	defer os.Remove(cg)
	const limit = 256 << 20
	for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
		os.WriteFile(filepath.Join(cg, f), []byte(fmt.Sprint(limit)), 0o644)
	}
	cfg := testConfig(t)
	defer os.RemoveAll(cfg.Workspace)
	defer os.RemoveAll(filepath.Dir(cfg.SocketPath))
	cfgJSON, _ := json.Marshal(cfg)
	self, _ := os.Executable()
	// Enter the cgroup before exec, so that the executor and everything
	// it starts are in it from the first instruction.
	cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$2" -test.run=^$`, "sh", cg, self)
	cmd.Env = append(os.Environ(), childEnv+"="+string(cfgJSON))
	var logs syncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("executor did not exit 0 on SIGTERM: %v\n%s", err, tail(logs.String(), 2000))
			}
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			t.Errorf("executor ignored SIGTERM")
		}
	}()
	c := client.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", cfg.SocketPath)
	})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	for _, req := range []wire.RunRequest{
		py("b = bytearray(1 << 30)\nreturn len(b)"),
		sh(`python3 -c 'b = bytearray(1 << 30)'`),
	} {
		res, err := c.Run(ctx, req, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != wire.StatusFailed || res.Error == nil || res.Error.Type != wire.ErrTypeOutOfMemory || !strings.Contains(res.Error.Message, "256 MiB") {
			t.Errorf("%s: status %s exit %d error %+v", req.Language, res.Status, res.ExitCode, res.Error)
		}
	}
	res, err := c.Run(ctx, py("return 'alive'"), nil)
	if err != nil || string(res.ReturnValue) != `"alive"` {
		t.Errorf("after the OOM: %v %+v", err, res)
	}
	if st, err := c.Stats(ctx); err != nil || st.OOMKillCount < 2 || st.MemoryLimitBytes != limit {
		t.Errorf("stats %+v %v", st, err)
	}
}
