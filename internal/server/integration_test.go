//go:build integration

package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/apitest"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/quota/quotatest"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// realServer is a server with real runc sandboxes, the shared template
// cache and a fresh database in dir.
type realServer struct {
	*httptest.Server
	app *app.App
	dir string
	rt  *oci.Runtime
}

func startReal(t *testing.T, dir string, configure ...func(*app.Config)) *realServer {
	t.Helper()
	return openReal(t, dir, func(h http.Handler) http.Handler { return apitest.Handler(t, h) }, configure...)
}

// openReal is startReal with the handler wrapped by wrap instead of the
// contract checker.
func openReal(t *testing.T, dir string, wrap func(http.Handler) http.Handler, configure ...func(*app.Config)) *realServer {
	t.Helper()
	env := testenv.New(t)
	state := filepath.Join(env.StateRoot, "srv")
	rt, err := oci.New(realRuntime(t, "", state, dir))
	if err != nil {
		t.Fatal(err)
	}
	cfg := app.Config{
		DataDir: dir, StateDir: state, TemplateDir: testenv.TemplateDir(), ExecutorPath: env.Executor,
		Runtime: func(name string) (runtime.Runtime, error) {
			if name == "" || name == "runc" {
				return rt, nil
			}
			return oci.New(realRuntime(t, name, state, dir))
		},
	}
	for _, f := range configure {
		f(&cfg)
	}
	if cfg.WorkspaceQuota != "off" {
		quotatest.Require(t)
		// Registered before the sandboxes' cleanup, so it runs after it:
		// the image is unmounted once nothing uses it.
		t.Cleanup(func() {
			if err := quota.Unmount(filepath.Join(dir, "workspaces")); err != nil {
				t.Error(err)
			}
		})
	}
	a, err := app.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(wrap(a.Server.Handler()))
	rs := &realServer{Server: ts, app: a, dir: dir, rt: rt}
	t.Cleanup(func() {
		rs.stop()
		destroySandboxes(t, rt)
	})
	return rs
}

// realRuntime configures the OCI runtime name for a server over the
// data directory dir: the test's executor, the shared template store's
// images, and dir's workspaces as volumes, as app.Open's own runtime.
func realRuntime(t testing.TB, name, state, dir string) oci.Config {
	return oci.Config{Runtime: name, StateDir: state, ExecutorPath: testenv.New(t).Executor,
		Images: template.NewStore(testenv.TemplateDir()), Volumes: workspace.Volumes(filepath.Join(dir, "workspaces"))}
}

// runCommand runs cmd with its output captured, logs what ran and how long
// it took, and fails the test, showing the output, if cmd fails.
func runCommand(t *testing.T, name string, cmd *exec.Cmd) string {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s: %s (%v)", name, strings.Join(cmd.Args, " "), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("%s failed: %v\n%s", name, err, out.String())
	}
	return out.String()
}

// destroySandboxes destroys every sandbox of rt's state directory: a
// server leaves its sandboxes up for the next one to adopt, a test leaves
// none behind.
func destroySandboxes(t *testing.T, rt *oci.Runtime) {
	infos, err := rt.List(context.Background())
	if err != nil {
		t.Errorf("listing the test's sandboxes: %v", err)
	}
	for _, info := range infos {
		if err := rt.Destroy(context.Background(), info.ID); err != nil {
			t.Errorf("destroying sandbox %s: %v", info.ID, err)
		}
	}
}

func (rs *realServer) stop() {
	if rs.app == nil {
		return
	}
	rs.Server.Close()
	rs.app.Close()
	rs.app = nil
}

// newSession creates a session and waits until it is running.
func newSession(t *testing.T, c *client.Client, req api.CreateSessionRequest) *api.Session {
	t.Helper()
	ctx := context.Background()
	// Build the template first (minutes, once per machine) through the
	// test environment, so a cold cache shows up as a build, not a timeout.
	testenv.New(t).Rootfs(t, req.TemplateID)
	s, _, err := c.CreateSession(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for s.Status == api.StatusPending && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if s, err = c.GetSession(ctx, req.SessionID); err != nil {
			t.Fatal(err)
		}
	}
	if s.Status != api.StatusRunning {
		t.Fatalf("session %s: status %s (%s)", req.SessionID, s.Status, s.Error)
	}
	return s
}

