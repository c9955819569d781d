package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/apitest"
)

var testTime = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func fakeSession(id string) api.Session {
	return api.Session{
		SessionID: id, Status: api.StatusRunning, TemplateID: "python",
		CreatedAt: testTime, LastActivityAt: testTime, ExpiresAt: testTime.Add(time.Hour), TTL: 3600, IdleTimeout: 600,
		HibernateTimeout: 86400, SandboxState: api.SandboxNone,
		Network: "none", Metadata: map[string]string{}, EnvVars: []string{},
		FileUploadConfig: api.FileUploadConfig{MaxFileSize: 100, MaxFileSizeUnit: "MB", MaxFileCount: 1000},
	}
}

func sendJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func sendError(w http.ResponseWriter, status int, code, msg string) {
	if status == 503 {
		w.Header().Set("Retry-After", "5")
	}
	sendJSON(w, status, api.Error{Error: api.ErrorBody{Code: code, Message: msg}})
}

// fakeAPI is a server of canned answers behind the contract checker; it
// remembers the requests it got.
type fakeAPI struct {
	url  string
	mu   sync.Mutex
	reqs []string // "METHOD URI BODY"
	auth string
}

func (f *fakeAPI) last() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		return ""
	}
	return f.reqs[len(f.reqs)-1]
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{}
	mux := http.NewServeMux()
	p := api.Prefix
	// record notes the request; a JSON body is read whole, others not.
	record := func(r *http.Request) string {
		body := ""
		if r.Header.Get("Content-Type") == "application/json" {
			b, _ := io.ReadAll(r.Body)
			body = string(b)
		}
		f.mu.Lock()
		f.reqs = append(f.reqs, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+body))
		f.auth = r.Header.Get("Authorization")
		f.mu.Unlock()
		return body
	}
	mux.HandleFunc("POST "+p+"/sessions", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSessionRequest
		json.Unmarshal([]byte(record(r)), &req)
		if req.SessionID == "" {
			req.SessionID = "sess-made-up"
		}
		if req.SessionID == "exists" {
			sendJSON(w, 200, fakeSession(req.SessionID))
			return
		}
		sendJSON(w, 201, fakeSession(req.SessionID))
	})
	mux.HandleFunc("GET "+p+"/sessions", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		if r.URL.Query().Get("page_token") == "" {
			sendJSON(w, 200, api.SessionList{Sessions: []api.Session{fakeSession("s1")}, NextPageToken: "p2"})
			return
		}
		sendJSON(w, 200, api.SessionList{Sessions: []api.Session{fakeSession("s2")}})
	})
	mux.HandleFunc("GET "+p+"/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		if r.PathValue("id") == "missing" {
			sendError(w, 404, "not_found", `session "missing" not found`)
			return
		}
		sendJSON(w, 200, fakeSession(r.PathValue("id")))
	})
	mux.HandleFunc("DELETE "+p+"/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		sendJSON(w, 200, api.DeleteSessionResponse{SessionID: r.PathValue("id"), Status: "terminated"})
	})
	mux.HandleFunc("POST "+p+"/sessions/{id}/pause", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		if r.PathValue("id") == "idle" {
			sendError(w, 409, "failed_precondition", "no running sandbox")
			return
		}
		s := fakeSession(r.PathValue("id"))
		s.Status = api.StatusPaused
		sendJSON(w, 200, s)
	})
	mux.HandleFunc("POST "+p+"/sessions/{id}/resume", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		sendJSON(w, 200, fakeSession(r.PathValue("id")))
	})
	mux.HandleFunc("POST "+p+"/sessions/{id}/execute", func(w http.ResponseWriter, r *http.Request) {
		var req api.ExecuteRequest
		json.Unmarshal([]byte(record(r)), &req)
		executeAnswer(w, r, req)
	})
	mux.HandleFunc("POST "+p+"/sessions/{id}/files/upload", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		uploadAnswer(w, r, f)
	})
	mux.HandleFunc("GET "+p+"/sessions/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		sendJSON(w, 200, api.FileList{Files: []api.FileEntry{
			{Name: "data", Path: "data", Type: "dir", ModifiedAt: testTime},
			{Name: "a.csv", Path: "data/a.csv", Type: "file", Size: 12, ModifiedAt: testTime},
		}})
	})
	mux.HandleFunc("GET "+p+"/sessions/{id}/files/{path...}", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		if r.PathValue("path") == "missing.txt" {
			sendError(w, 404, "not_found", "no such file")
			return
		}
		http.ServeContent(w, r, r.PathValue("path"), testTime, strings.NewReader("content of "+r.PathValue("path")))
	})
	mux.HandleFunc("DELETE "+p+"/sessions/{id}/files/{path...}", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.WriteHeader(204)
	})
	srv := httptest.NewServer(apitest.Handler(t, mux))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// sbx runs the command line against the fake server.
