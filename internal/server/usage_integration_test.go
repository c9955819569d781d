//go:build integration

package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/server"
)

// TestSessionMetrics reads a real runc sandbox's usage while code
// in it allocates memory, burns CPU and writes a file: the current
// reading and the samples show each, another tenant gets 404, and the
// per-tenant Prometheus series follow; CPU time survives the sandbox's
// end. Every wait is for a condition, with a generous deadline.
func TestSessionMetrics(t *testing.T) {
	keys, err := server.ParseKeys([]string{"metrics-alpha:alpha", "metrics-beta1:beta"})
	if err != nil {
		t.Fatal(err)
	}
	rs := startReal(t, t.TempDir(), func(c *app.Config) { c.Keys, c.MetricsInterval, c.MetricsToken = keys, time.Second, metricsToken })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	a := client.New(rs.URL, client.WithAPIKey("metrics-alpha"))
	b := client.New(rs.URL, client.WithAPIKey("metrics-beta1"))
	sess := newSession(t, a, api.CreateSessionRequest{SessionID: "m", TemplateID: "python", WarmUp: true, Resources: &api.Resources{Disk: 768}})

	// waitFor polls the session's metrics until ok says so of them.
	waitFor := func(what string, ok func(*api.SessionMetrics) bool) *api.SessionMetrics {
		t.Helper()
		var m *api.SessionMetrics
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			var err error
			if m, err = a.SessionMetrics(ctx, "m", time.Time{}); err != nil {
				t.Fatalf("metrics: %v", err)
			}
			if ok(m) {
				return m
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s in two minutes; the last answer: %s", what, describeMetrics(m))
			}
		}
	}

	m := waitFor("reading and sample", func(m *api.SessionMetrics) bool { return m.Current != nil && len(m.Samples) > 0 })
	c := m.Current
	if m.Sandbox != api.SandboxRunning || m.IntervalSeconds != 1 || c.CPUCount <= 0 || c.MemoryLimitBytes <= 0 || c.PIDsLimit <= 0 ||
		c.MemoryUsedBytes <= 0 || c.PIDs <= 0 || c.DiskLimitBytes != sess.Resources.Disk<<20 || c.DiskUsedBytes <= 0 {
		t.Errorf("a running sandbox: %s", describeMetrics(m))
	}
	if _, err := b.SessionMetrics(ctx, "m", time.Time{}); !client.IsNotFound(err) {
		t.Errorf("beta asks for alpha's session's metrics: %v, want 404", err)
	}

	// 200 MB held by a run that sleeps; the sandbox's memory shows it,
	// now and in a sample.
	hog, err := a.Submit(ctx, "m", api.ExecuteRequest{Timeout: 600, Code: "import time\nheld = b'\\x01' * (200 << 20)\nprint('held', flush=True)\ntime.sleep(600)"})
	if err != nil {
		t.Fatal(err)
	}
	const over = 150 << 20
	waitFor("reading over 150 MB", func(m *api.SessionMetrics) bool { return m.Current != nil && m.Current.MemoryUsedBytes > over })
	waitFor("sample over 150 MB", func(m *api.SessionMetrics) bool {
		return len(m.Samples) > 0 && m.Samples[len(m.Samples)-1].MemoryUsedBytes > over
	})
	if tenant := scrapeTenant(t, rs.URL, "alpha"); tenant["sbx_tenant_sandbox_memory_bytes"] <= over || tenant["sbx_tenant_sandboxes"] != 1 {
		t.Errorf("alpha's series with 200 MB held: %v", tenant)
	}
	cancelRun(t, a, hog.ExecutionID)

	// A run that burns CPU until cancelled; some reading shows it.
	burn, err := a.Submit(ctx, "m", api.ExecuteRequest{Timeout: 600, Code: "import time\nend = time.time() + 600\nwhile time.time() < end:\n    pass"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor("CPU used in a reading and a sample", func(m *api.SessionMetrics) bool {
		return m.Current != nil && m.Current.CPUUsedPct > 0 && len(m.Samples) > 0 && m.Samples[len(m.Samples)-1].CPUUsedPct > 0
	})
	cancelRun(t, a, burn.ExecutionID)

	// A 50 MB file counts against the quota at once.
	before := waitFor("reading", func(m *api.SessionMetrics) bool { return m.Current != nil }).Current.DiskUsedBytes
	execOK(t, a, "m", api.ExecuteRequest{Code: "import os\nwith open('/workspace/big.bin', 'wb') as f:\n    f.write(os.urandom(50 << 20))"})
	waitFor("50 MB more disk", func(m *api.SessionMetrics) bool {
		return m.Current != nil && m.Current.DiskUsedBytes >= before+50<<20
	})

	// since keeps the newer samples.
	m = waitFor("two samples", func(m *api.SessionMetrics) bool { return len(m.Samples) >= 2 })
	last := m.Samples[len(m.Samples)-1].Timestamp
	if since, err := a.SessionMetrics(ctx, "m", last); err != nil || len(since.Samples) == 0 || since.Samples[0].Timestamp.Before(last) {
		t.Errorf("since the last sample: %s, %v", describeMetrics(since), err)
	}

	// Once the sandbox is gone, the session has no readings, and alpha's
	// CPU time stays (a counter).
	cpu := scrapeTenant(t, rs.URL, "alpha")["sbx_tenant_sandbox_cpu_seconds_total"]
	if cpu <= 0 {
		t.Errorf("alpha's CPU time after a burn: %v", cpu)
	}
	if _, err := a.HibernateSession(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if m, err = a.SessionMetrics(ctx, "m", time.Time{}); err != nil || m.Sandbox != "hibernated" || m.Current != nil || len(m.Samples) != 0 {
		t.Errorf("a hibernated session: %s, %v", describeMetrics(m), err)
	}
	rs.app.Usage.Pass(ctx)
	if tenant := scrapeTenant(t, rs.URL, "alpha"); tenant["sbx_tenant_sandbox_cpu_seconds_total"] < cpu || tenant["sbx_tenant_sandboxes"] != 0 {
		t.Errorf("alpha's series after its sandbox went: %v; want CPU time at least %v and no sandbox", tenant, cpu)
	}
}

// TestUsageSamplerCost logs what a pass of the sampler costs with a few
// real sandboxes held (no bound asserted: timing lives in bench/).
func TestUsageSamplerCost(t *testing.T) {
	rs := startReal(t, t.TempDir(), func(c *app.Config) { c.MetricsInterval = time.Hour })
	c := client.New(rs.URL)
	const n = 8
	for i := range n {
		newSession(t, c, api.CreateSessionRequest{SessionID: fmt.Sprintf("cost%d", i), TemplateID: "python", WarmUp: true})
	}
	ctx := context.Background()
	if read := rs.app.Usage.Pass(ctx); read != n {
		t.Fatalf("a pass read %d sandboxes, want %d", read, n)
	}
	const passes = 50
	start := time.Now()
	for range passes {
		rs.app.Usage.Pass(ctx)
	}
	per := time.Since(start) / passes
	t.Logf("a pass over %d sandboxes: %v (%v a sandbox: cgroups and the workspace's qgroup)", n, per, per/n)
	start = time.Now()
	m, err := c.SessionMetrics(ctx, "cost0", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("GET /sessions/cost0/metrics: %v (the sampler's readings are all under 250 ms old, so it read twice): %s", time.Since(start), describeMetrics(m))
}

// cancelRun cancels an execution and waits for its end.
func cancelRun(t *testing.T, c *client.Client, id string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.CancelExecution(ctx, id); err != nil {
		t.Fatal(err)
	}
	if x, err := c.WaitResult(ctx, id); err != nil || x.Status != api.ExecCancelled {
		t.Fatalf("execution %s after its cancel: %+v, %v", id, x, err)
	}
}

func describeMetrics(m *api.SessionMetrics) string {
	if m == nil {
		return "nil"
	}
	s := fmt.Sprintf("sandbox %s, %d samples", m.Sandbox, len(m.Samples))
	if m.Current != nil {
		s += fmt.Sprintf(", current %+v", *m.Current)
	}
	if len(m.Samples) > 0 {
		s += fmt.Sprintf(", last sample %+v", m.Samples[len(m.Samples)-1])
	}
	return s
}

// metricsToken is what the server of TestSessionMetrics asks /metrics for.
const metricsToken = "metrics-token-0123"

// scrapeTenant reads /metrics with the metrics token and returns the
// tenant's sbx_tenant_* series by name.
func scrapeTenant(t *testing.T, url, tenant string) map[string]float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+metricsToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	suffix := `{tenant="` + tenant + `"}`
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.HasPrefix(name, "sbx_tenant_") || !strings.HasSuffix(name, suffix) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("metrics: %q: %v", sc.Text(), err)
		}
		out[strings.TrimSuffix(name, suffix)] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
