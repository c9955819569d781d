package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/apitest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var now = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func testSession(id string) api.Session {
	return api.Session{
		SessionID: id, Status: api.StatusRunning, TemplateID: "python",
		CreatedAt: now, LastActivityAt: now, ExpiresAt: now.Add(time.Hour), TTL: 3600, IdleTimeout: 600,
		HibernateTimeout: 86400, SandboxState: api.SandboxNone,
		Network: "none", Metadata: map[string]string{}, EnvVars: []string{},
		FileUploadConfig: api.FileUploadConfig{MaxFileSize: 100, MaxFileSizeUnit: "MB", MaxFileCount: 1000},
	}
}

func testExecution() api.Execution {
	code := 0
	return api.Execution{
		ExecutionID: "exec-1", SessionID: "s1", Status: api.ExecCompleted, Language: "python",
		CreatedAt: now, DurationMs: 3, Stdout: "2\n", ExitCode: &code, Artifacts: []string{},
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	if status == 503 || status == 429 {
		w.Header().Set("Retry-After", "7")
	}
	writeJSON(w, status, api.Error{Error: api.ErrorBody{Code: code, Message: msg}})
}

// seen is what the fake server saw of the last request.
type seen struct {
	mu     sync.Mutex
	method string
	target string // path and query, as sent
	auth   string
	body   string
	params map[string]string
}

func (s *seen) record(r *http.Request, names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.method, s.target, s.auth = r.Method, r.URL.RequestURI(), r.Header.Get("Authorization")
	s.body = ""
	if r.Header.Get("Content-Type") == "application/json" {
		b, _ := io.ReadAll(r.Body)
		s.body = string(b)
	}
	s.params = map[string]string{}
	for _, n := range names {
		s.params[n] = r.PathValue(n)
	}
}

func (s *seen) get() seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return seen{method: s.method, target: s.target, auth: s.auth, body: s.body, params: s.params}
}

