package apitest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/api"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeT collects what Handler reports instead of failing the test.
type fakeT struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

func (f *fakeT) Helper() {}

func (f *fakeT) errors() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.errs...)
}

var now = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func session() api.Session {
	return api.Session{
		SessionID: "s1", Status: api.StatusRunning, TemplateID: "python",
		CreatedAt: now, LastActivityAt: now, ExpiresAt: now.Add(time.Hour), TTL: 3600, IdleTimeout: 600, HibernateTimeout: 86400, SandboxState: api.SandboxNone,
		Network: "none", Metadata: map[string]string{}, EnvVars: []string{},
		FileUploadConfig: api.FileUploadConfig{MaxFileSize: 100, MaxFileSizeUnit: "MB", MaxFileCount: 1000},
	}
}

func execution() api.Execution {
	code := 0
	return api.Execution{
		ExecutionID: "exec-1", SessionID: "s1", Status: api.ExecCompleted, Language: "python",
		CreatedAt: now, DurationMs: 3, Stdout: "hi\n", ExitCode: &code,
		ReturnValue: json.RawMessage(`{"a":1}`), Artifacts: []string{"out.csv"},
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, status int, code string) {
	writeJSON(w, status, api.Error{Error: api.ErrorBody{Code: code, Message: "no"}})
}

func sse(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for i := 0; i+1 < len(events); i += 2 {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", events[i], events[i+1])
		w.(http.Flusher).Flush()
	}
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }

func newRequest(method, target, ct, body string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if ct != "" {
		r.Header.Set("Content-Type", ct)
	}
	return r
}

func multipartBody(t *testing.T) (string, string) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	mw.WriteField("path", "data/")
	fw, _ := mw.CreateFormFile("file", "a.csv")
	io.WriteString(fw, "x,y\n1,2\n")
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), b.String()
}

