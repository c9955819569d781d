package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/apitest"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/server"
)

// Hostile requests against the edge (issue 13): every caller is an
// attacker, and so is every web page the user's browser shows.

// startEdge serves the real server the way `sbx serve` does (its
// http.Server, with the edge's time limits), without the contract checker:
// the refusals tested here come before any operation, and the checker
// would read the bodies itself.
func startEdge(t *testing.T, edge server.EdgeLimits, keySpecs ...string) *testServer {
	t.Helper()
	keys, err := server.ParseKeys(keySpecs)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a, err := app.Open(context.Background(), app.Config{
		DataDir: dir, StateDir: filepath.Join(dir, "state"), Keys: keys, Runtime: noRuntime,
		TemplateDir: filepath.Join(dir, "templates"), Log: testLog(t), Edge: edge,
		WorkspaceQuota: "off", // no sandboxes: nothing to hold to a quota
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = a.Server.HTTPServer()
	ts.Start()
	t.Cleanup(func() {
		ts.Close()
		a.Close()
	})
	return &testServer{Server: ts, app: a, dir: dir, keys: keys}
}

// TestJSONNeedsItsContentType: a JSON body must say so. A browser sends
// text/plain, form and multipart bodies to any site without a CORS
// preflight; application/json it sends only after one.
func TestJSONNeedsItsContentType(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "s"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, path, ctype, body string
		want                            int
	}{
		{"text/plain create", "POST", "/api/v1/sessions", "text/plain", `{"session_id":"csrf"}`, 415},
		{"text/plain;charset create", "POST", "/api/v1/sessions", "text/plain;charset=UTF-8", `{"session_id":"csrf"}`, 415},
		{"form create", "POST", "/api/v1/sessions", "application/x-www-form-urlencoded", `{"session_id":"csrf"}`, 415},
		{"multipart create", "POST", "/api/v1/sessions", "multipart/form-data; boundary=x", `{"session_id":"csrf"}`, 415},
		{"no type create", "POST", "/api/v1/sessions", "", `{"session_id":"csrf"}`, 415},
		{"json-ish type create", "POST", "/api/v1/sessions", "application/jsonp", `{"session_id":"csrf"}`, 415},
		{"malformed type create", "POST", "/api/v1/sessions", "application/json; =", `{"session_id":"csrf"}`, 415},
		{"text/plain execute", "POST", "/api/v1/sessions/s/execute", "text/plain", `{"code":"1"}`, 415},
		{"text/plain keepalive", "POST", "/api/v1/sessions/s/keepalive", "text/plain", `{}`, 415},
		{"text/plain agent execute", "POST", "/api/v1/agents/a/execute?wait=true", "text/plain", `{"user_id":"u","code":"1"}`, 415},
		{"text/plain tool", "POST", "/api/v1/tools/list_files/invoke", "text/plain", `{"user_id":"u","agent_id":"a","arguments":{}}`, 415},
		{"text/plain resources", "PUT", "/api/v1/sessions/s/resources", "text/plain", `{"resources":[]}`, 415},
		{"json with charset", "POST", "/api/v1/sessions", "application/json; charset=utf-8", `{"session_id":"ok1"}`, 201},
		{"json in capitals", "POST", "/api/v1/sessions", "Application/JSON", `{"session_id":"ok2"}`, 201},
		{"no type, no body", "POST", "/api/v1/sessions", "", ``, 201},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := ts.do(t, tc.method, tc.path, tc.ctype, strings.NewReader(tc.body))
			if resp.StatusCode != tc.want {
				t.Fatalf("%d %s, want %d", resp.StatusCode, b, tc.want)
			}
			if tc.want == 415 && (errorCode(t, b) != "unsupported_media_type" || !strings.Contains(string(b), "application/json")) {
				t.Errorf("not a clear 415: %s", b)
			}
		})
	}
	if _, err := c.GetSession(ctx, "csrf"); !isStatus(err, 404) {
		t.Errorf("a refused body still created its session: %v", err)
	}
	// With API keys too: the rule is the body's, not the mode's.
	keyed := start(t, "edge-key-1")
	resp, b := keyed.do(t, "POST", "/api/v1/sessions", "text/plain", strings.NewReader(`{}`), "X-API-Key", "edge-key-1")
	if resp.StatusCode != 415 {
		t.Errorf("keyed text/plain create: %d %s", resp.StatusCode, b)
	}
}

func isStatus(err error, code int) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.StatusCode == code
}