// fakeServer answers every operation of the API with a conforming answer,
// behind the contract checker: the client's requests must conform too.
func fakeServer(t *testing.T) (*Client, *seen) {
	t.Helper()
	s := &seen{}
	mux := http.NewServeMux()
	p := api.Prefix
	mux.HandleFunc("POST "+p+"/sessions", func(w http.ResponseWriter, r *http.Request) {
		s.record(r)
		var req api.CreateSessionRequest
		json.Unmarshal([]byte(s.get().body), &req)
		status := http.StatusCreated
		if req.SessionID == "exists" {
			status = http.StatusOK
		}
		writeJSON(w, status, testSession(req.SessionID))
	})
	mux.HandleFunc("GET "+p+"/sessions", func(w http.ResponseWriter, r *http.Request) {
		s.record(r)
		writeJSON(w, 200, api.SessionList{Sessions: []api.Session{testSession("s1")}, NextPageToken: "next"})
	})
	mux.HandleFunc("GET "+p+"/sessions/{session_id}", func(w http.ResponseWriter, r *http.Request) {
		s.record(r, "session_id")
		switch id := r.PathValue("session_id"); {
		case id == "missing":
			writeError(w, 404, "not_found", "no session")
			return
		case strings.Contains(id, "/"):
			writeError(w, 400, "invalid_argument", "bad id")
			return
		}
		writeJSON(w, 200, testSession(r.PathValue("session_id")))
	})
	mux.HandleFunc("DELETE "+p+"/sessions/{session_id}", func(w http.ResponseWriter, r *http.Request) {
		s.record(r, "session_id")
		writeJSON(w, 200, api.DeleteSessionResponse{SessionID: r.PathValue("session_id"), Status: "terminated"})
	})
	for _, op := range []string{"pause", "resume", "keepalive"} {
		mux.HandleFunc("POST "+p+"/sessions/{session_id}/"+op, func(w http.ResponseWriter, r *http.Request) {
			s.record(r, "session_id")
			writeJSON(w, 200, testSession(r.PathValue("session_id")))
		})
	}
	mux.HandleFunc("POST "+p+"/sessions/{session_id}/execute", func(w http.ResponseWriter, r *http.Request) {
		s.record(r, "session_id")
		switch {
		case r.Header.Get("Accept") == "text/event-stream":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: submitted\ndata: {\"execution_id\":\"exec-1\",\"status\":\"submitted\"}\n\n")
			fmt.Fprintf(w, ": keep-alive\n\nevent: stdout\ndata: {\"text\":\"2\\n\"}\n\n")
			b, _ := json.Marshal(testExecution())
			fmt.Fprintf(w, "event: result\ndata: %s\n\n", b)
		case r.URL.Query().Get("wait") == "true":
			writeJSON(w, 200, testExecution())
		default:
			writeJSON(w, 202, api.SubmitResponse{ExecutionID: "exec-1", Status: "submitted"})
		}
	})
	mux.HandleFunc("GET "+p+"/sessions/{session_id}/executions", func(w http.ResponseWriter, r *http.Request) {
		s.record(r, "session_id")
		writeJSON(w, 200, api.ExecutionList{Executions: []api.Execution{testExecution()}})
	})
	for _, op := range []string{"GET /", "GET /result", "POST /cancel"} {
		method, rest, _ := strings.Cut(op, " ")
		mux.HandleFunc(method+" "+p+"/executions/{execution_id}"+strings.TrimSuffix(rest, "/"), func(w http.ResponseWriter, r *http.Request) {
			s.record(r, "execution_id")
			writeJSON(w, 200, testExecution())
		})
	}
	mux.HandleFunc("POST "+p+"/sessions/{session_id}/files/upload", func(w http.ResponseWriter, r *http.Request) {
		s.record(r, "session_id")
		mr, err := r.MultipartReader()
		if err != nil {
			writeError(w, 400, "invalid_argument", err.Error())
			return
		}
		var files []api.UploadedFile
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeError(w, 400, "invalid_argument", err.Error())
				return
			}
			n, _ := io.Copy(io.Discard, part)
			if part.FileName() != "" {
				files = append(files, api.UploadedFile{Name: part.FileName(), Path: part.FileName(),
					SandboxPath: "/workspace/" + part.FileName(), Size: n, SHA256: strings.Repeat("0", 64)})
			}
		}
		writeJSON(w, 201, api.UploadResponse{Files: files})
	})
	mux.HandleFunc("GET "+p+"/sessions/{session_id}/files", func(w http.ResponseWriter, r *http.Request) {
		s.record(r, "session_id")
		writeJSON(w, 200, api.FileList{Files: []api.FileEntry{{Name: "a.csv", Path: "a.csv", Type: "file", Size: 3, ModifiedAt: now}}})
	})
	mux.HandleFunc("GET "+p+"/sessions/{session_id}/files/{path...}", func(w http.ResponseWriter, r *http.Request) {
		s.record(r, "session_id", "path")
		if r.URL.Query().Get("presign") == "true" {
			writeJSON(w, 200, api.PresignResponse{URL: "http://x/y", ExpiresAt: now})
			return
		}
		http.ServeContent(w, r, r.PathValue("path"), now, strings.NewReader("0123456789"))
	})
	mux.HandleFunc("DELETE "+p+"/sessions/{session_id}/files/{path...}", func(w http.ResponseWriter, r *http.Request) {
		s.record(r, "session_id", "path")
		w.WriteHeader(204)
	})
	mux.HandleFunc("DELETE "+p+"/sessions/{session_id}/conversations/{conversation_id}", func(w http.ResponseWriter, r *http.Request) {
		s.record(r, "session_id", "conversation_id")
		w.WriteHeader(204)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, api.Health{Status: "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 503, api.Health{Status: "unavailable", Checks: map[string]string{"store": "ok", "runtime": "runc not found"}})
	})
	srv := httptest.NewServer(apitest.Handler(t, mux))
	t.Cleanup(srv.Close)
	return New(srv.URL+"/", WithAPIKey("secret-key"), WithHTTPClient(srv.Client())), s
}

