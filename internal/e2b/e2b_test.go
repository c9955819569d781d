package e2b

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/execution"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/session"
)

// frames splits a Connect streaming body into its envelopes.
func frames(t *testing.T, b []byte) (flags []byte, msgs []string) {
	t.Helper()
	for len(b) > 0 {
		if len(b) < 5 {
			t.Fatalf("truncated envelope header: % x", b)
		}
		n := binary.BigEndian.Uint32(b[1:5])
		if len(b) < 5+int(n) {
			t.Fatalf("truncated envelope: want %d bytes, have %d", n, len(b)-5)
		}
		flags = append(flags, b[0])
		msgs = append(msgs, string(b[5:5+n]))
		b = b[5+n:]
	}
	return flags, msgs
}

func TestStreamFraming(t *testing.T) {
	rec := httptest.NewRecorder()
	s := newStream(rec)
	s.Send(processEvent{"start": map[string]uint32{"pid": 1001}})
	s.Send(processEvent{"data": map[string]string{"stdout": base64.StdEncoding.EncodeToString([]byte("hi\n"))}})
	s.End(nil)
	s.Send(processEvent{"keepalive": struct{}{}}) // after the end: dropped
	if ct := rec.Header().Get("Content-Type"); ct != "application/connect+json" {
		t.Fatalf("Content-Type %q", ct)
	}
	flags, msgs := frames(t, rec.Body.Bytes())
	want := []string{`{"event":{"start":{"pid":1001}}}`, `{"event":{"data":{"stdout":"aGkK"}}}`, `{}`}
	if fmt.Sprint(msgs) != fmt.Sprint(want) || !bytes.Equal(flags, []byte{0, 0, flagEndStream}) {
		t.Fatalf("frames %v %q, want [0 0 2] %q", flags, msgs, want)
	}

	rec = httptest.NewRecorder()
	newStream(rec).End(&rpcError{Code: "deadline_exceeded", Message: "too slow"})
	flags, msgs = frames(t, rec.Body.Bytes())
	if len(msgs) != 1 || flags[0] != flagEndStream || msgs[0] != `{"error":{"code":"deadline_exceeded","message":"too slow"}}` {
		t.Fatalf("error end: %v %q", flags, msgs)
	}
}

func TestReadStreamRequest(t *testing.T) {
	msg := []byte(`{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"b"},"cwd":"/tmp"},"stdin":false}`)
	cases := []struct {
		name, ct string
		body     []byte
		err      error
	}{
		{"ok", "application/connect+json", envelope(0, msg), nil},
		{"unary content type", "application/json", msg, errdefs.ErrInvalidArgument},
		{"short header", "application/connect+json", []byte{0, 0}, errdefs.ErrInvalidArgument},
		{"short body", "application/connect+json", envelope(0, msg)[:20], errdefs.ErrInvalidArgument},
		{"too large", "application/connect+json", []byte{0, 0xff, 0xff, 0xff, 0xff}, errdefs.ErrInvalidArgument},
		{"compressed", "application/connect+json", envelope(flagCompressed, msg), errdefs.ErrInvalidArgument},
		{"not JSON", "application/connect+json", envelope(0, []byte("{nope")), errdefs.ErrInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/process.Process/Start", bytes.NewReader(tc.body))
			r.Header.Set("Content-Type", tc.ct)
			var req startRequest
			err := readStreamRequest(r, &req)
			if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if tc.err == nil && (req.Process.Args[2] != "echo hi" || *req.Process.Cwd != "/tmp" || req.Process.Envs["A"] != "b") {
				t.Fatalf("decoded %+v", req)
			}
		})
	}
}