func TestHandler(t *testing.T) {
	mpType, mpBody := multipartBody(t)
	tests := []struct {
		name    string
		req     *http.Request
		handler http.HandlerFunc
		// want are substrings of the reports, one each; none means the
		// exchange conforms.
		want []string
	}{
		{
			name:    "session conforms",
			req:     newRequest("GET", "/api/v1/sessions/s1", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, session()) },
		},
		{
			name: "session with a bad status",
			req:  newRequest("GET", "/api/v1/sessions/s1", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				s := session()
				s.Status = "sleeping"
				writeJSON(w, 200, s)
			},
			want: []string{"GET /api/v1/sessions/s1 -> 200: response body doesn't match schema"},
		},
		{
			name: "undocumented field",
			req:  newRequest("GET", "/api/v1/sessions/s1", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, 200, map[string]any{"session_id": "s1", "colour": "red"})
			},
			want: []string{"response body doesn't match schema"},
		},
		{
			name:    "undeclared status",
			req:     newRequest("GET", "/api/v1/sessions/s1", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) { apiError(w, http.StatusTeapot, "internal") },
			want:    []string{"status 418 is not declared"},
		},
		{
			name: "undeclared content type",
			req:  newRequest("GET", "/api/v1/sessions/s1", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				io.WriteString(w, "hello")
			},
			want: []string{`Content-Type "text/plain" is not declared`},
		},
		{
			name:    "undocumented path",
			req:     newRequest("GET", "/api/v1/nope", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) { apiError(w, 404, "not_found") },
			want:    []string{"GET /api/v1/nope: the path is not in the contract"},
		},
		{
			name:    "undocumented method",
			req:     newRequest("PUT", "/api/v1/sessions/s1", "application/json", "{}"),
			handler: func(w http.ResponseWriter, r *http.Request) { apiError(w, 405, "invalid_argument") },
			want:    []string{"the contract has no PUT for this path (only DELETE, GET)"},
		},
		{
			name:    "bad request accepted",
			req:     newRequest("POST", "/api/v1/sessions", "application/json", `{"bogus":1}`),
			handler: func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 201, session()) },
			want:    []string{"did not refuse it with a 4xx"},
		},
		{
			name:    "bad request refused",
			req:     newRequest("POST", "/api/v1/sessions", "application/json", `{"timeout":-1}`),
			handler: func(w http.ResponseWriter, r *http.Request) { apiError(w, 400, "invalid_argument") },
		},
		{
			name: "request body reaches the handler",
			req:  newRequest("POST", "/api/v1/sessions", "application/json", `{"session_id":"s1","metadata":{"user_id":"u"}}`),
			handler: func(w http.ResponseWriter, r *http.Request) {
				var req api.CreateSessionRequest
				if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Metadata["user_id"] != "u" {
					apiError(w, 400, "invalid_argument")
					return
				}
				writeJSON(w, 201, session())
			},
		},
		{
			name: "bad query parameter accepted",
			req:  newRequest("GET", "/api/v1/sessions?limit=5000", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, 200, api.SessionList{Sessions: []api.Session{}})
			},
			want: []string{"did not refuse"},
		},
		{
			name: "undeclared query parameter",
			req:  newRequest("GET", "/api/v1/sessions/s1?verbose=1", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, 200, session())
			},
			want: []string{`query parameter "verbose" is not in the contract`},
		},
		{
			name: "unavailable without Retry-After",
			req:  newRequest("POST", "/api/v1/sessions/s1/execute?wait=true", "application/json", `{"code":"1"}`),
			handler: func(w http.ResponseWriter, r *http.Request) {
				apiError(w, 503, "unavailable")
			},
			want: []string{"Retry-After"},
		},
		{
			name: "unavailable with Retry-After",
			req:  newRequest("POST", "/api/v1/sessions/s1/execute?wait=true", "application/json", `{"code":"1"}`),
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "5")
				apiError(w, 503, "unavailable")
			},
		},
		{
			name: "unknown error code",
			req:  newRequest("GET", "/api/v1/sessions/s1", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				apiError(w, 404, "gone")
			},
			want: []string{"response body doesn't match"},
		},
		{
			name: "stream conforms",
			req:  newRequest("POST", "/api/v1/sessions/s1/execute", "application/json", `{"code":"print(1)"}`),
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(200)
				io.WriteString(w, "event: submitted\r\ndata: "+jsonOf(api.SubmitResponse{ExecutionID: "exec-1", Status: "submitted"})+"\r\n\r\n")
				io.WriteString(w, ": keep-alive\n\n")
				// An event split across writes, CR LF between them.
				io.WriteString(w, "event: stdout\r")
				io.WriteString(w, "\ndata: {\"text\":\r")
				io.WriteString(w, "\ndata: \"1\\n\"}\n\n")
				io.WriteString(w, "event: result\ndata: "+jsonOf(execution())+"\n\n")
			},
		},
		{
			name: "stream with a bad event",
			req:  newRequest("POST", "/api/v1/sessions/s1/execute", "application/json", `{"code":"print(1)"}`),
			handler: func(w http.ResponseWriter, r *http.Request) {
				sse(w, "submitted", jsonOf(api.SubmitResponse{ExecutionID: "exec-1", Status: "submitted"}),
					"stdout", `{"txt":"1"}`,
					"progress", `{}`,
					"result", jsonOf(execution()),
					"stdout", `{"text":"late"}`)
			},
			want: []string{
				`event "stdout": data does not match its schema`,
				`event "progress" is not one of the contract's events`,
				`event "stdout" after the stream's final event`,
			},
		},
		{
			name: "stream without its first and final events",
			req:  newRequest("POST", "/api/v1/sessions/s1/execute", "application/json", `{"code":"print(1)"}`),
			handler: func(w http.ResponseWriter, r *http.Request) {
				sse(w, "stdout", `{"text":"1"}`)
			},
			want: []string{`the first event is "stdout", want "submitted"`, "without a final event"},
		},
		{
			name: "download of a JSON file",
			req:  newRequest("GET", "/api/v1/sessions/s1/files/dir/a%20b.json", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `[1, 2, 3]`)
			},
		},
		{
			name: "presign",
			req:  newRequest("GET", "/api/v1/sessions/s1/files/dir/a.csv?presign=true", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, 200, api.PresignResponse{URL: "http://x/y", ExpiresAt: now})
			},
		},
		{
			name: "presign answered with the bytes",
			req:  newRequest("GET", "/api/v1/sessions/s1/files/dir/a.csv?presign=true", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/csv")
				io.WriteString(w, "x,y\n")
			},
			want: []string{`Content-Type "text/csv", where the contract wants application/json`},
		},
		{
			name: "upload is routed to its own operation",
			req:  newRequest("POST", "/api/v1/sessions/s1/files/upload", mpType, mpBody),
			handler: func(w http.ResponseWriter, r *http.Request) {
				if _, err := r.MultipartReader(); err != nil {
					apiError(w, 400, "invalid_argument")
					return
				}
				writeJSON(w, 201, api.UploadResponse{Files: []api.UploadedFile{{
					Name: "a.csv", Path: "data/a.csv", SandboxPath: "/workspace/data/a.csv", Size: 8,
					SHA256: strings.Repeat("ab", 32),
				}}})
			},
		},
		{
			name:    "delete with a body",
			req:     newRequest("DELETE", "/api/v1/sessions/s1/files/a.txt", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204); io.WriteString(w, "x") },
			want:    []string{"where the contract declares none"},
		},
		{
			name: "presigned without a signature is refused",
			req:  newRequest("GET", "/api/v1/presigned/"+strings.Repeat("1", 32)+"/"+strings.Repeat("0", 64)+"/a.csv", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				apiError(w, 403, "permission_denied")
			},
		},
		{
			name: "metrics",
			req:  newRequest("GET", "/metrics", "", ""),
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ft := &fakeT{TB: t}
			Handler(ft, tt.handler).ServeHTTP(httptest.NewRecorder(), tt.req)
			got := ft.errors()
			if len(got) != len(tt.want) {
				t.Fatalf("reports:\n%s\nwant %d: %q", strings.Join(got, "\n"), len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("report %d: %s\nwant it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestStreamPassesThrough: the client sees each event when the handler
// flushes it, not when the handler returns.
func TestStreamPassesThrough(t *testing.T) {
	ft := &fakeT{TB: t}
	release := make(chan struct{})
	h := Handler(ft, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		fmt.Fprintf(w, "event: submitted\ndata: %s\n\n", jsonOf(api.SubmitResponse{ExecutionID: "exec-1", Status: "submitted"}))
		if err := rc.Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
		<-release
		fmt.Fprintf(w, "event: result\ndata: %s\n\n", jsonOf(execution()))
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/api/v1/sessions/s1/execute", strings.NewReader(`{"code":"1"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		close(release)
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if line != "event: submitted\n" || err != nil {
		t.Errorf("first line %q, %v", line, err)
	}
	close(release) // only now may the handler finish
	io.Copy(io.Discard, br)
	resp.Body.Close()
	srv.Close() // waits for the handler, and so for the final checks
	if errs := ft.errors(); len(errs) > 0 {
		t.Errorf("reports for a conforming stream:\n%s", strings.Join(errs, "\n"))
	}
}

func TestRouting(t *testing.T) {
	c, err := load()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		method, target string
		path           string
		params         map[string]string
	}{
		{"POST", "/api/v1/sessions/s1/files/upload", "/api/v1/sessions/{session_id}/files/upload", map[string]string{"session_id": "s1"}},
		{"GET", "/api/v1/sessions/s1/files/upload", "/api/v1/sessions/{session_id}/files/{path}", map[string]string{"session_id": "s1", "path": "upload"}},
		{"GET", "/api/v1/sessions/s1/files/a%20b/c%23d.txt", "/api/v1/sessions/{session_id}/files/{path}", map[string]string{"session_id": "s1", "path": "a b/c#d.txt"}},
		{"DELETE", "/api/v1/sessions/s.1/conversations/c-2", "/api/v1/sessions/{session_id}/conversations/{conversation_id}", map[string]string{"session_id": "s.1", "conversation_id": "c-2"}},
		{"HEAD", "/healthz", "/healthz", map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.target, func(t *testing.T) {
			rt, params, err := c.find(httptest.NewRequest(tt.method, tt.target, nil))
			if err != nil {
				t.Fatal(err)
			}
			if rt.Path != tt.path || fmt.Sprint(params) != fmt.Sprint(tt.params) {
				t.Errorf("got %s %v, want %s %v", rt.Path, params, tt.path, tt.params)
			}
		})
	}
	for _, target := range []string{"/api/v1/sessions/s1/extra/more", "/api/v1", "/api/v1/sessions/s1/pause/x"} {
		if rt, _, err := c.find(httptest.NewRequest("GET", target, nil)); err == nil {
			t.Errorf("%s matched %s", target, rt.Path)
		}
	}
}
