package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/apitest"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testenv.WithCleanup(m)) }

// noRuntime is a machine without a sandbox runtime: everything but
// execution must still work.
func noRuntime(string) (runtime.Runtime, error) {
	return nil, fmt.Errorf("no runtime in unit tests: %w", errdefs.ErrUnavailable)
}

type testServer struct {
	*httptest.Server
	app  *app.App
	dir  string
	keys server.Keys
}

// start runs a server with a fresh data directory and no sandbox runtime,
// every request and response checked against api/openapi.yaml.
func start(t *testing.T, keySpecs ...string) *testServer {
	t.Helper()
	return startConfigured(t, nil, keySpecs...)
}

// startConfigured is start with configure applied to the server's config.
func startConfigured(t *testing.T, configure func(*app.Config), keySpecs ...string) *testServer {
	t.Helper()
	keys, err := server.ParseKeys(keySpecs)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := app.Config{
		DataDir: dir, StateDir: filepath.Join(dir, "state"), Keys: keys, Runtime: noRuntime,
		TemplateDir: filepath.Join(dir, "templates"), Log: testLog(t),
		WorkspaceQuota: "off", // no sandboxes: nothing to hold to a quota
	}
	if configure != nil {
		configure(&cfg)
	}
	a, err := app.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(apitest.Handler(t, a.Server.Handler()))
	t.Cleanup(func() {
		ts.Close()
		a.Close()
	})
	return &testServer{Server: ts, app: a, dir: dir, keys: keys}
}

func (ts *testServer) client(key string) *client.Client {
	if key == "" {
		return client.New(ts.URL)
	}
	return client.New(ts.URL, client.WithAPIKey(key))
}

// do sends a raw request (for what the client would never send).
func (ts *testServer) do(t *testing.T, method, path, ctype string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, ts.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// noRedirects shows redirects (the mux's for unclean paths) as they are.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// testLog sends the server's logs to the test's log, shown on failure.
func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func errorCode(t *testing.T, b []byte) string {
	t.Helper()
	var e api.Error
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		t.Fatalf("not an error body: %s", b)
	}
	return e.Error.Code
}

func TestCreateValidation(t *testing.T) {
	ts := start(t)
	cases := []struct{ name, body, want string }{
		{"malformed", `{"template_id":`, "request body"},
		{"unknown field", `{"tempalte_id":"python"}`, "unknown field"},
		{"trailing", `{} {}`, "after the JSON object"},
		{"unknown template", `{"template_id":"nope"}`, "no such template"},
		{"bad template name", `{"template_id":"../x"}`, "template_id"},
		{"bad id", `{"session_id":"../etc"}`, "session_id"},
		{"id with dots", `{"session_id":"a..b"}`, "session_id"},
		{"negative timeout", `{"timeout":-1}`, "timeout"},
		{"huge timeout", `{"timeout":99999999}`, "timeout"},
		{"negative idle", `{"idle_timeout":-5}`, "idle_timeout"},
		{"absurd cpu", `{"resources":{"cpu":1000}}`, "resources.cpu"},
		{"absurd memory", `{"resources":{"memory":99999999}}`, "resources.memory"},
		{"tiny disk", `{"resources":{"disk":1}}`, "resources.disk"},
		{"network", `{"network":"host"}`, "network"},
		{"env name", `{"env_vars":{"A=B":"c"}}`, "env_vars"},
		{"metadata key", `{"metadata":{"a b":"c"}}`, "metadata"},
		{"unit", `{"file_upload_config":{"max_file_size_unit":"TB"}}`, "max_file_size_unit"},
		{"negative size", `{"file_upload_config":{"max_file_size":-1}}`, "max_file_size"},
		{"file type", `{"file_upload_config":{"allowed_file_types":["../x"]}}`, "allowed_file_types"},
		{"wrong type", `{"timeout":"10"}`, "request body"},
	}
	t.Run("too large", func(t *testing.T) {
		body := `{"metadata":{"a":"` + strings.Repeat("x", 3<<20) + `"}}`
		resp, b := ts.do(t, "POST", "/api/v1/sessions", "application/json", strings.NewReader(body))
		if resp.StatusCode != 413 || errorCode(t, b) != "payload_too_large" {
			t.Errorf("3 MiB body: %d %s", resp.StatusCode, b)
		}
	})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, b := ts.do(t, "POST", "/api/v1/sessions", "application/json", strings.NewReader(c.body))
			if resp.StatusCode != 400 || errorCode(t, b) != "invalid_argument" || !strings.Contains(string(b), c.want) {
				t.Errorf("%s: %d %s, want 400 mentioning %q", c.body, resp.StatusCode, b, c.want)
			}
		})
	}
}