func TestUnaryErrors(t *testing.T) {
	cases := []struct {
		err    error
		code   string
		status int
	}{
		{fmt.Errorf("x: %w", errdefs.ErrNotFound), "not_found", 404},
		{fmt.Errorf("x: %w", errdefs.ErrInvalidArgument), "invalid_argument", 400},
		{fmt.Errorf("x: %w", errdefs.ErrAlreadyExists), "already_exists", 409},
		{fmt.Errorf("x: %w", errdefs.ErrUnavailable), "unavailable", 503},
		{fmt.Errorf("x: %w", errdefs.ErrUnauthenticated), "unauthenticated", 401},
		{unimplemented("no"), "unimplemented", 501},
		{errors.New("boom"), "internal", 500},
	}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		writeUnaryError(rec, tc.err)
		var body rpcError
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if rec.Code != tc.status || body.Code != tc.code {
			t.Errorf("%v: %d %q, want %d %q", tc.err, rec.Code, body.Code, tc.status, tc.code)
		}
	}
}

func TestAPIStatus(t *testing.T) {
	for err, want := range map[error]int{
		fmt.Errorf("x: %w", errdefs.ErrNotFound):           404,
		fmt.Errorf("x: %w", errdefs.ErrInvalidArgument):    400,
		fmt.Errorf("x: %w", errdefs.ErrFailedPrecondition): 409,
		fmt.Errorf("x: %w", errdefs.ErrUnauthenticated):    401,
		fmt.Errorf("x: %w", errdefs.ErrUnavailable):        503,
		errors.New("boom"): 500,
	} {
		if got := apiStatus(err); got != want {
			t.Errorf("apiStatus(%v) = %d, want %d", err, got, want)
		}
	}
}

func TestResolve(t *testing.T) {
	cases := []struct{ in, rel, base, shown string }{
		{"/home/user/a.txt", "a.txt", homeDir, "/home/user/a.txt"},
		{"a.txt", "a.txt", homeDir, "/home/user/a.txt"},
		{"~/d/a.txt", "d/a.txt", homeDir, "/home/user/d/a.txt"},
		{"/workspace/d/", "d", workspaceDir, "/workspace/d"},
		{"/workspace", ".", workspaceDir, "/workspace"},
		{"/home/user", ".", homeDir, "/home/user"},
		{"./x//y", "x/y", homeDir, "/home/user/x/y"},
	}
	for _, tc := range cases {
		sp, err := resolve(tc.in)
		if err != nil || sp.Rel != tc.rel || sp.Base != tc.base || sp.show(sp.Rel) != tc.shown {
			t.Errorf("resolve(%q) = %+v (%q), %v; want %q in %q", tc.in, sp, sp.show(sp.Rel), err, tc.rel, tc.base)
		}
	}
	for _, bad := range []string{"", "/etc/passwd", "/", "../x", "/home/user/../../etc", "/workspace/a/../../x", "/home/userx/a", "/workspacex"} {
		if _, err := resolve(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("resolve(%q): %v, want ErrInvalidArgument", bad, err)
		}
	}
}

