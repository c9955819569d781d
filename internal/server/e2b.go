package server

import (
	"net/http"
	"slices"

	"github.com/sbx-sandbox/sbx/internal/e2b"
)

// newE2B makes the E2B-compatible APIs (internal/e2b), which share the
// main API's listener, keys and tenants. An E2B key is any key the server
// was given (--api-key e2b_<40 hex>:TENANT works like any other key);
// without keys every request, whatever E2B_API_KEY it carries, is the
// default tenant's.
func (s *Server) newE2B() http.Handler {
	auth := e2b.Auth{DefaultTenant: DefaultTenant}
	if len(s.opt.Keys) > 0 {
		auth.Lookup = s.lookupKey
		auth.Tenants = func() []string {
			var ts []string
			for _, t := range s.opt.Keys {
				if !slices.Contains(ts, t) {
					ts = append(ts, t)
				}
			}
			return ts
		}
	}
	return e2b.New(e2b.Options{
		Sessions: s.opt.Sessions, Executions: s.opt.Executions, Auth: auth,
		SigningKey: s.opt.SigningKey, Log: s.log,
	})
}
