package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/usage"
)

// metricsServer is a server whose /metrics has the per-tenant series of
// tenants alpha and beta (one sampled sandbox each), with keys and a
// metrics token as given.
func metricsServer(t *testing.T, token string, keySpecs ...string) http.Handler {
	t.Helper()
	keys, err := server.ParseKeys(keySpecs)
	if err != nil {
		t.Fatal(err)
	}
	mgr := session.New(session.Options{}) // never started
	t.Cleanup(mgr.Close)
	srv := server.New(server.Options{Sessions: mgr, Keys: keys, MetricsToken: token, Log: slog.New(slog.DiscardHandler)})
	rt := runtimetest.NewFake()
	for _, id := range []string{"sbx-a", "sbx-b"} {
		rt.Add(id)
		rt.SetStats(id, runtime.Stats{CPUNanos: 1e9, MemoryBytes: 1 << 20, PIDs: 2})
	}
	sampler := usage.New(usage.Config{Held: func() []session.SandboxRef {
		return []session.SandboxRef{
			{Tenant: "alpha", Session: "a", ID: "sbx-a", Runtime: rt, Volume: "t/nonexistent"},
			{Tenant: "beta", Session: "b", ID: "sbx-b", Runtime: rt, Volume: "t/nonexistent"},
		}
	}})
	t.Cleanup(sampler.Close)
	sampler.Pass(context.Background())
	srv.Metrics().RegisterUsage(sampler)
	return srv.Handler()
}

// scrape GETs /metrics with the header given (name, value), if any.
func scrape(t *testing.T, h http.Handler, header ...string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	r.Host = "127.0.0.1"
	if len(header) == 2 {
		r.Header.Set(header[0], header[1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}

// On a keyed server /metrics, which names every tenant, is the
// operator's: no key is 401, a tenant's key 403 (it does not even learn
// its own series), a wrong token 401; the metrics token reads every
// tenant's series.
func TestMetricsNeedToken(t *testing.T) {
	const token = "metrics-token-0123"
	h := metricsServer(t, token, "alpha-key-123:alpha", "beta-key-4567:beta")
	for _, c := range []struct {
		name   string
		header []string
		want   int
	}{
		{"no key", nil, http.StatusUnauthorized},
		{"alpha's key", []string{"Authorization", "Bearer alpha-key-123"}, http.StatusForbidden},
		{"alpha's key as X-API-Key", []string{"X-API-Key", "alpha-key-123"}, http.StatusForbidden},
		{"a wrong token", []string{"Authorization", "Bearer metrics-token-0124"}, http.StatusUnauthorized},
		{"another scheme", []string{"Authorization", "Basic " + token}, http.StatusUnauthorized},
	} {
		code, body := scrape(t, h, c.header...)
		if code != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.want)
		}
		if strings.Contains(body, "beta") || strings.Contains(body, "sbx_tenant") {
			t.Errorf("%s: the answer names a tenant: %s", c.name, body)
		}
	}
	code, body := scrape(t, h, "Authorization", "Bearer "+token)
	if code != http.StatusOK {
		t.Fatalf("the metrics token: %d %s", code, body)
	}
	for _, want := range []string{`sbx_tenant_sandboxes{tenant="alpha"} 1`, `sbx_tenant_sandboxes{tenant="beta"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("the metrics lack %s", want)
		}
	}

	// Keys without a token: no one reads it.
	h = metricsServer(t, "", "alpha-key-123:alpha")
	if code, body := scrape(t, h, "Authorization", "Bearer alpha-key-123"); code != http.StatusForbidden {
		t.Errorf("a key on a server without a metrics token: %d %s", code, body)
	}
	// No keys (loopback only): open; with a token, it is asked for.
	if code, body := scrape(t, metricsServer(t, "")); code != http.StatusOK || !strings.Contains(body, `tenant="beta"`) {
		t.Errorf("without keys: %d %s", code, body)
	}
	h = metricsServer(t, token)
	if code, _ := scrape(t, h); code != http.StatusUnauthorized {
		t.Errorf("a token without keys, none sent: %d", code)
	}
	if code, _ := scrape(t, h, "X-API-Key", token); code != http.StatusOK {
		t.Errorf("a token without keys, sent: %d", code)
	}
}

func TestCheckMetricsToken(t *testing.T) {
	keys, _ := server.ParseKeys([]string{"alpha-key-123:alpha"})
	for token, ok := range map[string]bool{"": true, "metrics-token-0123": true, "short": false, "has space 123": false, "alpha-key-123": false} {
		if err := server.CheckMetricsToken(token, keys); (err == nil) != ok {
			t.Errorf("token %q: %v", token, err)
		}
	}
}