func TestSessionCRUD(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	s, created, err := c.CreateSession(ctx, api.CreateSessionRequest{
		SessionID: "s1", TemplateID: "python", Metadata: map[string]string{"user_id": "u1", "agent_id": "a1"},
		EnvVars: map[string]string{"SECRET": "x"}, Timeout: 3600,
	})
	if err != nil || !created {
		t.Fatalf("create: %v (created %v)", err, created)
	}
	// Lazy: running at once, no sandbox until code runs.
	if s.SessionID != "s1" || s.Status != api.StatusRunning || s.SandboxState != api.SandboxNone || s.TTL != 3600 {
		t.Errorf("created session: %+v", s)
	}
	if len(s.EnvVars) != 1 || s.EnvVars[0] != "SECRET" {
		t.Errorf("env_vars shown as %v, want the names only", s.EnvVars)
	}
	if !s.ExpiresAt.After(s.CreatedAt.Add(59 * time.Minute)) {
		t.Errorf("expires_at %v, created_at %v", s.ExpiresAt, s.CreatedAt)
	}
	again, created, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "s1"})
	if err != nil || created || again.CreatedAt != s.CreatedAt {
		t.Errorf("second create: %v, created %v", err, created)
	}
	if _, err := c.GetSession(ctx, "nope"); !client.IsNotFound(err) {
		t.Errorf("get unknown: %v, want not found", err)
	}
	c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "s2", Metadata: map[string]string{"user_id": "u2"}})
	list, err := c.ListSessions(ctx, client.ListSessionsOptions{UserID: "u1"})
	if err != nil || len(list.Sessions) != 1 || list.Sessions[0].SessionID != "s1" {
		t.Errorf("list user u1: %+v, %v", list, err)
	}
	del, err := c.DeleteSession(ctx, "s1")
	if err != nil || del.Status != api.StatusTerminated {
		t.Fatalf("delete: %+v, %v", del, err)
	}
	if del, err = c.DeleteSession(ctx, "s1"); err != nil || del.Status != api.StatusTerminated {
		t.Errorf("delete again: %+v, %v", del, err)
	}
	if _, err := c.DeleteSession(ctx, "never"); !client.IsNotFound(err) {
		t.Errorf("delete unknown: %v, want not found", err)
	}
	if got, _ := c.GetSession(ctx, "s1"); got == nil || got.Status != api.StatusTerminated {
		t.Errorf("get after delete: %+v", got)
	}
	// A terminated id can be created again, as a new session.
	if _, created, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "s1"}); err != nil || !created {
		t.Errorf("recreate: %v, created %v", err, created)
	}
	// Without a sandbox there is nothing to freeze: the session is marked
	// paused, and resume makes it running again.
	if got, err := c.PauseSession(ctx, "s2"); err != nil || got.Status != api.StatusPaused {
		t.Errorf("pause without a sandbox: %+v, %v", got, err)
	}
	if got, err := c.ResumeSession(ctx, "s2"); err != nil || got.Status != api.StatusRunning {
		t.Errorf("resume: %+v, %v", got, err)
	}
	// A terminated session cannot be paused or resumed.
	c.DeleteSession(ctx, "s1")
	for _, op := range []func(context.Context, string) (*api.Session, error){c.PauseSession, c.ResumeSession, c.HibernateSession} {
		if _, err := op(ctx, "s1"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("lifecycle call on a terminated session: %v, want failed precondition", err)
		}
	}
	if _, err := c.Keepalive(ctx, "s2", 7200); err != nil {
		t.Errorf("keepalive: %v", err)
	}
}

