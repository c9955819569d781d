package server_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/template"
)

// Sizes of what the hostile executor answers every run with: output at
// the executor's cap, stderr of control characters (six bytes each in
// JSON), a return value of 2 MiB.
const (
	hugeOut    = 1 << 20
	hugeReturn = 2 << 20
	// largeCode is about as much code as a request may carry.
	largeCode = wire.MaxCodeBytes - 64
)

// hugeExecutor serves the executor's protocol on a unix socket and
// answers every run with as much as a sandbox may send back.
func hugeExecutor(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "executor.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ret, _ := json.Marshal(strings.Repeat("r", hugeReturn-2))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(wire.Health{OK: true, Ready: true})
	})
	mux.HandleFunc("POST /run", func(w http.ResponseWriter, r *http.Request) {
		var req wire.RunRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, `{"error":{"code":"invalid_argument","message":"bad request"}}`, 400)
			return
		}
		now := time.Now().UTC()
		json.NewEncoder(w).Encode(wire.Event{Type: "result", Result: &wire.Result{
			ID: req.ID, Status: wire.StatusCompleted, Stdout: strings.Repeat("o", hugeOut), Stderr: strings.Repeat("\x01", hugeOut),
			ReturnValue: ret, Artifacts: []string{}, StartedAt: now, FinishedAt: now,
		}})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// startHistory runs a server whose sandboxes answer as hugeExecutor does,