func TestCommandCode(t *testing.T) {
	str := func(s string) *string { return &s }
	cases := []struct {
		cfg  processConfig
		want string
	}{
		{processConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi"}}, "cd -- '/home/user' || exit 1\necho hi"},
		{processConfig{Cmd: "/bin/bash", Args: []string{"-c", "pwd"}, Cwd: str("sub")}, "cd -- '/home/user/sub' || exit 1\npwd"},
		{processConfig{Cmd: "/bin/bash", Args: []string{"-c", "pwd"}, Cwd: str("~/a/../b")}, "cd -- '/home/user/b' || exit 1\npwd"},
		{processConfig{Cmd: "/bin/bash", Args: []string{"-c", "pwd"}, Cwd: str("/tmp/it's")}, "cd -- '/tmp/it'\\''s' || exit 1\npwd"},
		{processConfig{Cmd: "bash", Args: []string{"-c", "echo $1", "name", "arg one"}}, "cd -- '/home/user' || exit 1\nset -- 'arg one'\necho $1"},
		{processConfig{Cmd: "/usr/bin/python3", Args: []string{"-c", "print('x')"}}, "cd -- '/home/user' || exit 1\nexec '/usr/bin/python3' '-c' 'print('\\''x'\\'')'"},
	}
	for _, tc := range cases {
		got, err := commandCode(tc.cfg)
		if err != nil || got != tc.want {
			t.Errorf("commandCode(%+v) = %q, %v; want %q", tc.cfg, got, err, tc.want)
		}
	}
	for _, bad := range []processConfig{{}, {Cmd: "a\x00b"}, {Cmd: "bash", Args: []string{"-c", "x\x00"}}} {
		if _, err := commandCode(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("commandCode(%+v): %v, want ErrInvalidArgument", bad, err)
		}
	}
}

func TestEndEvent(t *testing.T) {
	code := func(n int) *int { return &n }
	cases := []struct {
		name    string
		x       api.Execution
		want    string
		errCode string
	}{
		{"ok", api.Execution{Status: api.ExecCompleted, ExitCode: code(0)},
			`{"exitCode":0,"exited":true,"status":"exit status 0"}`, ""},
		{"exit 3", api.Execution{Status: api.ExecFailed, ExitCode: code(3), Error: &api.ExecError{Type: wire.ErrTypeNonZeroExit}},
			`{"exitCode":3,"exited":true,"status":"exit status 3"}`, ""},
		{"killed", api.Execution{Status: api.ExecCancelled, ExitCode: code(137)},
			`{"exitCode":-1,"exited":false,"status":"signal: killed"}`, ""},
		{"timeout", api.Execution{Status: api.ExecTimeout, ExitCode: code(137)},
			`{"error":"command timed out","exitCode":-1,"exited":false,"status":"signal: killed"}`, "deadline_exceeded"},
		{"oom", api.Execution{Status: api.ExecFailed, ExitCode: code(137), Error: &api.ExecError{Type: wire.ErrTypeOutOfMemory, Message: "limit 512 MiB"}},
			`{"error":"OutOfMemory: limit 512 MiB","exitCode":137,"exited":true,"status":"exit status 137"}`, ""},
		{"no sandbox", api.Execution{Status: api.ExecFailed, Error: &api.ExecError{Type: execution.ErrTypeUnavailable, Message: "no runtime"}},
			`null`, "unavailable"},
	}
	for _, tc := range cases {
		end, err := endEvent(&tc.x)
		b, _ := json.Marshal(end)
		if string(b) != tc.want || connectCodeOrEmpty(err) != tc.errCode {
			t.Errorf("%s: %s, %v; want %s, %q", tc.name, b, err, tc.want, tc.errCode)
		}
	}
}

func connectCodeOrEmpty(err error) string {
	if err == nil {
		return ""
	}
	return connectCode(err)
}

func TestCellMessages(t *testing.T) {
	ret, _ := json.Marshal(map[string]any{
		"results":         []map[string]any{{"text": "42", "is_main_result": true}, {"png": "iVBOR"}},
		"error":           map[string]string{"name": "ValueError", "value": "bad", "traceback": "tb"},
		"execution_count": 3,
	})
	msgs := cellMessages(&api.Execution{Status: api.ExecCompleted, ReturnValue: ret})
	var lines []string
	for _, m := range msgs {
		b, _ := json.Marshal(m)
		lines = append(lines, string(b))
	}
	want := []string{
		`{"is_main_result":true,"text":"42","type":"result"}`,
		`{"is_main_result":false,"png":"iVBOR","type":"result"}`,
		`{"name":"ValueError","traceback":"tb","type":"error","value":"bad"}`,
		`{"execution_count":3,"type":"number_of_executions"}`,
		`{"type":"end_of_execution"}`,
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	// A cell that never returned (timeout): the execution's error.
	msgs = cellMessages(&api.Execution{Status: api.ExecTimeout, Error: &api.ExecError{Type: "Timeout", Message: "ran past 60s"}})
	if len(msgs) != 2 || msgs[0]["name"] != "Timeout" || msgs[1]["type"] != "end_of_execution" {
		t.Fatalf("timeout: %v", msgs)
	}
}

// TestTokens: a sandbox's access token is good for its sandbox, its
// purpose, its tenant, the incarnation of the session it was made for,
// while the key it was made under is the server's and until it expires.
func TestTokens(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	keyA, keyB := sha256.Sum256([]byte("key-a")), sha256.Sum256([]byte("key-b"))
	digests := map[string][][32]byte{"acme": {keyA}, "evil": {keyB}}
	h := &Handler{now: func() time.Time { return now }, opt: Options{SigningKey: []byte("k"), TokenTTL: time.Hour, Auth: Auth{
		DefaultTenant: "default",
		Lookup:        func(string) (string, [32]byte, bool) { return "", [32]byte{}, false },
		Digests:       func(tenant string) [][32]byte { return digests[tenant] },
	}}}
	sess := &session.Session{}
	sess.ID, sess.CreatedAt = "isbx1", now.Add(-time.Minute)
	envd, traffic := h.accessTokens(caller{tenant: "acme", key: keyA}, sess)
	if tenant, created, err := h.verifyToken(purposeEnvd, envd, "isbx1"); err != nil || tenant != "acme" || created != sess.CreatedAt.UnixMicro() {
		t.Fatalf("good token: %q %d %v", tenant, created, err)
	}
	if _, _, err := h.verifyToken(purposeTraffic, traffic, "isbx1"); err != nil {
		t.Fatalf("good traffic token: %v", err)
	}
	claim := func(tok, tenant string) string {
		_, rest, _ := strings.Cut(tok, ".")
		return tenant + "." + rest
	}
	evilTok, _ := h.accessTokens(caller{tenant: "evil", key: keyB}, sess)
	for name, tc := range map[string]struct{ purpose, tok, id string }{
		"other sandbox's id":          {purposeEnvd, envd, "isbx2"},
		"traffic token as envd's":     {purposeEnvd, traffic, "isbx1"},
		"envd token as traffic's":     {purposeTraffic, envd, "isbx1"},
		"another tenant claimed":      {purposeEnvd, claim(envd, "evil"), "isbx1"},
		"another tenant's, as acme's": {purposeEnvd, claim(evilTok, "acme"), "isbx1"},
		"later expiry":                {purposeEnvd, strings.Replace(envd, ".", ".9", 1), "isbx1"},
		"garbage":                     {purposeEnvd, "garbage", "isbx1"},
		"empty parts":                 {purposeEnvd, "...", "isbx1"},
	} {
		if _, _, err := h.verifyToken(tc.purpose, tc.tok, tc.id); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s: %v, want errdefs.ErrUnauthenticated", name, err)
		}
	}
	now = now.Add(time.Hour)
	if _, _, err := h.verifyToken(purposeEnvd, envd, "isbx1"); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired: %v", err)
	}
	now = now.Add(-time.Second)
	digests["acme"] = [][32]byte{keyB}
	if _, _, err := h.verifyToken(purposeEnvd, envd, "isbx1"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("the key it was made under is gone: %v", err)
	}
	digests["acme"] = [][32]byte{keyB, keyA}
	if _, _, err := h.verifyToken(purposeEnvd, envd, "isbx1"); err != nil {
		t.Errorf("the key is back: %v", err)
	}
	// Without keys, tokens are bound to no key; with keys again they are
	// no good.
	h.opt.Auth.Lookup = nil
	free, _ := h.accessTokens(caller{tenant: "default"}, sess)
	if tenant, _, err := h.verifyToken(purposeEnvd, free, "isbx1"); err != nil || tenant != "default" {
		t.Errorf("no keys: %q %v", tenant, err)
	}
	h.opt.Auth.Lookup = func(string) (string, [32]byte, bool) { return "", [32]byte{}, false }
	digests["default"] = [][32]byte{keyA}
	if _, _, err := h.verifyToken(purposeEnvd, free, "isbx1"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a keyless token on a server with keys: %v", err)
	}
}