func execOK(t *testing.T, c *client.Client, sid string, req api.ExecuteRequest) *api.Execution {
	t.Helper()
	res, err := c.Execute(context.Background(), sid, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != api.ExecCompleted {
		t.Fatalf("execution %s: %s: %+v\nstdout: %s\nstderr: %s", res.ExecutionID, res.Status, res.Error, res.Stdout, res.Stderr)
	}
	return res
}

// The data-analysis workload (docs/REQUIREMENTS.md, "Why sbx exists"), end
// to end over HTTP.
func TestDataAnalysisScenario(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "analysis", TemplateID: "python-datascience"})
	var csv strings.Builder
	csv.WriteString("city,temp\n")
	for i := range 100 {
		if i%10 == 3 {
			csv.WriteString("broken,\n")
			continue
		}
		fmt.Fprintf(&csv, "c%d,%d\n", i%7, 10+i%20)
	}
	up, err := c.Upload(ctx, "analysis", client.UploadOptions{}, client.UploadFile{Name: "data.csv", Reader: strings.NewReader(csv.String())})
	if err != nil {
		t.Fatal(err)
	}
	if up.Files[0].SandboxPath != "/workspace/data.csv" {
		t.Errorf("sandbox path %s", up.Files[0].SandboxPath)
	}
	r1 := execOK(t, c, "analysis", api.ExecuteRequest{Code: `
import pandas as pd
df = pd.read_csv("/workspace/data.csv")
clean = df.dropna()
clean.to_csv("/workspace/data_clean.csv", index=False)
return {"rows": len(df), "clean_rows": len(clean)}
`})
	var counts struct{ Rows, CleanRows int }
	json.Unmarshal(r1.ReturnValue, &struct {
		Rows      *int `json:"rows"`
		CleanRows *int `json:"clean_rows"`
	}{&counts.Rows, &counts.CleanRows})
	if counts.Rows != 100 || counts.CleanRows != 90 {
		t.Errorf("row counts %s, want 100 and 90", r1.ReturnValue)
	}
	if !contains(r1.Artifacts, "data_clean.csv") {
		t.Errorf("step 1 artifacts %v", r1.Artifacts)
	}
	r2 := execOK(t, c, "analysis", api.ExecuteRequest{Code: `
import pandas as pd
df = pd.read_csv("/workspace/data_clean.csv")
s = df["temp"].describe()
return {"mean": round(float(s["mean"]), 3), "max": float(s["max"]), "count": int(s["count"])}
`})
	var stats map[string]float64
	json.Unmarshal(r2.ReturnValue, &stats)
	if stats["count"] != 90 || stats["max"] != 29 {
		t.Errorf("statistics %s", r2.ReturnValue)
	}
	r3 := execOK(t, c, "analysis", api.ExecuteRequest{Code: `
import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv("/workspace/data_clean.csv")
df.groupby("city")["temp"].mean().plot(kind="bar")
plt.savefig("/workspace/chart.png")
print("saved")
`})
	if !contains(r3.Artifacts, "chart.png") || strings.TrimSpace(r3.Stdout) != "saved" {
		t.Errorf("step 3: artifacts %v stdout %q", r3.Artifacts, r3.Stdout)
	}
	var img bytes.Buffer
	if _, err := c.Download(ctx, "analysis", "chart.png", &img); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&img); err != nil {
		t.Errorf("chart.png is not a PNG: %v", err)
	}
	hist, err := c.ListExecutions(ctx, "analysis", 10, "")
	if err != nil || len(hist.Executions) != 3 || hist.Executions[0].ExecutionID != r3.ExecutionID {
		t.Errorf("history: %+v %v", hist, err)
	}
}