// TestOversizedJSONRefusedUnread: a Content-Length over the route's limit
// is 413 at once, before the body is read; a chunked body stops at the
// limit.
func TestOversizedJSONRefusedUnread(t *testing.T) {
	ts := startEdge(t, server.EdgeLimits{})
	for _, path := range []string{"/api/v1/sessions", "/api/v1/sessions/s/execute", "/api/v1/tools/read_file/invoke", "/api/v1/sessions/s/resources"} {
		t.Run(path, func(t *testing.T) {
			method := "POST"
			if strings.HasSuffix(path, "/resources") {
				method = "PUT"
			}
			// A 1 GiB body of which only a byte comes: the answer cannot
			// wait for the rest.
			conn := dial(t, ts)
			fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", method, path, 1<<30)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer before the body was sent: %v", err)
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			if resp.StatusCode != 413 || errorCode(t, b) != "payload_too_large" {
				t.Errorf("%d %s, want 413", resp.StatusCode, b)
			}
		})
	}
	t.Run("chunked", func(t *testing.T) {
		big := `{"session_id":"` + strings.Repeat("a", 3<<20) + `"}`
		req, _ := http.NewRequest("POST", ts.URL+"/api/v1/sessions", io.MultiReader(strings.NewReader(big))) // no length: chunked
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 413 {
			t.Errorf("%d %s, want 413", resp.StatusCode, b)
		}
	})
}

// dial opens a raw connection to the server; no read on it may wait more
// than a generous bound (a hang is the failure, not slowness).
func dial(t *testing.T, ts *testServer) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	return conn
}

// TestSlowBodyCutOff: a client that starts a body and stalls, or trickles
// it, loses the connection; it cannot hold a handler and a connection for
// ever (slowloris).
func TestSlowBodyCutOff(t *testing.T) {
	ts := startEdge(t, server.EdgeLimits{BodyTimeout: 300 * time.Millisecond, MinBodyRate: 1000})
	head := func(path, ctype string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: %s\r\nContent-Length: 100000\r\n\r\n", path, ctype)
	}
	for _, tc := range []struct {
		name, head, start string
		trickle           bool
	}{
		{"stalled JSON", head("/api/v1/sessions", "application/json"), `{"session_id":`, false},
		{"stalled upload", head("/api/v1/sessions/up/files/upload", "multipart/form-data; boundary=XX"),
			"--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\n\r\nabc", false},
		{"trickled JSON", head("/api/v1/sessions", "application/json"), `{"session_id":"`, true},
		{"trickled upload", head("/api/v1/sessions/up/files/upload", "multipart/form-data; boundary=XX"),
			"--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\n\r\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.head, "/up/") {
				ts.client("").CreateSession(context.Background(), api.CreateSessionRequest{SessionID: "up"})
			}
			conn := dial(t, ts)
			if _, err := io.WriteString(conn, tc.head+tc.start); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				if !tc.trickle {
					return
				}
				// A byte every 50 ms: alive, but far below 1000 bytes/s.
				tick := time.NewTicker(50 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := io.WriteString(conn, "a"); err != nil {
							return
						}
					}
				}
			}()
			defer func() { close(stop); <-done }()
			// The server answers 408 and closes: the read ends with the
			// connection, not with our 30 s deadline.
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("no answer after 30 s")
			}
			if err == nil {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				if resp.StatusCode != 408 || errorCode(t, b) != "request_timeout" {
					t.Errorf("%d %s, want 408", resp.StatusCode, b)
				}
			}
			if _, err := io.Copy(io.Discard, br); errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the server still held the connection after 30 s")
			}
		})
	}
}