// TestDriver runs driver.py with the machine's python3 (outside a
// sandbox): the notebook semantics, without sbx.
func TestDriver(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	cells := []string{
		"x = 41\nx + 1",
		"print('out')\nx",
		"y = 1\ny / 0",
		"def (",
		"display('shown')\nNone",
		"_",
	}
	var script strings.Builder
	script.WriteString(driver)
	script.WriteString("\nimport base64, json\nb = lambda s: base64.b64encode(s.encode()).decode()\n")
	for _, c := range cells {
		fmt.Fprintf(&script, "print(json.dumps(_sbx_e2b_cell(b(%q), b(''))))\n", c)
	}
	out, err := exec.Command(py, "-c", script.String()).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var res []cellResult
	for _, l := range lines {
		if !strings.HasPrefix(l, "{") {
			continue // the cells' own output
		}
		var r cellResult
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		res = append(res, r)
	}
	if len(res) != len(cells) {
		t.Fatalf("%d results for %d cells:\n%s", len(res), len(cells), out)
	}
	check := func(i int, ok bool, what string) {
		t.Helper()
		if !ok {
			b, _ := json.Marshal(res[i])
			t.Errorf("cell %d (%q): %s: %s", i, cells[i], what, b)
		}
	}
	check(0, len(res[0].Results) == 1 && res[0].Results[0]["text"] == "42" && res[0].Results[0]["is_main_result"] == true, "main result 42")
	check(1, len(res[1].Results) == 1 && res[1].Results[0]["text"] == "41" && res[1].ExecutionCount == 2, "state kept, count 2")
	check(2, res[2].Error != nil && res[2].Error.Name == "ZeroDivisionError" && strings.Contains(res[2].Error.Traceback, "y / 0") &&
		!strings.Contains(res[2].Error.Traceback, "_sbx_e2b_cell"), "ZeroDivisionError from the cell only")
	check(3, res[3].Error != nil && res[3].Error.Name == "SyntaxError", "SyntaxError")
	check(4, len(res[4].Results) == 1 && res[4].Results[0]["text"] == "'shown'" && res[4].Results[0]["is_main_result"] == false, "display")
	check(5, len(res[5].Results) == 1 && res[5].Results[0]["text"] == "41", "_ is the last value")
}