// The question-answering workload (docs/REQUIREMENTS.md, "Why sbx
// exists"): one upload, read in parts.
func TestQuestionAnsweringScenario(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "qa", TemplateID: "file-parser"})
	pdf := makePDF(20)
	if _, err := c.Upload(ctx, "qa", client.UploadOptions{ConversationID: "conv1", Subdir: "temparea"},
		client.UploadFile{Name: "report.pdf", Reader: bytes.NewReader(pdf), ContentType: "application/pdf"}); err != nil {
		t.Fatal(err)
	}
	read := func(first, last int) []string {
		res := execOK(t, c, "qa", api.ExecuteRequest{ConversationID: "conv1", Event: json.RawMessage(fmt.Sprintf(`{"first":%d,"last":%d}`, first, last)), Code: `
from pypdf import PdfReader
def handler(event):
    r = PdfReader("/workspace/uploads/temparea/report.pdf")
    return [r.pages[i].extract_text().strip() for i in range(event["first"] - 1, event["last"])]
`})
		var pages []string
		if err := json.Unmarshal(res.ReturnValue, &pages); err != nil {
			t.Fatalf("pages: %s: %v", res.ReturnValue, err)
		}
		return pages
	}
	for _, part := range [][2]int{{1, 10}, {11, 20}} {
		pages := read(part[0], part[1])
		if len(pages) != 10 {
			t.Fatalf("pages %d-%d: got %d", part[0], part[1], len(pages))
		}
		for i, text := range pages {
			if want := fmt.Sprintf("Page %d of the quarterly report", part[0]+i); text != want {
				t.Errorf("page %d: %q, want %q", part[0]+i, text, want)
			}
		}
	}
}