func TestPagination(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	for i := range 25 {
		if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: fmt.Sprintf("p%02d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	token := ""
	for pages := 0; ; pages++ {
		page, err := c.ListSessions(ctx, client.ListSessionsOptions{Limit: 10, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page.Sessions {
			if seen[s.SessionID] {
				t.Errorf("%s listed twice", s.SessionID)
			}
			seen[s.SessionID] = true
		}
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	if len(seen) != 25 {
		t.Errorf("listed %d sessions, want 25", len(seen))
	}
	resp, b := ts.do(t, "GET", "/api/v1/sessions?page_token=garbage", "", nil)
	if resp.StatusCode != 400 {
		t.Errorf("bad page token: %d %s", resp.StatusCode, b)
	}
	resp, b = ts.do(t, "GET", "/api/v1/sessions?limit=0", "", nil)
	if resp.StatusCode != 400 {
		t.Errorf("limit 0: %d %s", resp.StatusCode, b)
	}
}

func TestIdempotentCreateConcurrent(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	var wg sync.WaitGroup
	var mu sync.Mutex
	created, errs := 0, 0
	var first time.Time
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, ok, err := c.CreateSession(context.Background(), api.CreateSessionRequest{SessionID: "same"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs++
				return
			}
			if ok {
				created++
			}
			if first.IsZero() {
				first = s.CreatedAt
			} else if !s.CreatedAt.Equal(first) {
				t.Errorf("two sessions for one id: created at %v and %v", first, s.CreatedAt)
			}
		}()
	}
	wg.Wait()
	if created != 1 || errs != 0 {
		t.Errorf("50 creates of one id: %d created, %d errors; want 1 and 0", created, errs)
	}
}

func TestAuthAndTenancy(t *testing.T) {
	ts := start(t, "key-alpha-123:alpha", "key-beta-4567:beta")
	ctx := context.Background()
	resp, b := ts.do(t, "GET", "/api/v1/sessions", "", nil)
	if resp.StatusCode != 401 || errorCode(t, b) != "unauthenticated" {
		t.Errorf("no key: %d %s", resp.StatusCode, b)
	}
	resp, _ = ts.do(t, "GET", "/api/v1/sessions", "", nil, "Authorization", "Bearer wrong-key-000")
	if resp.StatusCode != 401 {
		t.Errorf("wrong key: %d", resp.StatusCode)
	}
	resp, _ = ts.do(t, "GET", "/api/v1/sessions", "", nil, "X-API-Key", "key-beta-4567")
	if resp.StatusCode != 200 {
		t.Errorf("X-API-Key: %d", resp.StatusCode)
	}
	alpha, beta := ts.client("key-alpha-123"), ts.client("key-beta-4567")
	if _, _, err := alpha.CreateSession(ctx, api.CreateSessionRequest{SessionID: "mine"}); err != nil {
		t.Fatal(err)
	}
	if _, err := alpha.Upload(ctx, "mine", client.UploadOptions{}, client.UploadFile{Name: "secret.txt", Reader: strings.NewReader("alpha's")}); err != nil {
		t.Fatal(err)
	}
	// Beta sees nothing of alpha's, and every attempt is a 404.
	if _, err := beta.GetSession(ctx, "mine"); !client.IsNotFound(err) {
		t.Errorf("beta get: %v", err)
	}
	if l, _ := beta.ListSessions(ctx, client.ListSessionsOptions{}); l == nil || len(l.Sessions) != 0 {
		t.Errorf("beta list: %+v", l)
	}
	if _, err := beta.ListFiles(ctx, "mine", client.ListFilesOptions{}); !client.IsNotFound(err) {
		t.Errorf("beta list files: %v", err)
	}
	if _, err := beta.Download(ctx, "mine", "secret.txt", io.Discard); !client.IsNotFound(err) {
		t.Errorf("beta download: %v", err)
	}
	if _, err := beta.Submit(ctx, "mine", api.ExecuteRequest{Code: "print(1)"}); !client.IsNotFound(err) {
		t.Errorf("beta execute: %v", err)
	}
	if _, err := beta.DeleteSession(ctx, "mine"); !client.IsNotFound(err) {
		t.Errorf("beta delete: %v", err)
	}
	// The same id in beta is another session.
	if _, created, err := beta.CreateSession(ctx, api.CreateSessionRequest{SessionID: "mine"}); err != nil || !created {
		t.Errorf("beta create of the same id: %v, created %v", err, created)
	}
	if _, err := alpha.GetSession(ctx, "mine"); err != nil {
		t.Errorf("alpha's session after beta's create: %v", err)
	}
	// An execution id of alpha's is unknown to beta.
	sub, err := alpha.Submit(ctx, "mine", api.ExecuteRequest{Code: "print(1)"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := beta.GetExecution(ctx, sub.ExecutionID); !client.IsNotFound(err) {
		t.Errorf("beta get alpha's execution: %v", err)
	}
	if _, err := beta.CancelExecution(ctx, sub.ExecutionID); !client.IsNotFound(err) {
		t.Errorf("beta cancel alpha's execution: %v", err)
	}
}

func TestRefusesOpenAddressWithoutKeys(t *testing.T) {
	if err := app.CheckAddr("0.0.0.0:7070", nil); err == nil {
		t.Error("0.0.0.0 without keys accepted")
	}
	if err := app.CheckAddr("127.0.0.1:7070", nil); err != nil {
		t.Error(err)
	}
	keys, _ := server.ParseKeys([]string{"abcdefgh"})
	if err := app.CheckAddr("0.0.0.0:7070", keys); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"short", "has space:t", "goodkey1:bad/tenant"} {
		if _, err := server.ParseKeys([]string{bad}); err == nil {
			t.Errorf("ParseKeys(%q) accepted", bad)
		}
	}
}

func TestExecuteWithoutRuntime(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "s"})
	for _, body := range []string{
		`{}`, `{"code":"print(1)","language":"ruby"}`, `{"code":"x","timeout":-1}`,
		`{"code":"x","conversation_id":"../c"}`, `{"code":"x","context_id":"a/b"}`, `{"code":"x","bogus":1}`,
		`{"code":"x","env_vars":{"A=B":"1"}}`,
	} {
		resp, b := ts.do(t, "POST", "/api/v1/sessions/s/execute", "application/json", strings.NewReader(body))
		if resp.StatusCode != 400 {
			t.Errorf("%s: %d %s, want 400", body, resp.StatusCode, b)
		}
	}
	resp, b := ts.do(t, "POST", "/api/v1/sessions/none/execute", "application/json", strings.NewReader(`{"code":"1"}`))
	if resp.StatusCode != 404 {
		t.Errorf("unknown session: %d %s", resp.StatusCode, b)
	}
	// No runtime: a clear, retryable error, and the session is still there.
	_, err := c.Execute(ctx, "s", api.ExecuteRequest{Code: "print(1)"})
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 503 || ae.RetryAfter == 0 {
		t.Errorf("execute without a runtime: %v, want 503 with Retry-After", err)
	}
	_, err = c.ExecuteStream(ctx, "s", api.ExecuteRequest{Code: "print(1)"}, nil)
	if !errors.As(err, &ae) || ae.StatusCode != 503 {
		t.Errorf("stream without a runtime: %v, want an unavailable error event", err)
	}
	sub, err := c.Submit(ctx, "s", api.ExecuteRequest{Code: "print(1)"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.GetResult(ctx, sub.ExecutionID, true, 10*time.Second)
	if err != nil || res.Status != api.ExecFailed || res.Error == nil || res.Error.Type != "SandboxUnavailable" {
		t.Errorf("result: %+v, %v", res, err)
	}
	hist, err := c.ListExecutions(ctx, "s", 10, "")
	if err != nil || len(hist.Executions) < 2 || hist.Executions[0].ExecutionID != sub.ExecutionID {
		t.Errorf("history: %+v, %v", hist, err)
	}
	if _, err := c.GetExecution(ctx, "exec-nope"); !client.IsNotFound(err) {
		t.Errorf("unknown execution: %v", err)
	}
}

func TestFiles(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "f", FileUploadConfig: &api.FileUploadConfig{
		MaxFileSize: 64, MaxFileSizeUnit: "KB", MaxFileCount: 3, AllowedFileTypes: []string{".csv", "text/plain", "image/*"},
	}})
	up, err := c.Upload(ctx, "f", client.UploadOptions{Path: "data/"}, client.UploadFile{Name: "a.csv", Reader: strings.NewReader("x,y\n1,2\n")})
	if err != nil {
		t.Fatal(err)
	}
	if f := up.Files[0]; f.Path != "data/a.csv" || f.SandboxPath != "/workspace/data/a.csv" || f.Size != 8 || len(f.SHA256) != 64 {
		t.Errorf("upload: %+v", f)
	}
	var buf bytes.Buffer
	if _, err := c.Download(ctx, "f", "data/a.csv", &buf); err != nil || buf.String() != "x,y\n1,2\n" {
		t.Errorf("download: %q, %v", buf.String(), err)
	}
	// Range.
	resp, b := ts.do(t, "GET", "/api/v1/sessions/f/files/data/a.csv", "", nil, "Range", "bytes=2-4")
	if resp.StatusCode != 206 || string(b) != "y\n1" {
		t.Errorf("range: %d %q", resp.StatusCode, b)
	}
	resp, _ = ts.do(t, "GET", "/api/v1/sessions/f/files/data/a.csv", "", nil, "Range", "bytes=100-")
	if resp.StatusCode != 416 {
		t.Errorf("unsatisfiable range: %d", resp.StatusCode)
	}
	// Limits: size (413), type (415), count (409), count in one request (422).
	_, err = c.Upload(ctx, "f", client.UploadOptions{}, client.UploadFile{Name: "big.csv", Reader: bytes.NewReader(make([]byte, 65*1024))})
	wantStatus(t, "too large", err, 413)
	_, err = c.Upload(ctx, "f", client.UploadOptions{}, client.UploadFile{Name: "x.exe", Reader: strings.NewReader("MZ"), ContentType: "application/octet-stream"})
	wantStatus(t, "type", err, 415)
	_, err = c.Upload(ctx, "f", client.UploadOptions{}, client.UploadFile{Name: "p.png", Reader: strings.NewReader("png"), ContentType: "image/png"})
	if err != nil {
		t.Errorf("image/* allowed: %v", err)
	}
	files := func(n int) []client.UploadFile {
		var out []client.UploadFile
		for i := range n {
			out = append(out, client.UploadFile{Name: fmt.Sprintf("n%d.csv", i), Reader: strings.NewReader("1")})
		}
		return out
	}
	c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "g", FileUploadConfig: &api.FileUploadConfig{MaxFileCount: 3}})
	_, err = c.Upload(ctx, "g", client.UploadOptions{}, files(4)...)
	wantStatus(t, "four in one request", err, 422)
	_, err = c.Upload(ctx, "f", client.UploadOptions{}, files(2)...)
	wantStatus(t, "past the count", err, 409)
	// A failed request stored none of its files.
	list, err := c.ListFiles(ctx, "f", client.ListFilesOptions{Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range list.Files {
		if strings.HasPrefix(f.Name, "n") || f.Name == "big.csv" || strings.HasPrefix(f.Name, ".sbx") {
			t.Errorf("a refused upload left %s", f.Path)
		}
	}
	if err := c.DeleteFile(ctx, "f", "data/a.csv", false); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteFile(ctx, "f", "data/a.csv", false); !client.IsNotFound(err) {
		t.Errorf("delete again: %v", err)
	}
	// Deleting freed a slot.
	if _, err := c.Upload(ctx, "f", client.UploadOptions{}, files(1)...); err != nil {
		t.Errorf("upload after delete: %v", err)
	}
	if _, err := c.Download(ctx, "f", "nope.csv", io.Discard); !client.IsNotFound(err) {
		t.Errorf("download missing: %v", err)
	}
}

func wantStatus(t *testing.T, what string, err error, code int) {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.StatusCode != code || ae.Message == "" {
		t.Errorf("%s: %v, want status %d", what, err, code)
	}
}

func TestPathSafety(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "p"})
	c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "other"})
	c.Upload(ctx, "other", client.UploadOptions{}, client.UploadFile{Name: "theirs.txt", Reader: strings.NewReader("other's")})
	ws := filepath.Join(ts.dir, "workspaces", "default", "p")
	outside := filepath.Join(ts.dir, "outside.txt")
	os.WriteFile(outside, []byte("host secret"), 0o644)
	// What sandboxed code could plant in its workspace.
	os.Symlink(outside, filepath.Join(ws, "abs-link"))
	os.Symlink("../other/theirs.txt", filepath.Join(ws, "rel-link"))
	os.Symlink("/etc", filepath.Join(ws, "etc-dir"))
	for _, p := range []string{
		"abs-link", "rel-link", "etc-dir/passwd", "..%2F..%2Foutside.txt", "%2Fetc%2Fpasswd",
		"a%00b", "..", "data/../../x",
	} {
		resp, b := ts.do(t, "GET", "/api/v1/sessions/p/files/"+p, "", nil)
		if resp.StatusCode == 200 || strings.Contains(string(b), "secret") || strings.Contains(string(b), "root:") || strings.Contains(string(b), "other's") {
			t.Errorf("GET %s: %d %q", p, resp.StatusCode, b)
		}
	}
	for _, p := range []string{"../x", "/etc/cron.d/x", "etc-dir/evil", "abs-link", "a\x00b"} {
		_, err := c.Upload(ctx, "p", client.UploadOptions{Path: p}, client.UploadFile{Name: "f.txt", Reader: strings.NewReader("pwned")})
		if err == nil && p != "abs-link" {
			t.Errorf("upload to %q accepted", p)
		}
	}
	if b, _ := os.ReadFile(outside); string(b) != "host secret" {
		t.Errorf("the file outside the workspace became %q", b)
	}
	if _, err := os.Stat("/etc/evil"); err == nil {
		t.Error("an upload wrote /etc/evil")
	}
	for _, p := range []string{"abs-link", "etc-dir"} {
		// Deleting a link removes the link, never its target.
		c.DeleteFile(ctx, "p", p, true)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("deleting a link removed its target: %v", err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Error("/etc/passwd is gone")
	}
	for _, q := range []string{"path=../", "path=/etc", "path=etc-dir"} {
		resp, b := ts.do(t, "GET", "/api/v1/sessions/p/files?"+q, "", nil)
		if resp.StatusCode == 200 && strings.Contains(string(b), "passwd") {
			t.Errorf("list %s showed the host: %s", q, b)
		}
	}
}