func (f *fakeAPI) sbx(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), append(args, "--server", f.url), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestSession(t *testing.T) {
	f := newFakeAPI(t)
	tests := []struct {
		name     string
		args     []string
		code     int
		request  string // the last request the server got; "" if none
		stdout   string // a part of it
		stderr   string // a part of it
		noServer bool   // the command must not reach the server
	}{
		{
			name: "create",
			args: []string{"session", "create", "--id", "s1", "--template", "python-datascience", "--timeout", "2h", "--idle-timeout", "90s",
				"--memory", "1G", "--cpu", "0.5", "--disk", "512M", "--env", "A=1", "--env", "B=x=y", "--meta", "user_id=u1"},
			request: `POST /api/v1/sessions {"session_id":"s1","template_id":"python-datascience","timeout":7200,"idle_timeout":90,` +
				`"resources":{"cpu":0.5,"memory":1024,"disk":512},"env_vars":{"A":"1","B":"x=y"},"metadata":{"user_id":"u1"}}`,
			stdout: `"session_id": "s1"`,
		},
		{name: "create with defaults", args: []string{"session", "create"}, request: "POST /api/v1/sessions {}"},
		{name: "create existing", args: []string{"session", "create", "--id", "exists"}, stderr: "exists already"},
		{name: "create bad memory", args: []string{"session", "create", "--memory", "lots"}, code: 2, stderr: "--memory", noServer: true},
		{name: "create bad env", args: []string{"session", "create", "--env", "A"}, code: 2, stderr: "want KEY=VALUE", noServer: true},
		{name: "create negative", args: []string{"session", "create", "--timeout", "-1s"}, code: 2, noServer: true},
		{name: "create positional", args: []string{"session", "create", "s1"}, code: 2, stderr: "--id", noServer: true},
		{name: "get", args: []string{"session", "get", "s1"}, request: "GET /api/v1/sessions/s1", stdout: `"status": "running"`},
		{name: "get missing", args: []string{"session", "get", "missing"}, code: 1, stderr: `404 not_found: session "missing" not found`},
		{name: "get without id", args: []string{"session", "get"}, code: 2, noServer: true},
		{
			name: "ls follows the pages", args: []string{"session", "ls", "--status", "running", "--user", "u1", "--agent", "a1"},
			request: "GET /api/v1/sessions?agent_id=a1&limit=1000&page_token=p2&status=running&user_id=u1",
			stdout:  "s2",
		},
		{name: "rm", args: []string{"session", "rm", "s1"}, request: "DELETE /api/v1/sessions/s1", stdout: "s1 terminated"},
		{name: "pause", args: []string{"session", "pause", "s1"}, request: "POST /api/v1/sessions/s1/pause", stdout: `"status": "paused"`},
		{name: "pause refused", args: []string{"session", "pause", "idle"}, code: 1, stderr: "409 failed_precondition"},
		{name: "resume", args: []string{"session", "resume", "s1"}, request: "POST /api/v1/sessions/s1/resume"},
		{name: "unknown command", args: []string{"session", "frobnicate"}, code: 2, noServer: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := f.last()
			code, stdout, stderr := f.sbx(tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			if tt.request != "" && f.last() != tt.request {
				t.Errorf("request\n%s\nwant\n%s", f.last(), tt.request)
			}
			if tt.noServer && f.last() != before {
				t.Errorf("reached the server: %s", f.last())
			}
			if !strings.Contains(stdout, tt.stdout) || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stdout:\n%s\nstderr:\n%s\nwant %q and %q in them", stdout, stderr, tt.stdout, tt.stderr)
			}
		})
	}
}

func TestSessionListTable(t *testing.T) {
	f := newFakeAPI(t)
	code, stdout, _ := f.sbx("session", "ls")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") ||
		!strings.HasPrefix(lines[1], "s1 ") || !strings.HasPrefix(lines[2], "s2 ") {
		t.Errorf("exit %d, table:\n%s", code, stdout)
	}
}

func TestClientSettings(t *testing.T) {
	f := newFakeAPI(t)
	var out, errOut bytes.Buffer
	t.Setenv("SBX_SERVER", strings.TrimPrefix(f.url, "http://")) // a scheme is optional
	t.Setenv("SBX_API_KEY", "from-env-key")
	if code := run(context.Background(), []string{"session", "get", "s1"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if f.auth != "Bearer from-env-key" {
		t.Errorf("Authorization %q", f.auth)
	}
	if code, _, _ := f.sbx("session", "get", "s1", "--api-key", "flag-key"); code != 0 || f.auth != "Bearer flag-key" {
		t.Errorf("exit %d, Authorization %q", code, f.auth)
	}
	// The key never shows in the help.
	out.Reset()
	errOut.Reset()
	run(context.Background(), []string{"session", "get", "-h"}, &out, &errOut)
	if strings.Contains(out.String()+errOut.String(), "from-env-key") {
		t.Errorf("help shows the key:\n%s%s", out.String(), errOut.String())
	}
}

func TestServerUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"session", "get", "s1", "--server", url}, &out, &errOut)
	if code != 3 {
		t.Errorf("exit %d, want 3: %s", code, errOut.String())
	}
	code = run(context.Background(), []string{"exec", "s1", "-c", "1", "--server", url}, &out, &errOut)
	if code != 3 {
		t.Errorf("exec: exit %d, want 3", code)
	}
}