// TestPacingKeepsLegitimateBodies: the body policy does not hurt a big
// upload or a request that goes on after its body (a long poll).
func TestPacingKeepsLegitimateBodies(t *testing.T) {
	ts := startEdge(t, server.EdgeLimits{})
	c := ts.client("")
	ctx := context.Background()
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "big",
		FileUploadConfig: &api.FileUploadConfig{MaxFileSize: 100, MaxFileSizeUnit: "MB"}}); err != nil {
		t.Fatal(err)
	}
	const size = 50 << 20
	up, err := c.Upload(ctx, "big", client.UploadOptions{}, client.UploadFile{Name: "big.bin", Reader: io.LimitReader(zeros{}, size)})
	if err != nil {
		t.Fatal(err)
	}
	if up.Files[0].Size != size {
		t.Errorf("uploaded %d bytes, want %d", up.Files[0].Size, size)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestNoKeyModeRefusesOtherSites: without API keys the server trusts
// whoever reaches its port, so it refuses what a web page elsewhere can
// make a browser send: a Host that is not a loopback name (DNS
// rebinding) and an Origin that is not its own (cross-site requests,
// multipart uploads included).
func TestNoKeyModeRefusesOtherSites(t *testing.T) {
	ts := startEdge(t, server.EdgeLimits{})
	keyed := startEdge(t, server.EdgeLimits{}, "edge-key-1")
	self := ts.URL // http://127.0.0.1:PORT
	port := ts.Listener.Addr().(*net.TCPAddr).Port
	ctype, upload := multipartBody(t, "file", "<script>alert(1)</script>")
	uploadBody := upload.String()
	ts.client("").CreateSession(context.Background(), api.CreateSessionRequest{SessionID: "s"})
	for _, tc := range []struct {
		name     string
		ts       *testServer
		method   string
		path     string
		host     string
		origin   string
		want     int
		wantCode string
	}{
		{"rebound name", ts, "GET", "/api/v1/sessions", "evil.example", "", 421, "misdirected_request"},
		{"rebound name and port", ts, "GET", "/api/v1/sessions", fmt.Sprintf("evil.example:%d", port), "", 421, "misdirected_request"},
		{"name that resolves to loopback", ts, "GET", "/api/v1/sessions", "127.0.0.1.nip.io", "", 421, "misdirected_request"},
		{"localhost as a prefix", ts, "GET", "/api/v1/sessions", "localhost.evil.example", "", 421, "misdirected_request"},
		{"operational endpoint too", ts, "GET", "/healthz", "evil.example", "", 421, "misdirected_request"},
		{"E2B API too", ts, "GET", "/sandboxes", "evil.example", "", 421, "misdirected_request"},
		{"the console too", ts, "GET", "/ui/", "evil.example", "", 421, "misdirected_request"},
		{"localhost", ts, "GET", "/api/v1/sessions", fmt.Sprintf("localhost:%d", port), "", 200, ""},
		{"LOCALHOST", ts, "GET", "/api/v1/sessions", "LOCALHOST", "", 200, ""},
		{"a .localhost name", ts, "GET", "/api/v1/sessions", "app.localhost:1", "", 200, ""},
		{"IPv6 loopback", ts, "GET", "/api/v1/sessions", "[::1]:7070", "", 200, ""},
		{"other site", ts, "POST", "/api/v1/sessions/s/files/upload", "", "http://evil.example", 403, "permission_denied"},
		{"other port of localhost", ts, "POST", "/api/v1/sessions/s/files/upload", "", "http://127.0.0.1:1", 403, "permission_denied"},
		{"other scheme", ts, "POST", "/api/v1/sessions/s/files/upload", "", "https://" + strings.TrimPrefix(self, "http://"), 403, "permission_denied"},
		{"null origin", ts, "POST", "/api/v1/sessions/s/files/upload", "", "null", 403, "permission_denied"},
		{"other site, GET", ts, "GET", "/api/v1/sessions", "", "http://evil.example", 403, "permission_denied"},
		{"own origin", ts, "POST", "/api/v1/sessions/s/files/upload", "", self, 201, ""},
		{"no origin", ts, "POST", "/api/v1/sessions/s/files/upload", "", "", 201, ""},
		// With keys a browser has nothing to send: the key is not a cookie.
		{"keys: any host", keyed, "GET", "/api/v1/sessions", "sbx.example.com", "", 401, "unauthenticated"},
		{"keys: any origin", keyed, "GET", "/api/v1/sessions", "", "http://evil.example", 401, "unauthenticated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			ct := ""
			if tc.method == "POST" {
				body, ct = strings.NewReader(uploadBody), ctype
			}
			req, err := http.NewRequest(tc.method, tc.ts.URL+tc.path, body)
			if err != nil {
				t.Fatal(err)
			}
			if ct != "" {
				req.Header.Set("Content-Type", ct)
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%d %s, want %d", resp.StatusCode, b, tc.want)
			}
			if tc.wantCode != "" && errorCode(t, b) != tc.wantCode {
				t.Errorf("code %s, want %s", errorCode(t, b), tc.wantCode)
			}
		})
	}
	files, err := ts.client("").ListFiles(context.Background(), "s", client.ListFilesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files.Files {
		if f.Type == "file" {
			n++
		}
	}
	if n != 1 { // "file", uploaded twice
		t.Errorf("refused uploads left files: %+v", files.Files)
	}
}

// TestDownloadsAreAttachments: a planted page is saved, never shown: no
// file download can run script on the API's origin.
func TestDownloadsAreAttachments(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "d"}); err != nil {
		t.Fatal(err)
	}
	names := []string{"page.html", "image.svg", `a"b;c.html`, "résumé 1.svg", "x%0d%0aSet-Cookie: a=b.html"}
	for _, name := range names {
		if _, err := c.Upload(ctx, "d", client.UploadOptions{}, client.UploadFile{Name: name, Reader: strings.NewReader(`<svg xmlns="http://www.w3.org/2000/svg"><script>alert(document.domain)</script></svg>`)}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := c.AgentUpload(ctx, "ag", "u", client.UploadOptions{}, client.UploadFile{Name: "agent.html", Reader: strings.NewReader("<script>1</script>")}); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, u, name string) {
		resp, b := ts.do(t, "GET", u, "", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		h := resp.Header
		if h.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("X-Content-Type-Options %q", h.Get("X-Content-Type-Options"))
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "sandbox") || !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("Content-Security-Policy %q", csp)
		}
		cd := h.Get("Content-Disposition")
		disp, params, err := mime.ParseMediaType(cd)
		if err != nil || disp != "attachment" || params["filename"] != name {
			t.Errorf("Content-Disposition %q: %v %v", cd, disp, params)
		}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			check(t, "/api/v1/sessions/d/files/"+url.PathEscape(name), name)
			p, err := c.Presign(ctx, "d", name, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			pu, _ := url.Parse(p.URL)
			check(t, pu.RequestURI(), name)
		})
	}
	t.Run("agent download", func(t *testing.T) {
		check(t, "/api/v1/agents/ag/files/agent.html?user_id=u", "agent.html")
	})
	// Every other answer of the API is no page either.
	resp, _ := ts.do(t, "GET", "/api/v1/sessions", "", nil)
	if resp.Header.Get("X-Content-Type-Options") != "nosniff" || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("list sessions: %v", resp.Header)
	}
}