func TestConversationUploads(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "c"})
	up, err := c.Upload(ctx, "c", client.UploadOptions{ConversationID: "c1", Subdir: "temparea"}, client.UploadFile{Name: "doc.pdf", Reader: strings.NewReader("%PDF")})
	if err != nil {
		t.Fatal(err)
	}
	if f := up.Files[0]; f.Path != "uploads/c1/temparea/doc.pdf" || f.SandboxPath != "/workspace/uploads/temparea/doc.pdf" {
		t.Errorf("conversation upload: %+v", f)
	}
	c.Upload(ctx, "c", client.UploadOptions{ConversationID: "c2"}, client.UploadFile{Name: "other.pdf", Reader: strings.NewReader("%PDF")})
	// Agent-made files in the workspace never show in a temparea listing.
	os.WriteFile(filepath.Join(ts.dir, "workspaces/default/c/agent.txt"), []byte("x"), 0o644)
	list, err := c.ListFiles(ctx, "c", client.ListFilesOptions{ConversationID: "c1", Subdir: "temparea"})
	if err != nil || len(list.Files) != 1 || list.Files[0].Name != "doc.pdf" {
		t.Errorf("temparea listing of c1: %+v, %v", list, err)
	}
	if _, err := c.Upload(ctx, "c", client.UploadOptions{Path: "uploads/x"}, client.UploadFile{Name: "f", Reader: strings.NewReader("x")}); err == nil {
		t.Error("an upload into uploads/ without conversation_id was accepted")
	}
	if err := c.DeleteConversation(ctx, "c", "c1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteConversation(ctx, "c", "c1"); err != nil {
		t.Errorf("purge again: %v", err)
	}
	list, _ = c.ListFiles(ctx, "c", client.ListFilesOptions{ConversationID: "c1", Subdir: "temparea"})
	if list == nil || len(list.Files) != 0 {
		t.Errorf("after purge: %+v", list)
	}
	if _, err := os.Stat(filepath.Join(ts.dir, "workspaces/default/c/uploads/c1")); !os.IsNotExist(err) {
		t.Errorf("purged conversation still on disk: %v", err)
	}
	list, _ = c.ListFiles(ctx, "c", client.ListFilesOptions{ConversationID: "c2", Subdir: "temparea"})
	if list == nil || len(list.Files) != 1 {
		t.Errorf("c2 after purging c1: %+v", list)
	}
}