// makePDF writes a PDF of n pages, page i saying "Page i of the quarterly
// report" in Helvetica.
func makePDF(n int) []byte {
	var b bytes.Buffer
	var offsets []int
	obj := func(body string) {
		offsets = append(offsets, b.Len())
		fmt.Fprintf(&b, "%d 0 obj\n%s\nendobj\n", len(offsets), body)
	}
	b.WriteString("%PDF-1.4\n")
	kids := make([]string, n)
	for i := range n {
		kids[i] = fmt.Sprintf("%d 0 R", 4+2*i)
	}
	obj("<< /Type /Catalog /Pages 2 0 R >>")
	obj(fmt.Sprintf("<< /Type /Pages /Kids [%s] /Count %d >>", strings.Join(kids, " "), n))
	obj("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
	for i := range n {
		stream := fmt.Sprintf("BT /F1 18 Tf 72 700 Td (Page %d of the quarterly report) Tj ET", i+1)
		obj(fmt.Sprintf("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>", 5+2*i))
		obj(fmt.Sprintf("<< /Length %d >>\nstream\n%s\nendstream", len(stream), stream))
	}
	xref := b.Len()
	fmt.Fprintf(&b, "xref\n0 %d\n0000000000 65535 f \n", len(offsets)+1)
	for _, off := range offsets {
		fmt.Fprintf(&b, "%010d 00000 n \n", off)
	}
	fmt.Fprintf(&b, "trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n", len(offsets)+1, xref)
	return b.Bytes()
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// sandboxState is the runtime's state of the session's one sandbox, ""
// when it has none.
func (rs *realServer) sandboxState(t *testing.T, sid string) runtime.State {
	infos, err := rs.rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		if info.Labels[sandbox.LabelSession] == sid {
			return info.State
		}
	}
	return ""
}

// sandboxesOf counts the runtime's sandboxes serving a session.
func (rs *realServer) sandboxesOf(t *testing.T, sid string) int {
	infos, err := rs.rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, info := range infos {
		if info.Labels[sandbox.LabelSession] == sid {
			n++
		}
	}
	return n
}

func TestConcurrentCreateOneSandbox(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	testenv.New(t).Rootfs(t, "python")
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ok, err := c.CreateSession(context.Background(), api.CreateSessionRequest{SessionID: "once", TemplateID: "python", WarmUp: true})
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				created++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	newSession(t, c, api.CreateSessionRequest{SessionID: "once", TemplateID: "python", WarmUp: true})
	if created != 1 || rs.sandboxesOf(t, "once") != 1 {
		t.Errorf("50 concurrent creates: %d created, %d sandboxes; want 1 and 1", created, rs.sandboxesOf(t, "once"))
	}
}

func TestExecutionModes(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "modes", TemplateID: "python"})

	t.Run("Stream", func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		res, err := c.ExecuteStream(ctx, "modes", api.ExecuteRequest{Code: "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.05)\nreturn 7"},
			func(stream, text string) {
				mu.Lock()
				got = append(got, stream+":"+text)
				mu.Unlock()
			})
		if err != nil || res.Status != api.ExecCompleted || string(res.ReturnValue) != "7" {
			t.Fatalf("stream result %+v, %v", res, err)
		}
		if joined := strings.Join(got, ""); !strings.Contains(joined, "tick 2") || !strings.HasPrefix(joined, "stdout:") {
			t.Errorf("streamed %q", got)
		}
	})
	t.Run("AsyncAndCancel", func(t *testing.T) {
		sub, err := c.Submit(ctx, "modes", api.ExecuteRequest{Code: "import time\ntime.sleep(60)"})
		if err != nil || sub.Status != api.ExecSubmitted {
			t.Fatalf("submit %+v %v", sub, err)
		}
		for {
			x, err := c.GetExecution(ctx, sub.ExecutionID)
			if err != nil {
				t.Fatal(err)
			}
			if x.Status == api.ExecRunning {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		x, err := c.CancelExecution(ctx, sub.ExecutionID)
		if err != nil || x.Status != api.ExecCancelled {
			t.Errorf("cancel: %+v %v", x, err)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		res, err := c.Execute(ctx, "modes", api.ExecuteRequest{Code: "import time\ntime.sleep(30)", Timeout: 0.5})
		if err != nil || res.Status != api.ExecTimeout {
			t.Errorf("timeout: %+v %v", res, err)
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		start := time.Now()
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := c.Execute(ctx, "modes", api.ExecuteRequest{Code: fmt.Sprintf("import time\ntime.sleep(0.5)\nreturn %d", i)})
				if err != nil || res.Status != api.ExecCompleted || string(res.ReturnValue) != fmt.Sprint(i) {
					t.Errorf("concurrent %d: %+v %v", i, res, err)
				}
			}()
		}
		wg.Wait()
		t.Logf("4 concurrent 0.5 s executions took %v", time.Since(start))
	})
	t.Run("Bash", func(t *testing.T) {
		res := execOK(t, c, "modes", api.ExecuteRequest{Language: "bash", Code: "echo $((6*7)) > /workspace/answer; cat /workspace/answer"})
		if strings.TrimSpace(res.Stdout) != "42" {
			t.Errorf("bash stdout %q", res.Stdout)
		}
	})
	t.Run("Failure", func(t *testing.T) {
		res, err := c.Execute(ctx, "modes", api.ExecuteRequest{Code: "1/0"})
		if err != nil || res.Status != api.ExecFailed || res.Error == nil || res.Error.Type != "ZeroDivisionError" || !strings.Contains(res.Error.Traceback, "ZeroDivisionError") {
			t.Errorf("failure: %+v %v", res, err)
		}
	})
}

func TestPauseResumeTransparently(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "pz", TemplateID: "python"})
	execOK(t, c, "pz", api.ExecuteRequest{Code: "print('up')"})
	s, err := c.PauseSession(ctx, "pz")
	if err != nil || s.Status != api.StatusPaused || s.SandboxState != api.SandboxPaused {
		t.Fatalf("pause: %+v %v", s, err)
	}
	if st := rs.sandboxState(t, "pz"); st != runtime.StatePaused {
		t.Errorf("the runtime says the sandbox is %s, want paused", st)
	}
	// An execution on a paused session resumes it.
	execOK(t, c, "pz", api.ExecuteRequest{Code: "print('awake')"})
	if s, _ := c.GetSession(ctx, "pz"); s.Status != api.StatusRunning {
		t.Errorf("after execute on a paused session: %s", s.Status)
	}
	c.PauseSession(ctx, "pz")
	if s, err := c.ResumeSession(ctx, "pz"); err != nil || s.Status != api.StatusRunning {
		t.Errorf("resume: %+v %v", s, err)
	}
	// A file call thaws it too.
	c.PauseSession(ctx, "pz")
	if _, err := c.ListFiles(ctx, "pz", client.ListFilesOptions{}); err != nil {
		t.Fatal(err)
	}
	if s, _ := c.GetSession(ctx, "pz"); s.Status != api.StatusRunning || rs.sandboxState(t, "pz") != runtime.StateRunning {
		t.Errorf("after a file call on a paused session: %s, runtime %s", s.Status, rs.sandboxState(t, "pz"))
	}
}

