package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/template"
)

// Per-tenant quotas: a tenant at a limit gets 429 with Retry-After
// and the limit's name; another tenant is not held by it.
func TestTenantQuotas(t *testing.T) {
	defaults, err := server.ParseLimits("sessions=100,history=4", session.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	tenants, err := server.ParseTenantLimits([]string{"alpha:sessions=2", "alpha:disk=2G,stored=1", "gamma:stored=1"}, defaults)
	if err != nil {
		t.Fatal(err)
	}
	if tenants["alpha"] != (session.Limits{Sessions: 2, DiskMB: 2048, History: 4, StoredMB: 1}) {
		t.Fatalf("alpha's limits: %+v", tenants["alpha"])
	}
	ts := startConfigured(t, func(c *app.Config) {
		c.Limits, c.TenantLimits = defaults, tenants
		c.MaxResources = api.Resources{CPU: 1, Memory: 2048}
	}, "key-alpha-1:alpha", "key-beta-1:beta", "key-gamma-1:gamma")
	ctx := context.Background()
	alpha, beta := ts.client("key-alpha-1"), ts.client("key-beta-1")

	for _, id := range []string{"a1", "a2"} {
		if _, _, err := alpha.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, Resources: &api.Resources{Disk: 1024}}); err != nil {
			t.Fatal(err)
		}
	}
	resp, b := ts.do(t, "POST", "/api/v1/sessions", "application/json", strings.NewReader(`{"session_id":"a3"}`), "Authorization", "Bearer key-alpha-1")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || errorCode(t, b) != "resource_exhausted" ||
		!strings.Contains(string(b), "sessions") || !strings.Contains(string(b), "the limit is 2") {
		t.Errorf("alpha's third session: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	// Stored bytes: presigned copies count; the presign that finds alpha
	// at its 1 MiB is refused, beta's is not.
	presign := func(c *client.Client, sess, name string) error {
		t.Helper()
		b := make([]byte, 1<<20)
		rand.Read(b)
		up, err := c.Upload(ctx, sess, client.UploadOptions{}, client.UploadFile{Name: name, Reader: bytes.NewReader(b)})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Presign(ctx, sess, up.Files[0].Path, time.Minute)
		return err
	}
	if err := presign(alpha, "a1", "one.bin"); err != nil {
		t.Fatalf("alpha's first presign: %v", err)
	}
	err = presign(alpha, "a1", "two.bin")
	ae := (*client.APIError)(nil)
	if !errors.As(err, &ae) || ae.StatusCode != 429 || !strings.Contains(ae.Message, "stored") {
		t.Errorf("alpha's presign past its stored limit: %v", err)
	}
	// Resource content is stored bytes too: refused for alpha now, and
	// what gamma sends counts toward its own limit.
	big := make([]byte, 1<<20)
	rand.Read(big)
	if err := alpha.PutContent(ctx, big); !errors.As(err, &ae) || ae.StatusCode != 429 || !strings.Contains(ae.Message, "stored") {
		t.Errorf("alpha's resource content past its stored limit: %v", err)
	}
	gamma := ts.client("key-gamma-1")
	if err := gamma.PutContent(ctx, big); err != nil {
		t.Fatalf("gamma's resource content: %v", err)
	}
	if err := gamma.PutContent(ctx, []byte("one more")); !errors.As(err, &ae) || ae.StatusCode != 429 || !strings.Contains(ae.Message, "stored") {
		t.Errorf("gamma's resource content past its stored limit: %v", err)
	}
	if _, _, err := beta.CreateSession(ctx, api.CreateSessionRequest{SessionID: "b0"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"one.bin", "two.bin"} {
		if err := presign(beta, "b0", name); err != nil {
			t.Errorf("beta's presign: %v", err)
		}
	}
	if _, err := beta.DeleteSession(ctx, "b0"); err != nil {
		t.Fatal(err)
	}

	// Beta is not held by alpha's limits.
	for _, id := range []string{"b1", "b2", "b3"} {
		if _, _, err := beta.CreateSession(ctx, api.CreateSessionRequest{SessionID: id}); err != nil {
			t.Errorf("beta's session %s: %v", id, err)
		}
	}
	// A deleted session frees its place; the disk sum is its own limit.
	if _, err := alpha.DeleteSession(ctx, "a2"); err != nil {
		t.Fatal(err)
	}
	_, _, err = alpha.CreateSession(ctx, api.CreateSessionRequest{SessionID: "a3", Resources: &api.Resources{Disk: 1025}})
	if !errors.As(err, &ae) || ae.StatusCode != 429 || !strings.Contains(ae.Message, "disk") {
		t.Errorf("over the disk sum: %v", err)
	}
	if _, _, err := alpha.CreateSession(ctx, api.CreateSessionRequest{SessionID: "a3", Resources: &api.Resources{Disk: 1024}}); err != nil {
		t.Errorf("within the disk sum: %v", err)
	}

	// What one session may ask for is capped server-wide: 400, not 429.
	for _, res := range []string{`{"cpu":1.5}`, `{"memory":4096}`} {
		resp, b := ts.do(t, "POST", "/api/v1/sessions", "application/json", strings.NewReader(`{"session_id":"big","resources":`+res+`}`), "Authorization", "Bearer key-beta-1")
		if resp.StatusCode != 400 || !strings.Contains(string(b), "limit for one session") {
			t.Errorf("session asking %s: %d %s", res, resp.StatusCode, b)
		}
	}

	// History: a session keeps its tenant's share of executions.
	for range 6 {
		if _, err := beta.Submit(ctx, "b1", api.ExecuteRequest{Code: "1"}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		hist, err := beta.ListExecutions(ctx, "b1", 100, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(hist.Executions) <= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("history keeps %d executions, want at most 4", len(hist.Executions))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestParseLimits(t *testing.T) {
	for _, bad := range []string{"sessions", "sessions=-1", "memory=lots", "cpu=NaN", "nope=1", "disk=1T", "history_size=8"} {
		if _, err := server.ParseLimits(bad, session.Limits{}); err == nil {
			t.Errorf("ParseLimits(%q) succeeded", bad)
		}
	}
	l, err := server.ParseLimits("sandboxes=3,memory=4G,cpu=1.5,disk=512,stored=2G,history_size=2G", session.Limits{History: 9})
	if err != nil || l != (session.Limits{Sandboxes: 3, MemoryMB: 4096, CPU: 1.5, DiskMB: 512, History: 9, HistoryMB: 2048, StoredMB: 2048}) {
		t.Errorf("ParseLimits = %+v, %v", l, err)
	}
	// Over a base, only what is named changes; 0 is no bound.
	if l, err := server.ParseLimits("history_size=0,cpu=0", session.Limits{CPU: 8, HistoryMB: 1024, Sessions: 5}); err != nil || l != (session.Limits{Sessions: 5}) {
		t.Errorf("ParseLimits over a base = %+v, %v", l, err)
	}
	for _, bad := range []string{"alpha", ":sessions=1", "al/pha:sessions=1"} {
		if _, err := server.ParseTenantLimits([]string{bad}, session.Limits{}); err == nil {
			t.Errorf("ParseTenantLimits(%q) succeeded", bad)
		}
	}
	if _, err := server.ParseSessionMax("gpu=1"); err == nil {
		t.Error("ParseSessionMax(gpu=1) succeeded")
	}
}

// A server on sbx serve's defaults (app.DefaultLimits, here of a small
// machine: one core, 2 GiB, a 10 GiB workspace file system) bounds every
// tenant: the live sandbox past one per 256 MiB, the memory past three
// quarters of the machine's, the CPU past four per core and the disk past
// the file system are 429 with the limit's name, each tenant held alone;
// a session asking for more disk than the workspace file system has is
// 400.
func TestDefaultLimitsHold(t *testing.T) {
	rt := &execRuntime{Fake: runtimetest.NewFake(), sock: fakeExecutor(t)}
	var fsMB int64
	ts := startConfigured(t, func(c *app.Config) {
		c.Runtime = func(string) (runtime.Runtime, error) { return rt, nil }
		c.LimitsFor = func(m app.Machine) (session.Limits, map[string]session.Limits, error) {
			fsMB = m.WorkspaceMB
			return app.DefaultLimits(app.Machine{CPUs: 1, MemoryMB: 2048, WorkspaceMB: 10240}, 1), nil, nil
		}
	}, "key-alpha-1:alpha", "key-beta-1:beta", "key-gamma-1:gamma", "key-delta-1:delta")
	spec, _ := template.Builtin("python")
	fakeTemplateBuild(t, ts, "", spec)
	create := func(key, id, resources string) (*http.Response, []byte) {
		return ts.do(t, "POST", "/api/v1/sessions", "application/json", strings.NewReader(`{"session_id":"`+id+`","template_id":"python","resources":`+resources+`}`), "Authorization", "Bearer "+key)
	}
	// run starts the session's sandbox, as its first execution does.
	run := func(key, id, resources string) (*http.Response, []byte) {
		t.Helper()
		if resp, b := create(key, id, resources); resp.StatusCode != 201 {
			t.Fatalf("session %s: %d %s", id, resp.StatusCode, b)
		}
		return ts.do(t, "POST", "/api/v1/sessions/"+id+"/execute?wait=true", "application/json", strings.NewReader(`{"code":"print('hi')"}`), "Authorization", "Bearer "+key)
	}
	refused := func(what string, resp *http.Response, b []byte, limit string) {
		t.Helper()
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), limit) {
			t.Errorf("%s: %d %s, want 429 naming %q", what, resp.StatusCode, b, limit)
		}
	}
	small := `{"cpu":0.25,"memory":64}`
	for i := range 8 {
		if resp, b := run("key-alpha-1", fmt.Sprintf("a%d", i), small); resp.StatusCode != 200 {
			t.Fatalf("alpha's sandbox %d: %d %s", i, resp.StatusCode, b)
		}
	}
	resp, b := run("key-alpha-1", "a8", small)
	refused("alpha's ninth live sandbox", resp, b, "live sandboxes: 8 in use, 1 more asked, the limit is 8")

	if resp, b := run("key-beta-1", "m1", `{"memory":1024}`); resp.StatusCode != 200 {
		t.Fatalf("beta's first GiB: %d %s", resp.StatusCode, b)
	}
	resp, b = run("key-beta-1", "m2", `{"memory":1024}`)
	refused("beta's second GiB", resp, b, "sandbox memory (MiB): 1024 in use, 1024 more asked, the limit is 1536")

	for i := range 4 {
		if resp, b := run("key-gamma-1", fmt.Sprintf("c%d", i), `{"cpu":1,"memory":64}`); resp.StatusCode != 200 {
			t.Fatalf("gamma's core %d: %d %s", i, resp.StatusCode, b)
		}
	}
	resp, b = run("key-gamma-1", "c4", `{"cpu":1,"memory":64}`)
	refused("gamma's fifth core", resp, b, "sandbox CPU (cores): 4 in use, 1 more asked, the limit is 4")

	if resp, b := create("key-delta-1", "d1", `{"disk":6000}`); resp.StatusCode != 201 {
		t.Fatalf("delta's first disk: %d %s", resp.StatusCode, b)
	}
	resp, b = create("key-delta-1", "d2", `{"disk":6000}`)
	refused("delta's disk past the file system's", resp, b, "disk (MiB, the sum of its sessions' resources.disk): 6000 in use, 6000 more asked, the limit is 10240")

	// No session is promised more than the workspace file system holds.
	resp, b = create("key-delta-1", "huge", fmt.Sprintf(`{"disk":%d}`, fsMB+1))
	if resp.StatusCode != 400 || !strings.Contains(string(b), fmt.Sprintf("want 16..%d MiB", fsMB)) {
		t.Errorf("a session's disk past the workspace file system (%d MiB): %d %s, want 400", fsMB, resp.StatusCode, b)
	}
}