// TestEveryOperation drives each method against the fake server: the
// contract checker fails the test on a request that does not conform.
func TestEveryOperation(t *testing.T) {
	c, s := fakeServer(t)
	ctx := context.Background()
	check := func(err error, method, target string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s %s: %v", method, target, err)
		}
		got := s.get()
		if got.method != method || got.target != target {
			t.Errorf("sent %s %s, want %s %s", got.method, got.target, method, target)
		}
		if got.auth != "Bearer secret-key" {
			t.Errorf("Authorization %q", got.auth)
		}
	}

	sess, created, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "s1", Metadata: map[string]string{"user_id": "u"}})
	check(err, "POST", "/api/v1/sessions")
	if !created || sess.SessionID != "s1" || s.get().body != `{"session_id":"s1","metadata":{"user_id":"u"}}` {
		t.Errorf("create: %v %+v, body %s", created, sess, s.get().body)
	}
	if _, created, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "exists"}); err != nil || created {
		t.Errorf("create of an existing id: created %v, %v", created, err)
	}
	_, err = c.GetSession(ctx, "s1")
	check(err, "GET", "/api/v1/sessions/s1")
	list, err := c.ListSessions(ctx, ListSessionsOptions{Status: "running", UserID: "u 1", AgentID: "a",
		Metadata: map[string]string{"team": "x", "env": "prod"}, Limit: 10, PageToken: "tok"})
	check(err, "GET", "/api/v1/sessions?agent_id=a&limit=10&metadata=env%3Aprod&metadata=team%3Ax&page_token=tok&status=running&user_id=u+1")
	if len(list.Sessions) != 1 || list.NextPageToken != "next" {
		t.Errorf("list: %+v", list)
	}
	del, err := c.DeleteSession(ctx, "s1")
	check(err, "DELETE", "/api/v1/sessions/s1")
	if del.Status != "terminated" {
		t.Errorf("delete: %+v", del)
	}
	_, err = c.PauseSession(ctx, "s1")
	check(err, "POST", "/api/v1/sessions/s1/pause")
	_, err = c.ResumeSession(ctx, "s1")
	check(err, "POST", "/api/v1/sessions/s1/resume")
	_, err = c.Keepalive(ctx, "s1", 0)
	check(err, "POST", "/api/v1/sessions/s1/keepalive")
	if s.get().body != "" {
		t.Errorf("keepalive without a timeout sent %q", s.get().body)
	}
	_, err = c.Keepalive(ctx, "s1", 600)
	check(err, "POST", "/api/v1/sessions/s1/keepalive")
	if s.get().body != `{"timeout":600}` {
		t.Errorf("keepalive sent %q", s.get().body)
	}

	req := api.ExecuteRequest{Code: "print(1+1)", Event: json.RawMessage(`{"n":1}`), ConversationID: "c1"}
	sub, err := c.Submit(ctx, "s1", req)
	check(err, "POST", "/api/v1/sessions/s1/execute")
	if sub.ExecutionID != "exec-1" || s.get().body != `{"code":"print(1+1)","event":{"n":1},"conversation_id":"c1"}` {
		t.Errorf("submit: %+v, body %s", sub, s.get().body)
	}
	x, err := c.Execute(ctx, "s1", req)
	check(err, "POST", "/api/v1/sessions/s1/execute?wait=true")
	if x.Status != api.ExecCompleted {
		t.Errorf("execute: %+v", x)
	}
	var out []string
	x, err = c.ExecuteStream(ctx, "s1", req, func(stream, text string) { out = append(out, stream+":"+text) })
	check(err, "POST", "/api/v1/sessions/s1/execute")
	if x.Status != api.ExecCompleted || fmt.Sprint(out) != "[stdout:2\n]" {
		t.Errorf("stream: %+v, output %q", x, out)
	}
	_, err = c.ListExecutions(ctx, "s1", 5, "t")
	check(err, "GET", "/api/v1/sessions/s1/executions?limit=5&page_token=t")
	_, err = c.GetExecution(ctx, "exec-1")
	check(err, "GET", "/api/v1/executions/exec-1")
	_, err = c.GetResult(ctx, "exec-1", false, 0)
	check(err, "GET", "/api/v1/executions/exec-1/result")
	_, err = c.GetResult(ctx, "exec-1", true, 1500*time.Millisecond)
	check(err, "GET", "/api/v1/executions/exec-1/result?timeout=1.5&wait=true")
	_, err = c.CancelExecution(ctx, "exec-1")
	check(err, "POST", "/api/v1/executions/exec-1/cancel")

	up, err := c.Upload(ctx, "s1", UploadOptions{Path: "data/", ConversationID: "c1"},
		UploadFile{Name: "dir/a.csv", Reader: strings.NewReader("x,y\n")}, UploadFile{Name: "b.bin", Reader: strings.NewReader("\x00")})
	check(err, "POST", "/api/v1/sessions/s1/files/upload")
	if len(up.Files) != 2 || up.Files[0].Name != "a.csv" || up.Files[0].Size != 4 {
		t.Errorf("upload: %+v", up)
	}
	_, err = c.ListFiles(ctx, "s1", ListFilesOptions{Path: "data", Recursive: true, ConversationID: "c1", Subdir: "temparea"})
	check(err, "GET", "/api/v1/sessions/s1/files?conversation_id=c1&path=data&recursive=true&subdir=temparea")
	var buf bytes.Buffer
	n, err := c.Download(ctx, "s1", "data/a.csv", &buf)
	check(err, "GET", "/api/v1/sessions/s1/files/data/a.csv")
	if n != 10 || buf.String() != "0123456789" {
		t.Errorf("download: %d %q", n, buf.String())
	}
	pre, err := c.Presign(ctx, "s1", "data/a.csv", 90*time.Second)
	check(err, "GET", "/api/v1/sessions/s1/files/data/a.csv?expires_in=90&presign=true")
	if pre.URL != "http://x/y" {
		t.Errorf("presign: %+v", pre)
	}
	err = c.DeleteFile(ctx, "s1", "data/", true)
	check(err, "DELETE", "/api/v1/sessions/s1/files/data?recursive=true")
	err = c.DeleteConversation(ctx, "s1", "c1")
	check(err, "DELETE", "/api/v1/sessions/s1/conversations/c1")

	if h, err := c.Healthz(ctx); err != nil || h.Status != "ok" {
		t.Errorf("healthz: %+v %v", h, err)
	}
	h, err := c.Readyz(ctx)
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != 503 || !IsUnavailable(err) || h == nil || h.Checks["runtime"] != "runc not found" {
		t.Errorf("readyz: %+v %v", h, err)
	}
	if !strings.Contains(err.Error(), "runtime: runc not found") {
		t.Errorf("readyz error %q does not say what is wrong", err)
	}
}