func TestPresign(t *testing.T) {
	ts := start(t, "presign-key-1:t")
	c := ts.client("presign-key-1")
	ctx := context.Background()
	c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "d"})
	c.Upload(ctx, "d", client.UploadOptions{}, client.UploadFile{Name: "chart.png", Reader: strings.NewReader("PNGDATA")})
	p, err := c.Presign(ctx, "d", "chart.png", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !p.ExpiresAt.After(time.Now()) {
		t.Errorf("expires_at %v", p.ExpiresAt)
	}
	// No API key needed: the signature is the credential.
	resp, err := http.Get(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "PNGDATA" {
		t.Errorf("presigned GET: %d %q", resp.StatusCode, b)
	}
	// The URL outlives the session.
	c.DeleteSession(ctx, "d")
	if resp, err := http.Get(p.URL); err != nil || resp.StatusCode != 200 {
		t.Errorf("presigned GET after the session's deletion: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	for name, u := range map[string]string{
		"tampered": strings.Replace(p.URL, "signature=", "signature=00", 1),
		"expired":  strings.Replace(p.URL, "expires=", "expires=1", 1),
		"renamed":  strings.Replace(p.URL, "chart.png", "other.png", 1),
	} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || errorCode(t, b) != "permission_denied" {
			t.Errorf("%s URL: %d %s", name, resp.StatusCode, b)
		}
	}
}

func TestHealthAndMetrics(t *testing.T) {
	ts := start(t)
	resp, b := ts.do(t, "GET", "/healthz", "", nil)
	if resp.StatusCode != 200 {
		t.Errorf("healthz: %d %s", resp.StatusCode, b)
	}
	resp, b = ts.do(t, "GET", "/readyz", "", nil)
	if resp.StatusCode != 503 || !strings.Contains(string(b), "runtime") {
		t.Errorf("readyz without a runtime: %d %s", resp.StatusCode, b)
	}
	c := ts.client("")
	c.CreateSession(context.Background(), api.CreateSessionRequest{SessionID: "m"})
	c.Upload(context.Background(), "m", client.UploadOptions{}, client.UploadFile{Name: "a.txt", Reader: strings.NewReader("12345")})
	ts.do(t, "GET", "/api/v1/sessions/none", "", nil)
	resp, b = ts.do(t, "GET", "/metrics", "", nil)
	// A request with a body is counted under its route too (the edge
	// paces bodies on a copy of the request).
	for _, want := range []string{"sbx_sessions{status=", "sbx_upload_bytes_total 5", `sbx_api_errors_total{code="not_found"}`, "sbx_http_requests_total", "sbx_sandboxes{state=",
		`sbx_http_requests_total{code="201",method="POST",route="POST /api/v1/sessions"} 1`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id")
	}
	// (Not through the contract checker, which rightly refuses the path.)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/api/v1/nothing", nil)
	req.Host = "localhost" // not httptest's example.com, which a server without keys refuses
	ts.app.Server.Handler().ServeHTTP(rec, req)
	if rec.Code != 404 || errorCode(t, rec.Body.Bytes()) != "not_found" {
		t.Errorf("unknown path: %d %s", rec.Code, rec.Body)
	}
}

func TestUploadStreamsFieldsFirst(t *testing.T) {
	ts := start(t)
	ts.client("").CreateSession(context.Background(), api.CreateSessionRequest{SessionID: "u"})
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "a.txt")
	fw.Write([]byte("x"))
	mw.WriteField("path", "dir/")
	mw.Close()
	resp, b := ts.do(t, "POST", "/api/v1/sessions/u/files/upload", mw.FormDataContentType(), &body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "before the files") {
		t.Errorf("field after file: %d %s", resp.StatusCode, b)
	}
	resp, b = ts.do(t, "POST", "/api/v1/sessions/u/files/upload", "application/json", strings.NewReader("{}"))
	if resp.StatusCode != 400 {
		t.Errorf("not multipart: %d %s", resp.StatusCode, b)
	}
}

