package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// GET /metrics names every tenant with its live usage (the sbx_tenant_*
// series), so on a server with API keys it is the operator's: it needs
// the metrics token (--metrics-token), which is no tenant's key. A
// tenant's key is refused with 403 rather than answered with its own
// series: the other series (sessions by status, requests, pools) are the
// whole server's, and a filtered view would be a second, half-private
// metrics API for no one who asked for it. Without keys (loopback only,
// one tenant) it stays open, unless a token is configured.

// CheckMetricsToken refuses a metrics token that is too weak to guard the
// tenants' names, or that is also an API key (its tenant could then read
// every other tenant's usage).
func CheckMetricsToken(token string, keys Keys) error {
	if token == "" {
		return nil
	}
	if len(token) < 8 || strings.ContainsAny(token, " \t\r\n,") {
		return fmt.Errorf("metrics token: at least 8 characters without spaces or commas")
	}
	if _, ok := keys[sha256.Sum256([]byte(token))]; ok {
		return fmt.Errorf("metrics token: it is also an API key; give /metrics a token of its own")
	}
	return nil
}

// serveMetrics: GET /metrics.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if err := s.metricsAccess(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.metricsHandler.ServeHTTP(w, r)
}

// metricsAccess checks the request's credential for /metrics. Digests are
// compared in constant time, as API keys are (lookupKey).
func (s *Server) metricsAccess(r *http.Request) error {
	if s.opt.MetricsToken == "" && len(s.opt.Keys) == 0 {
		return nil
	}
	key := requestKey(r)
	if key == "" {
		return fmt.Errorf("GET /metrics needs the server's metrics token (sbx serve --metrics-token): send Authorization: Bearer TOKEN: %w", errdefs.ErrUnauthenticated)
	}
	if s.opt.MetricsToken != "" {
		sum, want := sha256.Sum256([]byte(key)), sha256.Sum256([]byte(s.opt.MetricsToken))
		if subtle.ConstantTimeCompare(sum[:], want[:]) == 1 {
			return nil
		}
	}
	if _, ok := s.lookupKey(key); ok {
		return fmt.Errorf("GET /metrics: an API key does not read the server's metrics, which name every tenant; scrape with the metrics token (sbx serve --metrics-token): %w", errdefs.ErrPermissionDenied)
	}
	return fmt.Errorf("GET /metrics: invalid metrics token: %w", errdefs.ErrUnauthenticated)
}