func TestOpenFileRange(t *testing.T) {
	c, s := fakeServer(t)
	ctx := context.Background()
	tests := []struct {
		offset, length int64
		want           string
	}{
		{0, 0, "0123456789"},
		{3, 0, "3456789"},
		{3, 4, "3456"},
		{0, 2, "01"},
		{8, 100, "89"},
	}
	for _, tt := range tests {
		rc, err := c.OpenFile(ctx, "s1", "f.txt", tt.offset, tt.length)
		if err != nil {
			t.Fatalf("open %d+%d: %v", tt.offset, tt.length, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(b) != tt.want {
			t.Errorf("open %d+%d: %q %v, want %q", tt.offset, tt.length, b, err, tt.want)
		}
	}
	_, err := c.OpenFile(ctx, "s1", "f.txt", 20, 0)
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusRequestedRangeNotSatisfiable || ae.Code != CodeInvalidArgument {
		t.Errorf("range past the end: %v", err)
	}
	_ = s
}

// TestOpenFileWithoutRangeSupport: a server (a proxy, say) that ignores
// Range still gives the right bytes.
func TestOpenFileWithoutRangeSupport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "0123456789")
	}))
	defer srv.Close()
	c := New(srv.URL, WithHTTPClient(srv.Client()))
	rc, err := c.OpenFile(context.Background(), "s1", "f.txt", 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, _ := io.ReadAll(rc); string(b) != "3456" {
		t.Errorf("got %q", b)
	}
}

