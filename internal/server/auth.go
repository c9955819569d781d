package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// DefaultTenant owns everything when no API keys are configured, and the
// sessions of keys given without a tenant.
const DefaultTenant = "default"

// Keys maps the SHA-256 of each API key to its tenant.
type Keys map[[32]byte]string

var tenantPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// ParseKeys reads API keys given as KEY or KEY:TENANT (from --api-key, or
// comma-separated from SBX_API_KEYS).
func ParseKeys(specs []string) (Keys, error) {
	keys := Keys{}
	for _, spec := range specs {
		spec = strings.TrimSpace(spec)
		if spec == "" {
			continue
		}
		key, tenant, ok := strings.Cut(spec, ":")
		if !ok {
			tenant = DefaultTenant
		}
		if len(key) < 8 || strings.ContainsAny(key, " \t\r\n,") {
			return nil, fmt.Errorf("API key %q...: keys are at least 8 characters without spaces or commas", key[:min(len(key), 4)])
		}
		if !tenantPattern.MatchString(tenant) {
			return nil, fmt.Errorf("API key %q...: tenant %q: want 1-64 characters of [A-Za-z0-9_-]", key[:4], tenant)
		}
		keys[sha256.Sum256([]byte(key))] = tenant
	}
	return keys, nil
}

type tenantKey struct{}

// tenant is the tenant the request acts for.
func tenant(r *http.Request) string { return tenantOf(r.Context()) }

// tenantOf is the tenant a request's context acts for.
func tenantOf(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

// authenticate finds the request's tenant from its API key, given as
// "Authorization: Bearer KEY" or "X-API-Key: KEY".
func (s *Server) authenticate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := DefaultTenant
		if len(s.opt.Keys) > 0 {
			key := requestKey(r)
			var ok bool
			t, ok = s.lookupKey(key)
			if !ok {
				msg := "missing API key: send Authorization: Bearer KEY or X-API-Key: KEY"
				if key != "" {
					msg = "invalid API key"
				}
				s.writeError(w, r, fmt.Errorf("%s: %w", msg, errdefs.ErrUnauthenticated))
				return
			}
		}
		setLogTenant(r.Context(), t)
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, t)))
	})
}

// requestKey is the key a request carries: "X-API-Key: KEY", else
// "Authorization: Bearer KEY".
func requestKey(r *http.Request) string {
	key := r.Header.Get("X-API-Key")
	if auth := r.Header.Get("Authorization"); key == "" && auth != "" {
		scheme, rest, _ := strings.Cut(auth, " ")
		if strings.EqualFold(scheme, "Bearer") {
			key = strings.TrimSpace(rest)
		}
	}
	return key
}

// lookupKey compares digests, so the time taken says nothing about how
// much of a key was right.
func (s *Server) lookupKey(key string) (string, bool) {
	if key == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(key))
	for k, t := range s.opt.Keys {
		if subtle.ConstantTimeCompare(k[:], sum[:]) == 1 {
			return t, true
		}
	}
	return "", false
}