func TestContextIDs(t *testing.T) {
	for _, dir := range []string{"/home/user", "/tmp", "/home/user/a b/é"} {
		id := newContextID(dir)
		c, ok := parseContext(id)
		if !ok || c.ID != id || c.Cwd != dir || c.Language != "python" {
			t.Errorf("%q: id %q parses to %+v, %v", dir, id, c, ok)
		}
		if got := sbxContext(id); len(got) != len("e2b-")+16 || !session.ValidID(got) {
			t.Errorf("%q: executor context %q", dir, got)
		}
	}
	if c, ok := parseContext(defaultContext); !ok || c.Cwd != homeDir || sbxContext(defaultContext) != "e2b-default" {
		t.Errorf("default context: %+v %v", c, ok)
	}
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, bad := range []string{
		"", "nonsense", "0123456789abcdef", "0123456789abcdef.", "0123456789ABCDEF." + b64("/tmp"),
		"0123456789abcde." + b64("/tmp"), "0123456789abcdef." + b64("tmp"), "0123456789abcdef." + b64("/tmp/../etc"),
		"0123456789abcdef." + b64("/tmp\x00"), "0123456789abcdef.!!", "0123456789abcdef." + b64("/"+strings.Repeat("a", maxContextCwd)),
	} {
		if c, ok := parseContext(bad); ok {
			t.Errorf("%q parses to %+v", bad, c)
		}
	}
}