// multipart builds an upload body of one file after the given fields.
func multipartBody(t *testing.T, name, content string, fields ...string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for i := 0; i+1 < len(fields); i += 2 {
		mw.WriteField(fields[i], fields[i+1])
	}
	fw, _ := mw.CreateFormFile("file", name)
	fw.Write([]byte(content))
	mw.Close()
	return mw.FormDataContentType(), &buf
}

// Agent endpoints: the session of a user's agent is made on first
// use, once, and found after; ids that could smuggle paths are refused.
func TestAgentEndpoints(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	// Concurrent first uploads make one session.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ct, body := multipartBody(t, fmt.Sprintf("f%d.txt", i), "data")
			if resp, b := ts.do(t, "POST", "/api/v1/agents/a1/files/upload?user_id=u1", ct, body); resp.StatusCode != 201 {
				t.Errorf("agent upload: %d %s", resp.StatusCode, b)
			}
		}()
	}
	wg.Wait()
	s, err := c.GetSession(ctx, "sb-session-u1-a1")
	if err != nil || s.Metadata["user_id"] != "u1" || s.Metadata["agent_id"] != "a1" {
		t.Fatalf("the agent's session: %+v %v", s, err)
	}
	list, _ := c.ListSessions(ctx, client.ListSessionsOptions{UserID: "u1", AgentID: "a1"})
	if list == nil || len(list.Sessions) != 1 {
		t.Errorf("sessions of u1/a1: %+v", list)
	}
	resp, b := ts.do(t, "GET", "/api/v1/agents/a1/files?user_id=u1", "", nil)
	var fl api.FileList
	json.Unmarshal(b, &fl)
	if resp.StatusCode != 200 || len(fl.Files) != 9 { // 8 files and uploads/
		t.Errorf("agent list: %d %s", resp.StatusCode, b)
	}
	if resp, b := ts.do(t, "GET", "/api/v1/agents/a1/files/f3.txt?user_id=u1", "", nil); resp.StatusCode != 200 || string(b) != "data" {
		t.Errorf("agent download: %d %q", resp.StatusCode, b)
	}
	// A conversation's upload is read back through its conversation.
	ct, body := multipartBody(t, "doc.txt", "for c1", "conversation_id", "c1")
	if resp, b := ts.do(t, "POST", "/api/v1/agents/a1/files/upload?user_id=u1", ct, body); resp.StatusCode != 201 {
		t.Fatalf("conversation upload: %d %s", resp.StatusCode, b)
	}
	if resp, b := ts.do(t, "GET", "/api/v1/agents/a1/files/doc.txt?user_id=u1&conversation_id=c1", "", nil); resp.StatusCode != 200 || string(b) != "for c1" {
		t.Errorf("conversation download: %d %q", resp.StatusCode, b)
	}
	if resp, _ := ts.do(t, "GET", "/api/v1/agents/a1/files/doc.txt?user_id=u1&conversation_id=c2", "", nil); resp.StatusCode != 404 {
		t.Errorf("another conversation's file: %d, want 404", resp.StatusCode)
	}
	// No session, no files: reads create nothing.
	if resp, _ := ts.do(t, "GET", "/api/v1/agents/a1/files?user_id=u2", "", nil); resp.StatusCode != 404 {
		t.Errorf("files of a user without a session: %d, want 404", resp.StatusCode)
	}
	if _, err := c.GetSession(ctx, "sb-session-u2-a1"); !client.IsNotFound(err) {
		t.Errorf("a read made a session: %v", err)
	}
	// Execute makes the session too; without a runtime the run is 503.
	resp, b = ts.do(t, "POST", "/api/v1/agents/a2/execute?wait=true", "application/json", strings.NewReader(`{"user_id":"u1","code":"1"}`))
	if resp.StatusCode != 503 {
		t.Errorf("agent execute without a runtime: %d %s", resp.StatusCode, b)
	}
	if _, err := c.GetSession(ctx, "sb-session-u1-a2"); err != nil {
		t.Errorf("agent execute made no session: %v", err)
	}
	for _, tc := range []struct{ path, body string }{
		{"/api/v1/agents/a1/execute", `{"code":"1"}`},
		{"/api/v1/agents/a1/execute", `{"user_id":"../x","code":"1"}`},
		{"/api/v1/agents/a1/execute", `{"user_id":"u/1","code":"1"}`},
		{"/api/v1/agents/a..b/execute", `{"user_id":"u1","code":"1"}`},
		{"/api/v1/agents/.a/execute", `{"user_id":"u1","code":"1"}`},
		{"/api/v1/agents/a1/execute", `{"user_id":"u1","code":"1","nope":1}`},
	} {
		resp, b := ts.do(t, "POST", tc.path, "application/json", strings.NewReader(tc.body))
		if resp.StatusCode != 400 || errorCode(t, b) != "invalid_argument" {
			t.Errorf("%s %s: %d %s, want 400", tc.path, tc.body, resp.StatusCode, b)
		}
	}
	// (alice, data-analyst) and (alice-data, analyst) are two users: each
	// has a session of its own and sees only its own files.
	for _, up := range []struct{ user, agent, file string }{{"alice", "data-analyst", "a.txt"}, {"alice-data", "analyst", "b.txt"}} {
		ct, body := multipartBody(t, up.file, up.user)
		if resp, b := ts.do(t, "POST", "/api/v1/agents/"+up.agent+"/files/upload?user_id="+up.user, ct, body); resp.StatusCode != 201 {
			t.Fatalf("upload as %s/%s: %d %s", up.user, up.agent, resp.StatusCode, b)
		}
	}
	for _, who := range []struct{ user, agent, mine, theirs string }{{"alice", "data-analyst", "a.txt", "b.txt"}, {"alice-data", "analyst", "b.txt", "a.txt"}} {
		q := "?user_id=" + who.user
		if resp, b := ts.do(t, "GET", "/api/v1/agents/"+who.agent+"/files/"+who.mine+q, "", nil); resp.StatusCode != 200 || string(b) != who.user {
			t.Errorf("%s/%s reads its own %s: %d %q", who.user, who.agent, who.mine, resp.StatusCode, b)
		}
		if resp, b := ts.do(t, "GET", "/api/v1/agents/"+who.agent+"/files/"+who.theirs+q, "", nil); resp.StatusCode != 404 {
			t.Errorf("%s/%s reads the other user's %s: %d %q", who.user, who.agent, who.theirs, resp.StatusCode, b)
		}
	}
	if s, err := c.GetSession(ctx, "sb-session-alice--data-analyst"); err != nil || s.Metadata["user_id"] != "alice-data" {
		t.Errorf("the session of alice-data/analyst: %+v %v", s, err)
	}
	for _, q := range []string{"", "?user_id=", "?user_id=a..b", "?user_id=" + strings.Repeat("u", 57)} {
		ct, body := multipartBody(t, "f", "x")
		if resp, _ := ts.do(t, "POST", "/api/v1/agents/a1/files/upload"+q, ct, body); resp.StatusCode != 400 {
			t.Errorf("upload with user %q: %d, want 400", q, resp.StatusCode)
		}
	}
}

