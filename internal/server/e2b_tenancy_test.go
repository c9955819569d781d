package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/server"
)

// The keys of TestE2BTenancy: alpha has two, one of which the last server
// no longer has.
const (
	alphaKey    = "e2b_alpha_key_0001"
	alphaOldKey = "e2b_alpha_key_0002"
	betaKey     = "e2b_beta_key_00001"
)

// e2bServer is a server without a sandbox runtime (everything the E2B
// layer does up to running code works), called in-process so that a test
// sees whether a handler read a request's body.
type e2bServer struct {
	app *app.App
	h   http.Handler
}

func openE2BServer(t *testing.T, dir string, tokenTTL time.Duration, keySpecs ...string) *e2bServer {
	t.Helper()
	keys, err := server.ParseKeys(keySpecs)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.Open(context.Background(), app.Config{
		DataDir: dir, StateDir: filepath.Join(dir, "state"), Keys: keys, Runtime: noRuntime,
		TemplateDir: filepath.Join(dir, "templates"), Log: testLog(t), E2BTokenTTL: tokenTTL,
		ReapInterval:   time.Hour, // nothing but the calls under test touches the sessions
		WorkspaceQuota: "off",     // no sandboxes: nothing to hold to a quota
	})
	if err != nil {
		t.Fatal(err)
	}
	return &e2bServer{app: a, h: a.Server.Handler()}
}

// tripwire is a request body that remembers being read.
type tripwire struct {
	r    io.Reader
	read bool
}

func (b *tripwire) Read(p []byte) (int, error) {
	b.read = true
	return b.r.Read(p)
}

// call serves one request; hdr is pairs of header names and values.
func (s *e2bServer) call(method, path string, body []byte, hdr ...string) (code int, resp string, bodyRead bool) {
	tw := &tripwire{r: bytes.NewReader(body)}
	req := httptest.NewRequest(method, path, tw)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String(), tw.read
}

// sandbox is what a create or connect answers.
type e2bSandbox struct {
	SandboxID          string `json:"sandboxID"`
	EnvdAccessToken    string `json:"envdAccessToken"`
	TrafficAccessToken string `json:"trafficAccessToken"`
}

func (s *e2bServer) create(t *testing.T, key string) e2bSandbox {
	t.Helper()
	code, body, _ := s.call("POST", "/sandboxes", []byte(`{"templateID":"base"}`), "X-API-Key", key, "Content-Type", "application/json")
	var sb e2bSandbox
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &sb) != nil || sb.EnvdAccessToken == "" {
		t.Fatalf("create: %d %s", code, body)
	}
	return sb
}

func (s *e2bServer) connect(t *testing.T, key, id string) e2bSandbox {
	t.Helper()
	code, body, _ := s.call("POST", "/v2/sandboxes/"+id+"/connect", []byte(`{"timeout":300}`), "X-API-Key", key, "Content-Type", "application/json")
	var sb e2bSandbox
	if (code != http.StatusOK && code != http.StatusCreated) || json.Unmarshal([]byte(body), &sb) != nil || sb.EnvdAccessToken == "" {
		t.Fatalf("connect %s: %d %s", id, code, body)
	}
	return sb
}