func TestDeleteWhileRunning(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "del", TemplateID: "python"})
	sub, err := c.Submit(ctx, "del", api.ExecuteRequest{Code: "import time\ntime.sleep(60)"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if _, err := c.DeleteSession(ctx, "del"); err != nil {
		t.Fatal(err)
	}
	t.Logf("delete with a running execution took %v", time.Since(start))
	if n := rs.sandboxesOf(t, "del"); n != 0 {
		t.Errorf("%d sandboxes left after delete", n)
	}
	if _, err := c.Execute(ctx, "del", api.ExecuteRequest{Code: "1"}); err == nil {
		t.Error("execute on a deleted session worked")
	}
	// The execution is gone with its session.
	if x, err := c.GetResult(ctx, sub.ExecutionID, true, 10*time.Second); err == nil && x.Status == api.ExecRunning {
		t.Errorf("execution still running after delete: %+v", x)
	}
}

func TestResultsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	rs := startReal(t, dir)
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "rs", TemplateID: "python"})
	done := execOK(t, c, "rs", api.ExecuteRequest{Code: "open('/workspace/kept.txt','w').write('still here')\nreturn 'before'"})
	sub, err := c.Submit(ctx, "rs", api.ExecuteRequest{Code: "import time\ntime.sleep(60)"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	rs.stop()

	rs2 := startReal(t, dir)
	c2 := client.New(rs2.URL)
	x, err := c2.GetResult(ctx, done.ExecutionID, false, 0)
	if err != nil || x.Status != api.ExecCompleted || string(x.ReturnValue) != `"before"` {
		t.Errorf("result after restart: %+v %v", x, err)
	}
	x, err = c2.GetResult(ctx, sub.ExecutionID, false, 0)
	if err != nil || (x.Status != api.ExecCancelled && x.Status != api.ExecFailed) || x.Error == nil {
		t.Errorf("in-flight execution after restart: %+v %v", x, err)
	}
	// The session goes on in the sandbox the first server left (or a new
	// one), with its files.
	res := execOK(t, c2, "rs", api.ExecuteRequest{Code: "return open('/workspace/kept.txt').read()"})
	if string(res.ReturnValue) != `"still here"` {
		t.Errorf("workspace after restart: %s", res.ReturnValue)
	}
	if n := rs2.sandboxesOf(t, "rs"); n != 1 {
		t.Errorf("%d sandboxes for the session after restart, want 1", n)
	}
}

func TestConversationViews(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "conv", TemplateID: "python"})
	for _, cid := range []string{"c1", "c2"} {
		if _, err := c.Upload(ctx, "conv", client.UploadOptions{ConversationID: cid, Subdir: "temparea"},
			client.UploadFile{Name: "note.txt", Reader: strings.NewReader("for " + cid)}); err != nil {
			t.Fatal(err)
		}
	}
	// Two overlapping executions of different conversations each see only
	// their own upload.
	code := `
import os, time
seen = sorted(os.listdir("/workspace/uploads"))
mine = open("/workspace/uploads/temparea/note.txt").read()
time.sleep(0.5)
return {"seen": seen, "mine": mine}
`
	var wg sync.WaitGroup
	for _, cid := range []string{"c1", "c2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Execute(ctx, "conv", api.ExecuteRequest{Code: code, ConversationID: cid})
			if err != nil || res.Status != api.ExecCompleted {
				t.Errorf("%s: %+v %v", cid, res, err)
				return
			}
			if want := fmt.Sprintf(`{"seen":["temparea"],"mine":"for %s"}`, cid); string(res.ReturnValue) != want {
				t.Errorf("%s saw %s, want %s", cid, res.ReturnValue, want)
			}
		}()
	}
	wg.Wait()
	res, err := c.Execute(ctx, "conv", api.ExecuteRequest{ConversationID: "c1", Code: "open('/workspace/uploads/temparea/new.txt','w').write('x')"})
	if err != nil || res.Status != api.ExecFailed {
		t.Errorf("writing into the temp area: %+v %v", res, err)
	}
	if err := c.DeleteConversation(ctx, "conv", "c1"); err != nil {
		t.Fatal(err)
	}
	res = execOK(t, c, "conv", api.ExecuteRequest{ConversationID: "c1", Code: "import os\nreturn os.listdir('/workspace/uploads/temparea')"})
	if string(res.ReturnValue) != "[]" {
		t.Errorf("c1's temp area after purge: %s", res.ReturnValue)
	}
}

