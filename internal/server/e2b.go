package server

import (
	"crypto/sha256"
	"net/http"

	"github.com/sbx-sandbox/sbx/internal/e2b"
)

// newE2B makes the E2B-compatible APIs (internal/e2b), which share the
// main API's listener, keys and tenants. An E2B key is any key the server
// was given (--api-key e2b_<40 hex>:TENANT works like any other key);
// without keys every request, whatever E2B_API_KEY it carries, is the
// default tenant's. The sandboxes' access tokens are bound to the key
// they were handed out under, so they die with it.
func (s *Server) newE2B() http.Handler {
	auth := e2b.Auth{DefaultTenant: DefaultTenant}
	if len(s.opt.Keys) > 0 {
		auth.Lookup = func(key string) (string, [32]byte, bool) {
			t, ok := s.lookupKey(key)
			if !ok {
				return "", [32]byte{}, false
			}
			return t, sha256.Sum256([]byte(key)), true
		}
		auth.Digests = func(tenant string) [][32]byte {
			var ds [][32]byte
			for d, t := range s.opt.Keys {
				if t == tenant {
					ds = append(ds, d)
				}
			}
			return ds
		}
	}
	return e2b.New(e2b.Options{
		Sessions: s.opt.Sessions, Executions: s.opt.Executions, Files: s.opt.Files, Usage: s.opt.Usage, Auth: auth,
		SigningKey: s.opt.SigningKey, TokenTTL: s.opt.E2BTokenTTL, Authenticated: setLogTenant, Log: s.log,
		OpenStream: func(tenant string) (func(), error) { return s.openStream(tenant, e2bStreams) },
	})
}