// FuzzHandler sends whatever request line, headers and body the fuzzer
// makes up through the real handler (no runtime, no keys): no input may
// panic it or make it fail inside (5xx other than the 503 a machine
// without a runtime gives executions).
func FuzzHandler(f *testing.F) {
	dir := f.TempDir()
	a, err := app.Open(context.Background(), app.Config{
		DataDir: dir, StateDir: filepath.Join(dir, "state"), Runtime: noRuntime,
		TemplateDir: filepath.Join(dir, "templates"), Log: slog.New(slog.DiscardHandler),
		WorkspaceQuota: "off", // no sandboxes: nothing to hold to a quota
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(a.Close)
	h := a.Server.Handler()
	for _, s := range [][6]string{
		{"POST", "/api/v1/sessions", "localhost:7070", "application/json", "", `{"session_id":"s"}`},
		{"POST", "/api/v1/sessions", "localhost", "text/plain", "http://evil.example", `{"session_id":"x"}`},
		{"POST", "/api/v1/sessions/s/execute?wait=true", "127.0.0.1", "application/json", "", `{"code":"print(1)"}`},
		{"POST", "/api/v1/sessions/s/files/upload", "localhost", "multipart/form-data; boundary=B", "", "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"../a.html\"\r\n\r\n<b>\r\n--B--\r\n"},
		{"GET", "/api/v1/sessions/s/files/a.html", "localhost", "", "", ""},
		{"GET", "/api/v1/sessions/s/files/..%2f..%2fetc/passwd", "localhost", "", "", ""},
		{"GET", "/api/v1/sessions/s/files/a.html?presign=true&expires_in=-1", "localhost", "", "", ""},
		{"GET", "/api/v1/presigned/00/x?expires=9&signature=zz", "evil.example", "", "", ""},
		{"PUT", "/api/v1/sessions/s/resources", "localhost", "application/json", "", `{"resources":[{"name":"../x","sha256":"00","size":-1}]}`},
		{"POST", "/api/v1/tools/read_file/invoke", "localhost", "application/json", "", `{"user_id":"u","agent_id":"a","arguments":{"path":"/etc/passwd","offset":-5}}`},
		{"POST", "/mcp?user_id=u&agent_id=a", "localhost", "application/json", "", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_files"}}`},
		{"POST", "/sandboxes", "localhost", "application/json", "", `{"templateID":"base","timeout":-1}`},
		{"DELETE", "/api/v1/sessions/s", "[::1]:9", "", "null", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5])
	}
	f.Fuzz(func(t *testing.T, method, target, host, ctype, origin, body string) {
		raw := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nOrigin: %s\r\nContent-Length: %d\r\n\r\n%s",
			method, target, host, ctype, origin, len(body), body)
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // net/http would have refused it before the handler
		}
		req.RemoteAddr = "127.0.0.1:1"
		rec := httptest.NewRecorder()
		apitest.FuzzHandler(t, h).ServeHTTP(rec, req)
		if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %s (host %q, type %q, origin %q, body %q): %d %s", method, target, host, ctype, origin, body, rec.Code, rec.Body)
		}
	})
}