// Symlinks that sandboxed code plants in its workspace lead no file
// endpoint out of it.
func TestPlantedSymlinks(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "evil", TemplateID: "python"})
	newSession(t, c, api.CreateSessionRequest{SessionID: "victim", TemplateID: "python"})
	execOK(t, c, "victim", api.ExecuteRequest{Code: "open('/workspace/private.txt','w').write('victim data')"})
	execOK(t, c, "evil", api.ExecuteRequest{Language: "bash", Code: `
cd /workspace
ln -s /etc/passwd passwd
ln -s ../victim/private.txt steal
ln -s ../../../../../../etc etc
ln -s / root
mkfifo fifo`})
	for _, p := range []string{"passwd", "steal", "etc/passwd", "root/etc/shadow", "fifo"} {
		var buf bytes.Buffer
		_, err := c.Download(ctx, "evil", p, &buf)
		if err == nil || strings.Contains(buf.String(), "root:") || strings.Contains(buf.String(), "victim") {
			t.Errorf("download %s: %v %q", p, err, buf.String())
		}
		if _, err := c.Presign(ctx, "evil", p, time.Minute); err == nil {
			t.Errorf("presign %s worked", p)
		}
	}
	for _, p := range []string{"etc/", "root/tmp/"} {
		if _, err := c.Upload(ctx, "evil", client.UploadOptions{Path: p}, client.UploadFile{Name: "x", Reader: strings.NewReader("pwned")}); err == nil {
			t.Errorf("upload through %s worked", p)
		}
	}
	if l, err := c.ListFiles(ctx, "evil", client.ListFilesOptions{Path: "etc"}); err == nil && len(l.Files) > 0 {
		t.Errorf("listing through a symlink to /etc: %+v", l.Files)
	}
	if err := c.DeleteFile(ctx, "evil", "steal", false); err != nil {
		t.Errorf("deleting the link itself: %v", err)
	}
	res := execOK(t, c, "victim", api.ExecuteRequest{Code: "return open('/workspace/private.txt').read()"})
	if string(res.ReturnValue) != `"victim data"` {
		t.Errorf("the victim's file after the link's deletion: %s", res.ReturnValue)
	}
}