// Tools: the definitions, and the file tools end to end (the code
// tools need a sandbox: TestAgentWorkflow).
func TestTools(t *testing.T) {
	ts := start(t)
	resp, b := ts.do(t, "GET", "/api/v1/tools", "", nil)
	var list api.ToolList
	if err := json.Unmarshal(b, &list); resp.StatusCode != 200 || err != nil {
		t.Fatalf("tools: %d %s", resp.StatusCode, b)
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Function.Name)
		var schema struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if tool.Type != "function" || json.Unmarshal(tool.Function.Parameters, &schema) != nil || schema.Type != "object" || len(schema.Properties) == 0 || tool.Function.Description == "" {
			t.Errorf("tool %+v is not a function with an object schema", tool)
		}
	}
	if want := "execute_code run_bash upload_file list_files read_file"; strings.Join(names, " ") != want {
		t.Errorf("tools %v, want %s", names, want)
	}
	invoke := func(name, args string) (int, api.ToolResult) {
		t.Helper()
		resp, b := ts.do(t, "POST", "/api/v1/tools/"+name+"/invoke", "application/json",
			strings.NewReader(`{"user_id":"u1","agent_id":"a1","arguments":`+args+`}`))
		var res api.ToolResult
		json.Unmarshal(b, &res)
		return resp.StatusCode, res
	}
	// 3-byte characters across the part boundaries.
	text := strings.Repeat("ab€", 5000)
	args, _ := json.Marshal(map[string]string{"path": "notes/long.txt", "content": text})
	if code, res := invoke("upload_file", string(args)); code != 200 || res.IsError || res.SessionID != "sb-session-u1-a1" {
		t.Fatalf("upload_file: %d %+v", code, res)
	}
	var got strings.Builder
	offset, parts := 0, 0
	for {
		code, res := invoke("read_file", fmt.Sprintf(`{"path":"notes/long.txt","offset":%d,"length":1001}`, offset))
		var part struct {
			Content    string `json:"content"`
			Encoding   string `json:"encoding"`
			NextOffset int    `json:"next_offset"`
			EOF        bool   `json:"eof"`
		}
		if code != 200 || res.IsError || json.Unmarshal(res.Data, &part) != nil || part.Encoding != "utf-8" {
			t.Fatalf("read_file at %d: %d %+v", offset, code, res)
		}
		got.WriteString(part.Content)
		offset, parts = part.NextOffset, parts+1
		if part.EOF {
			break
		}
		if parts > 100 {
			t.Fatal("read_file never reached the end")
		}
	}
	if got.String() != text || parts < 25 || parts > 26 {
		t.Errorf("read in %d parts: %d bytes, equal %v", parts, got.Len(), got.String() == text)
	}
	// Binary content goes both ways as base64.
	if code, res := invoke("upload_file", `{"path":"bin.dat","content":"AAEC/w==","encoding":"base64"}`); code != 200 || res.IsError {
		t.Errorf("binary upload: %d %+v", code, res)
	}
	if code, res := invoke("read_file", `{"path":"bin.dat"}`); code != 200 || !strings.Contains(string(res.Data), `"encoding":"base64","content":"AAEC/w=="`) {
		t.Errorf("binary read: %d %s", code, res.Data)
	}
	if code, res := invoke("list_files", `{"path":"notes"}`); code != 200 || !strings.Contains(res.Content, "notes/long.txt (25000 bytes)") {
		t.Errorf("list_files: %d %+v", code, res)
	}
	// What the model can fix comes back to it as an error result.
	for _, tc := range []struct{ name, args string }{
		{"read_file", `{"path":"missing.txt"}`},
		{"read_file", `{"path":"../../etc/passwd"}`},
		{"upload_file", `{"path":"uploads/x","content":"x"}`},
		{"upload_file", `{"path":".resources/x","content":"x"}`},
		{"list_files", `{"path":"nowhere"}`},
	} {
		if code, res := invoke(tc.name, tc.args); code != 200 || !res.IsError || res.Content == "" {
			t.Errorf("%s %s: %d %+v, want an error result", tc.name, tc.args, code, res)
		}
	}
	// A request that is wrong is refused.
	for _, tc := range []struct {
		name, args string
		code       int
	}{
		{"nope", `{}`, 404},
		{"read_file", `{"path":"x","bogus":1}`, 400},
		{"read_file", `{"path":"x","length":2000000}`, 400},
		{"run_bash", `{"code":"ls"}`, 400},
		{"upload_file", `{"path":"x","content":"!","encoding":"base64"}`, 400},
	} {
		if code, _ := invoke(tc.name, tc.args); code != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.name, tc.args, code, tc.code)
		}
	}
	if resp, _ := ts.do(t, "POST", "/api/v1/tools/read_file/invoke", "application/json", strings.NewReader(`{"agent_id":"a1","arguments":{}}`)); resp.StatusCode != 400 {
		t.Errorf("invoke without a user: %d, want 400", resp.StatusCode)
	}
	// Refused before anything is made: a new user's refused call leaves
	// no session.
	for _, args := range []string{`{"code":"1","timeout":100000}`, `{"code":""}`, `{"command":"ls"}`} {
		resp, b := ts.do(t, "POST", "/api/v1/tools/execute_code/invoke", "application/json",
			strings.NewReader(`{"user_id":"u2","agent_id":"a1","arguments":`+args+`}`))
		if resp.StatusCode != 400 {
			t.Errorf("execute_code %s: %d %s, want 400", args, resp.StatusCode, b)
		}
	}
	if resp, b := ts.do(t, "GET", "/api/v1/sessions/sb-session-u2-a1", "", nil); resp.StatusCode != 404 {
		t.Errorf("refused calls made a session: %d %s", resp.StatusCode, b)
	}
}