// in is an in-sandbox call's headers: the sandbox, the port, credentials.
func in(id, port string, cred ...string) []string {
	return append([]string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", port}, cred...)
}

func connectEnvelope(msg string) []byte {
	b := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

// e2bRoute is one E2B route, called on sandbox id.
type e2bRoute struct {
	name, method, path, ctype string
	body                      []byte
}

// inSandboxRoutes are every envd and interpreter route sbx serves, each
// aimed at doing something to the sandbox: read or write its files, run
// code, make or kill its contexts, find its processes.
func inSandboxRoutes(contextID string) map[string][]e2bRoute {
	unary := func(method, body string) e2bRoute {
		return e2bRoute{method, "POST", "/filesystem.Filesystem/" + method, "application/json", []byte(body)}
	}
	return map[string][]e2bRoute{
		"49983": {
			{"health", "GET", "/health", "", nil},
			{"read file", "GET", "/files?path=secret.txt", "", nil},
			{"write file", "POST", "/files?path=evil.txt", "application/octet-stream", []byte("evil")},
			unary("Stat", `{"path":"secret.txt"}`),
			unary("ListDir", `{"path":"/home/user"}`),
			unary("MakeDir", `{"path":"evil"}`),
			unary("Remove", `{"path":"secret.txt"}`),
			unary("Move", `{"source":"secret.txt","destination":"moved.txt"}`),
			{"process Start", "POST", "/process.Process/Start", "application/connect+json",
				connectEnvelope(`{"process":{"cmd":"/bin/bash","args":["-c","echo evil > evil.txt"]}}`)},
			{"process Connect", "POST", "/process.Process/Connect", "application/connect+json", connectEnvelope(`{"process":{"pid":1001}}`)},
			{"process List", "POST", "/process.Process/List", "application/json", []byte(`{}`)},
			{"process SendSignal", "POST", "/process.Process/SendSignal", "application/json", []byte(`{"process":{"pid":1001},"signal":"SIGNAL_SIGKILL"}`)},
		},
		"49999": {
			{"interpreter health", "GET", "/health", "", nil},
			{"execute", "POST", "/execute", "application/json", []byte(`{"code":"open('evil.txt','w')"}`)},
			{"create context", "POST", "/contexts", "application/json", []byte(`{"language":"python"}`)},
			{"list contexts", "GET", "/contexts", "", nil},
			{"remove context", "DELETE", "/contexts/" + contextID, "", nil},
			{"restart context", "POST", "/contexts/" + contextID + "/restart", "", nil},
		},
	}
}

// controlRoutes are E2B's control-plane routes that name a sandbox.
func controlRoutes(id string) []e2bRoute {
	var out []e2bRoute
	for _, p := range []string{"/sandboxes/", "/v2/sandboxes/"} {
		out = append(out,
			e2bRoute{"get " + p, "GET", p + id, "", nil},
			e2bRoute{"kill " + p, "DELETE", p + id, "", nil},
			e2bRoute{"timeout " + p, "POST", p + id + "/timeout", "application/json", []byte(`{"timeout":5}`)},
			e2bRoute{"refresh " + p, "POST", p + id + "/refreshes", "application/json", []byte(`{"duration":5}`)},
			e2bRoute{"pause " + p, "POST", p + id + "/pause", "", nil},
			e2bRoute{"resume " + p, "POST", p + id + "/resume", "application/json", []byte(`{"timeout":5}`)},
			e2bRoute{"connect " + p, "POST", p + id + "/connect", "application/json", []byte(`{"timeout":5}`)},
		)
	}
	return append(out, e2bRoute{"metrics", "GET", "/sandboxes/" + id + "/metrics", "", nil})
}

// TestE2BTenancy: every E2B route, called with no credentials or with
// the wrong ones (another tenant's key, another sandbox's token, a token
// with its tenant changed, an expired one, one whose key the server no
// longer has, one of a sandbox deleted and made again with its id),
// answers 401, 403 or 404, without reading the request's body, and does
// nothing: the sandbox's session, files, executions and contexts are as
// they were. The same calls with the sandbox's own token work.
func TestE2BTenancy(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()

	// A server whose tokens are born expired.
	s := openE2BServer(t, dir, time.Nanosecond, alphaKey+":alpha", alphaOldKey+":alpha", betaKey+":beta")
	a := s.create(t, alphaKey)
	expired := a.EnvdAccessToken
	s.app.Close()

	s = openE2BServer(t, dir, 0, alphaKey+":alpha", alphaOldKey+":alpha", betaKey+":beta")
	a = s.connect(t, alphaKey, a.SandboxID)
	oldKey := s.connect(t, alphaOldKey, a.SandboxID).EnvdAccessToken
	a2 := s.create(t, alphaKey)
	b := s.create(t, betaKey)
	// A sandbox deleted and made again with its id.
	d := s.create(t, alphaKey)
	for name, tok := range map[string]string{"alpha's other key": oldKey, "the first sandbox of an id": d.EnvdAccessToken} {
		id := a.SandboxID
		if tok == d.EnvdAccessToken {
			id = d.SandboxID
		}
		if code, body, _ := s.call("GET", "/contexts", nil, in(id, "49999", "X-Access-Token", tok)...); code != http.StatusOK {
			t.Fatalf("a token of %s, while it is good: %d %s", name, code, body)
		}
	}
	if code, body, _ := s.call("DELETE", "/sandboxes/"+d.SandboxID, nil, "X-API-Key", alphaKey); code != http.StatusNoContent {
		t.Fatalf("kill: %d %s", code, body)
	}
	recreate := fmt.Sprintf(`{"session_id":%q}`, d.SandboxID)
	if code, body, _ := s.call("POST", "/api/v1/sessions", []byte(recreate), "X-API-Key", alphaKey, "Content-Type", "application/json"); code != http.StatusCreated {
		t.Fatalf("create again: %d %s", code, body)
	}
	s.app.Close()

	// The server as it runs now: alpha's old key is gone.
	s = openE2BServer(t, dir, 0, alphaKey+":alpha", betaKey+":beta")
	defer s.app.Close()
	own := []string{"X-Access-Token", a.EnvdAccessToken}
	if code, body, _ := s.call("POST", "/files?path=secret.txt", []byte("alpha's"),
		in(a.SandboxID, "49983", append(own, "Content-Type", "application/octet-stream")...)...); code != http.StatusOK {
		t.Fatalf("write: %d %s", code, body)
	}
	var c struct{ ID string }
	if code, body, _ := s.call("POST", "/contexts", []byte(`{}`), in(a.SandboxID, "49999", own...)...); code != http.StatusOK || json.Unmarshal([]byte(body), &c) != nil {
		t.Fatalf("create context: %d %s", code, body)
	}

	// state is everything of alpha's a call could change.
	state := func() string {
		var out strings.Builder
		for _, p := range []string{"/api/v1/sessions/" + a.SandboxID, "/api/v1/sessions/" + a.SandboxID + "/files?recursive=true",
			"/api/v1/sessions/" + a.SandboxID + "/executions", "/api/v1/sessions/" + d.SandboxID, "/api/v1/sessions"} {
			code, body, _ := s.call("GET", p, nil, "X-API-Key", alphaKey)
			fmt.Fprintf(&out, "%s: %d %s\n", p, code, body)
		}
		_, body, _ := s.call("GET", "/contexts", nil, in(a.SandboxID, "49999", own...)...)
		fmt.Fprintf(&out, "contexts: %s\n", body)
		return out.String()
	}
	before := state()
	if !strings.Contains(before, c.ID) || !strings.Contains(before, "secret.txt") {
		t.Fatalf("state before: %s", before)
	}

	check := func(t *testing.T, r e2bRoute, hdr []string) {
		t.Helper()
		if r.ctype != "" {
			hdr = append(hdr, "Content-Type", r.ctype)
		}
		code, body, read := s.call(r.method, r.path, r.body, hdr...)
		if code != http.StatusUnauthorized && code != http.StatusForbidden && code != http.StatusNotFound {
			t.Errorf("%d %s, want 401, 403 or 404", code, body)
		}
		if read {
			t.Errorf("the body was read before the call was authenticated")
		}
		if after := state(); after != before {
			t.Errorf("the call changed alpha's sandbox:\nbefore %s\nafter  %s", before, after)
		}
	}

	forged := func(tok, tenant string) string {
		_, rest, _ := strings.Cut(tok, ".")
		return tenant + "." + rest
	}
	wrong := map[string][]string{
		"no credentials":                   nil,
		"beta's API key":                   {"X-API-Key", betaKey},
		"beta's API key as bearer":         {"Authorization", "Bearer " + betaKey},
		"alpha's API key":                  {"X-API-Key", alphaKey}, // in-sandbox calls take tokens, not keys
		"beta's sandbox's token":           {"X-Access-Token", b.EnvdAccessToken},
		"beta's traffic token":             {"E2B-Traffic-Access-Token", b.TrafficAccessToken},
		"alpha's other sandbox's token":    {"X-Access-Token", a2.EnvdAccessToken},
		"a token claiming beta":            {"X-Access-Token", forged(a.EnvdAccessToken, "beta")},
		"beta's token claiming alpha":      {"X-Access-Token", forged(b.EnvdAccessToken, "alpha")},
		"an expired token":                 {"X-Access-Token", expired},
		"a token of a key that is gone":    {"X-Access-Token", oldKey},
		"a token of an unknown sandbox":    {"X-Access-Token", a.EnvdAccessToken},
		"garbage":                          {"X-Access-Token", "garbage"},
		"a traffic token on the envd port": {"E2B-Traffic-Access-Token", a.TrafficAccessToken},
	}
	for port, routes := range inSandboxRoutes(c.ID) {
		for _, r := range routes {
			for name, cred := range wrong {
				id := a.SandboxID
				switch name {
				case "a token of an unknown sandbox":
					id = "inosuchsandbox000000"
				case "a traffic token on the envd port":
					if port != "49983" || a.TrafficAccessToken == "" {
						continue
					}
				}
				t.Run(port+" "+r.name+" with "+name, func(t *testing.T) { check(t, r, in(id, port, cred...)) })
			}
			// The old sandbox's token on the new one of its id.
			t.Run(port+" "+r.name+" with the token of a sandbox deleted and made again", func(t *testing.T) {
				check(t, r, in(d.SandboxID, port, "X-Access-Token", d.EnvdAccessToken))
			})
		}
	}
	for _, r := range controlRoutes(a.SandboxID) {
		for name, cred := range map[string][]string{
			"no key": nil, "an unknown key": {"X-API-Key", "e2b_" + strings.Repeat("0", 40)},
			"beta's key": {"X-API-Key", betaKey}, "beta's key as bearer": {"Authorization", "Bearer " + betaKey},
			"alpha's sandbox's token": {"X-API-Key", a.EnvdAccessToken}, "alpha's removed key": {"X-API-Key", alphaOldKey},
		} {
			t.Run(r.name+" with "+name, func(t *testing.T) { check(t, r, cred) })
		}
	}
	for name, cred := range map[string][]string{"no key": nil, "an unknown key": {"X-API-Key", "nope-nope-nope"}} {
		t.Run("create and list with "+name, func(t *testing.T) {
			check(t, e2bRoute{"create", "POST", "/sandboxes", "application/json", []byte(`{"templateID":"base"}`)}, cred)
			check(t, e2bRoute{"list", "GET", "/v2/sandboxes", "", nil}, cred)
		})
	}
	if code, body, _ := s.call("GET", "/v2/sandboxes", nil, "X-API-Key", betaKey); code != http.StatusOK || strings.Contains(body, a.SandboxID) {
		t.Errorf("beta's list: %d %s", code, body)
	}

	// The sandbox's own credentials still work, on every port.
	for _, cred := range [][]string{own, {"E2B-Traffic-Access-Token", a.TrafficAccessToken}} {
		if code, body, _ := s.call("GET", "/contexts", nil, in(a.SandboxID, "49999", cred...)...); code != http.StatusOK || !strings.Contains(body, c.ID) {
			t.Errorf("contexts with %s: %d %s", cred[0], code, body)
		}
	}
	if code, body, _ := s.call("POST", "/filesystem.Filesystem/Stat", []byte(`{"path":"secret.txt"}`), in(a.SandboxID, "49983", append(own, "Content-Type", "application/json")...)...); code != http.StatusOK {
		t.Errorf("stat with the sandbox's token: %d %s", code, body)
	}
	if code, body, _ := s.call("GET", "/files?path=secret.txt", nil, in(a.SandboxID, "49983", own...)...); code != http.StatusOK || body != "alpha's" {
		t.Errorf("read with the sandbox's token: %d %s", code, body)
	}
	if _, err := s.app.Sessions.Get(ctx, "alpha", a.SandboxID); err != nil {
		t.Errorf("alpha's sandbox: %v", err)
	}
	// No runtime here, so no readings: an empty list, not an error.
	if code, body, _ := s.call("GET", "/sandboxes/"+a.SandboxID+"/metrics?start=0", nil, "X-API-Key", alphaKey); code != http.StatusOK || strings.TrimSpace(body) != "[]" {
		t.Errorf("metrics with alpha's key: %d %s", code, body)
	}
	if code, body, _ := s.call("GET", "/sandboxes/"+a.SandboxID+"/metrics?end=soon", nil, "X-API-Key", alphaKey); code != http.StatusBadRequest {
		t.Errorf("metrics with end=soon: %d %s, want 400", code, body)
	}
	// The recreated sandbox takes a fresh token.
	fresh := s.connect(t, alphaKey, d.SandboxID)
	if code, body, _ := s.call("GET", "/contexts", nil, in(d.SandboxID, "49999", "X-Access-Token", fresh.EnvdAccessToken)...); code != http.StatusOK {
		t.Errorf("the new sandbox's own token: %d %s", code, body)
	}
}