func TestPathEscaping(t *testing.T) {
	c, s := fakeServer(t)
	ctx := context.Background()
	for _, p := range []string{"a b/c#d.txt", "ü/%41?x=1.txt", "dir/sub/data.csv", "semi;colon/plus+and&.txt", "/lead/trail/"} {
		if err := c.DeleteFile(ctx, "s1", p, false); err != nil {
			t.Fatalf("%q: %v", p, err)
		}
		if got, want := s.get().params["path"], strings.Trim(p, "/"); got != want {
			t.Errorf("%q reached the server as %q", p, got)
		}
	}
	for _, p := range []string{"", "/", "a//b", "../x", "a/./b", "a/.."} {
		err := c.DeleteFile(ctx, "s1", p, false)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want an invalid argument", p, err)
		}
	}
	// Ids are one segment each, whatever they hold.
	if _, err := c.GetSession(ctx, "a/b"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("session id a/b: %v", err)
	}
	if got := s.get(); got.target != "/api/v1/sessions/a%2Fb" || got.params["session_id"] != "a/b" {
		t.Errorf("session id a/b sent as %s, seen as %q", got.target, got.params["session_id"])
	}
	for _, id := range []string{"", ".", ".."} {
		if _, err := c.GetSession(ctx, id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("session id %q: %v", id, err)
		}
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		status     int
		code, msg  string
		retryAfter time.Duration
		is         error
	}{
		{
			name:    "not found",
			handler: func(w http.ResponseWriter, r *http.Request) { writeError(w, 404, "not_found", `session "x" not found`) },
			status:  404, code: "not_found", msg: `session "x" not found`, is: errdefs.ErrNotFound,
		},
		{
			name:    "unavailable",
			handler: func(w http.ResponseWriter, r *http.Request) { writeError(w, 503, "unavailable", "no sandbox") },
			status:  503, code: "unavailable", msg: "no sandbox", retryAfter: 7 * time.Second, is: errdefs.ErrUnavailable,
		},
		{
			name: "retry after a date",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
				writeJSON(w, 429, api.Error{Error: api.ErrorBody{Code: "resource_exhausted", Message: "slow down"}})
			},
			status: 429, code: "resource_exhausted", msg: "slow down", retryAfter: time.Hour, is: errdefs.ErrResourceExhausted,
		},
		{
			name:    "conflict",
			handler: func(w http.ResponseWriter, r *http.Request) { writeError(w, 409, "failed_precondition", "not running") },
			status:  409, code: "failed_precondition", msg: "not running", is: errdefs.ErrFailedPrecondition,
		},
		{
			name:    "bad request",
			handler: func(w http.ResponseWriter, r *http.Request) { writeError(w, 400, "invalid_argument", "bad") },
			status:  400, code: "invalid_argument", msg: "bad", is: errdefs.ErrInvalidArgument,
		},
		{
			name: "a proxy's page",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(502)
				io.WriteString(w, "<html>bad gateway</html>\n")
			},
			status: 502, code: "unavailable", msg: "<html>bad gateway</html>", is: errdefs.ErrUnavailable,
		},
		{
			name:    "empty body",
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) },
			status:  500, code: "internal", msg: "Internal Server Error",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			_, err := New(srv.URL, WithHTTPClient(srv.Client())).GetSession(context.Background(), "x")
			var ae *APIError
			if !errors.As(err, &ae) {
				t.Fatalf("%v is not an *APIError", err)
			}
			if ae.StatusCode != tt.status || ae.Code != tt.code || ae.Message != tt.msg {
				t.Errorf("got %d %q %q, want %d %q %q", ae.StatusCode, ae.Code, ae.Message, tt.status, tt.code, tt.msg)
			}
			if d := ae.RetryAfter - tt.retryAfter; d > 0 || d < -2*time.Second {
				t.Errorf("RetryAfter %v, want %v", ae.RetryAfter, tt.retryAfter)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("errors.Is(%v, %v) is false", err, tt.is)
			}
			if IsNotFound(err) != (tt.is == errdefs.ErrNotFound) || IsUnavailable(err) != (tt.is == errdefs.ErrUnavailable) {
				t.Errorf("IsNotFound %v, IsUnavailable %v", IsNotFound(err), IsUnavailable(err))
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Error() %q does not say %q", err, tt.msg)
			}
		})
	}
}
