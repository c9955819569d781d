package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/console"
)

// TestConsoleRoutes: the server serves the console at /ui/ without
// a key, with the console's policy in place of the API's (whose sandbox
// would stop its scripts), while the API keeps its own and still wants a
// key; /ui redirects. Through the contract checker, so /ui is documented.
func TestConsoleRoutes(t *testing.T) {
	ts := start(t, "console-key-1:alpha")
	resp, _ := ts.do(t, "GET", "/ui", "", nil)
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("/ui: %d to %q, want 301 to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, path := range []string{"/ui/", "/ui/js/app.js", "/ui/app.css"} {
		resp, body := ts.do(t, "GET", path, "", nil)
		if resp.StatusCode != http.StatusOK || len(body) == 0 {
			t.Errorf("%s: %d, %d bytes", path, resp.StatusCode, len(body))
		}
		if got := resp.Header.Get("Content-Security-Policy"); got != console.Policy {
			t.Errorf("%s: Content-Security-Policy %q, want the console's", path, got)
		}
		if resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: headers %v", path, resp.Header)
		}
	}
	resp, _ = ts.do(t, "GET", "/ui/missing.js", "", nil)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/ui/missing.js: %d, want 404", resp.StatusCode)
	}
	resp, body := ts.do(t, "GET", "/api/v1/sessions", "", nil)
	if resp.StatusCode != http.StatusUnauthorized || errorCode(t, body) != "unauthenticated" {
		t.Errorf("the API without a key: %d %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("Content-Security-Policy"); !strings.HasPrefix(got, "sandbox;") {
		t.Errorf("the API's Content-Security-Policy: %q", got)
	}
}