// An agent platform's calls: ensure the user's session, then
// execute through the agent endpoint; users of one agent are kept apart.
func TestAgentWorkflow(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	testenv.New(t).Rootfs(t, "python")
	id, err := c.EnsureSession(ctx, "alice", "analyst", nil)
	if err != nil || id != "sb-session-alice-analyst" {
		t.Fatalf("ensure: %q %v", id, err)
	}
	if _, err := c.Upload(ctx, id, client.UploadOptions{ConversationID: "c1"}, client.UploadFile{Name: "q.txt", Reader: strings.NewReader("alice's question")}); err != nil {
		t.Fatal(err)
	}
	res, err := c.AgentExecute(ctx, "analyst", api.AgentExecuteRequest{UserID: "alice", ConversationID: "c1",
		Code: "open('/workspace/mine.txt','w').write('alice')\nreturn open('/workspace/uploads/temparea/q.txt').read()"})
	if err != nil || res.Status != api.ExecCompleted || string(res.ReturnValue) != `"alice's question"` || res.SessionID != id {
		t.Fatalf("agent execute: %+v %v", res, err)
	}
	// Bob's first call makes his own session, which has none of Alice's files.
	res, err = c.AgentExecute(ctx, "analyst", api.AgentExecuteRequest{UserID: "bob", Code: "import os\nreturn sorted(os.listdir('/workspace'))"})
	if err != nil || res.Status != api.ExecCompleted || string(res.ReturnValue) != `["uploads"]` || res.SessionID != "sb-session-bob-analyst" {
		t.Errorf("bob's first call: %+v %v", res, err)
	}
	// Ensuring again reuses Alice's session, files and all.
	if again, err := c.EnsureSession(ctx, "alice", "analyst", nil); err != nil || again != id {
		t.Errorf("ensure again: %q %v", again, err)
	}
	res = execOK(t, c, id, api.ExecuteRequest{Code: "return open('/workspace/mine.txt').read()"})
	if string(res.ReturnValue) != `"alice"` {
		t.Errorf("alice's file: %s", res.ReturnValue)
	}
	// The code tools, as a model would call them.
	invoke := func(name, args string) api.ToolResult {
		t.Helper()
		body := `{"user_id":"alice","agent_id":"analyst","conversation_id":"c1","arguments":` + args + `}`
		resp, err := http.Post(rs.URL+"/api/v1/tools/"+name+"/invoke", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out api.ToolResult
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", name, resp.StatusCode, err)
		}
		return out
	}
	if r := invoke("execute_code", `{"code":"print('hi')\nreturn len(open('/workspace/uploads/temparea/q.txt').read())"}`); r.IsError || r.Content != "stdout:\nhi\nresult: 16\n" || r.SessionID != id {
		t.Errorf("execute_code: %+v", r)
	}
	if r := invoke("execute_code", `{"code":"1/0"}`); !r.IsError || !strings.Contains(r.Content, "ZeroDivisionError") {
		t.Errorf("execute_code raising: %+v", r)
	}
	if r := invoke("run_bash", `{"command":"cat mine.txt; echo; exit 3"}`); !r.IsError || r.Content != "stdout:\nalice\nexit code: 3\n" {
		t.Errorf("run_bash: %q", r.Content)
	}
}

// What sandboxed code can do to sbx's uploads/ (rename it at the top of
// the workspace it owns, link to it) gets no front door to change what
// is in it; and what it cannot do (write into it, move it below the
// top) it really cannot.
func TestManagedDirsAgainstSandbox(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "sb-session-u-a", TemplateID: "python"})
	if _, err := c.Upload(ctx, "sb-session-u-a", client.UploadOptions{ConversationID: "c1"}, client.UploadFile{Name: "q.txt", Reader: strings.NewReader("question")}); err != nil {
		t.Fatal(err)
	}
	res := execOK(t, c, "sb-session-u-a", api.ExecuteRequest{Language: "bash", Code: `
cd /workspace
echo x > uploads/c1/temparea/q.txt 2>/dev/null && echo wrote-into
mkdir d && mv uploads d/ 2>/dev/null && echo moved-below
ln -s uploads x
mv uploads old && echo renamed
ln -s old/c1 y`})
	if res.Stdout != "renamed\n" {
		t.Fatalf("the sandbox user's moves: %q, want only the rename at the top", res.Stdout)
	}
	for _, p := range []string{"x/c1/temparea/", "old/c1/temparea/", "y/temparea/"} {
		if _, err := c.Upload(ctx, "sb-session-u-a", client.UploadOptions{Path: p}, client.UploadFile{Name: "q.txt", Reader: strings.NewReader("pwned")}); err == nil {
			t.Errorf("upload to %s worked", p)
		}
		if err := c.DeleteFile(ctx, "sb-session-u-a", p+"q.txt", false); err == nil {
			t.Errorf("delete of %sq.txt worked", p)
		}
		body := `{"user_id":"u","agent_id":"a","arguments":{"path":"/workspace/` + p + `q.txt","content":"pwned"}}`
		resp, err := http.Post(rs.URL+"/api/v1/tools/upload_file/invoke", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var out api.ToolResult
		json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode != 200 || !out.IsError {
			t.Errorf("upload_file to %s: %d %+v", p, resp.StatusCode, out)
		}
	}
	res = execOK(t, c, "sb-session-u-a", api.ExecuteRequest{Code: "return open('/workspace/old/c1/temparea/q.txt').read()"})
	if string(res.ReturnValue) != `"question"` {
		t.Errorf("the upload after the attempts: %s", res.ReturnValue)
	}
}