// with these limits for every tenant.
func startHistory(t *testing.T, limits string) *testServer {
	t.Helper()
	lim, err := server.ParseLimits(limits, session.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	rt := &execRuntime{Fake: runtimetest.NewFake(), sock: hugeExecutor(t)}
	ts := startConfigured(t, func(c *app.Config) {
		c.Runtime = func(string) (runtime.Runtime, error) { return rt, nil }
		c.Limits = lim
	}, "key-alpha-1:alpha", "key-beta-1:beta")
	spec, _ := template.Builtin("python")
	fakeTemplateBuild(t, ts, "", spec)
	return ts
}

// result is an execution as the API answers it, with what the record
// cut (api.Execution.Truncated; spelt out so that the test runs against
// a server from before the field, and fails there).
type result struct {
	api.Execution
	Truncated map[string]int64 `json:"truncated"`
}

// getResult reads an execution's result back.
func getResult(t *testing.T, ts *testServer, key, id string) (int, *result) {
	t.Helper()
	resp, b := ts.do(t, "GET", "/api/v1/executions/"+id+"/result", "", nil, "Authorization", "Bearer "+key)
	var x result
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(b, &x); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, &x
}

// runHuge runs large code in the session and checks that the answer has
// the whole result.
func runHuge(t *testing.T, ts *testServer, key, sid string) string {
	t.Helper()
	body, _ := json.Marshal(api.ExecuteRequest{Code: "#" + strings.Repeat("c", largeCode-1)})
	resp, b := ts.do(t, "POST", "/api/v1/sessions/"+sid+"/execute?wait=true", "application/json", strings.NewReader(string(body)), "Authorization", "Bearer "+key)
	var x result
	if resp.StatusCode != 200 || json.Unmarshal(b, &x) != nil || x.Status != api.ExecCompleted {
		t.Fatalf("execute in %s: %d %.300s", sid, resp.StatusCode, b)
	}
	if len(x.Stdout) != hugeOut || len(x.Stderr) != hugeOut || len(x.ReturnValue) != hugeReturn || x.Truncated != nil {
		t.Fatalf("the answer of the run: %d, %d, %d bytes, truncated %v; want it whole", len(x.Stdout), len(x.Stderr), len(x.ReturnValue), x.Truncated)
	}
	return x.ExecutionID
}

// historyBytes sums what each tenant's execution records take in the
// server's database.
func historyBytes(t *testing.T, ts *testServer) (map[string]int64, int64) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(ts.dir, "sbx.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT tenant, SUM(COALESCE(length(CAST(request AS BLOB)), 0) + COALESCE(length(CAST(result AS BLOB)), 0)),
		MAX(COALESCE(length(CAST(request AS BLOB)), 0) + COALESCE(length(CAST(result AS BLOB)), 0)) FROM executions GROUP BY tenant`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out, largest := map[string]int64{}, int64(0)
	for rows.Next() {
		var tenant string
		var sum, most int64
		if err := rows.Scan(&tenant, &sum, &most); err != nil {
			t.Fatal(err)
		}
		out[tenant], largest = sum, max(largest, most)
	}
	return out, largest
}

// An execution's record in the metadata store is bounded whatever the
// request and the sandbox's answer hold (8 MiB of code, 1 MiB of output
// that escapes to 6 MiB of JSON, a 2 MiB return value): the code's start
// and size are kept, the outputs up to 1 MiB, the return value not at all,
// and the result read back names what was cut with its full size. Before,
// each such record took over 20 MiB.
func TestExecutionRecordBounded(t *testing.T) {
	ts := startHistory(t, "") // no limits: only what a record keeps
	ctx := context.Background()
	if _, _, err := ts.client("key-alpha-1").CreateSession(ctx, api.CreateSessionRequest{SessionID: "s", TemplateID: "python"}); err != nil {
		t.Fatal(err)
	}
	var id string
	for range 3 {
		id = runHuge(t, ts, "key-alpha-1", "s")
	}
	const bound = 4 << 20 // execution.MaxRecordBytes, as documented
	if sums, largest := historyBytes(t, ts); largest > bound || sums["alpha"] > 3*bound {
		t.Errorf("records take %d bytes, the largest %d; want each at most %d", sums["alpha"], largest, bound)
	}
	status, x := getResult(t, ts, "key-alpha-1", id)
	if status != 200 || x.Status != api.ExecCompleted || len(x.Stdout) != hugeOut || x.ReturnValue != nil ||
		x.Truncated["return_value"] != hugeReturn || x.Truncated["stderr"] != hugeOut || len(x.Stderr) == 0 || len(x.Stderr) >= hugeOut/5 {
		t.Errorf("the result read back: %s, stdout %d bytes, stderr %d, return value %d, truncated %v",
			x.Status, len(x.Stdout), len(x.Stderr), len(x.ReturnValue), x.Truncated)
	}
}

// A tenant's execution records together stay within its history_size,
// across its sessions: its oldest finished executions go (404), its
// newest stay readable, and another tenant's history is not touched.
func TestHistorySize(t *testing.T) {
	ts := startHistory(t, "history_size=16")
	ctx := context.Background()
	alpha, beta := ts.client("key-alpha-1"), ts.client("key-beta-1")
	for _, sid := range []string{"a1", "a2"} {
		if _, _, err := alpha.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid, TemplateID: "python"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := beta.CreateSession(ctx, api.CreateSessionRequest{SessionID: "b", TemplateID: "python"}); err != nil {
		t.Fatal(err)
	}
	betaRun := runHuge(t, ts, "key-beta-1", "b")
	var ids []string
	for i := range 16 {
		ids = append(ids, runHuge(t, ts, "key-alpha-1", fmt.Sprintf("a%d", 1+i%2)))
		sums, _ := historyBytes(t, ts)
		if sums["alpha"] > 16<<20 {
			t.Fatalf("after %d executions alpha's records take %d bytes, past its history_size of 16 MiB", i+1, sums["alpha"])
		}
	}
	if status, _ := getResult(t, ts, "key-alpha-1", ids[0]); status != 404 {
		t.Errorf("alpha's oldest execution: %d, want 404: it went", status)
	}
	for _, id := range ids[len(ids)-2:] {
		if status, x := getResult(t, ts, "key-alpha-1", id); status != 200 || x.Status != api.ExecCompleted || len(x.Stdout) != hugeOut {
			t.Errorf("alpha's newest execution %s: %d %s", id, status, x.Status)
		}
	}
	if status, x := getResult(t, ts, "key-beta-1", betaRun); status != 200 || x.Status != api.ExecCompleted {
		t.Errorf("beta's execution, under alpha's trims: %d %s", status, x.Status)
	}
}
