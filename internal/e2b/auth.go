package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/session"
)

// Who may do what. A control-plane call carries an API key, which names
// its tenant. An in-sandbox call carries no key, only what the control
// plane handed out with the sandbox: its access token (envdAccessToken,
// sent as X-Access-Token) and its traffic token (trafficAccessToken, sent
// as E2B-Traffic-Access-Token; the code interpreter SDKs send only this
// one with their context calls). A token names its tenant and is a MAC,
// under the server's signing key, of:
//
//   - its purpose (envd or traffic) and the sandbox id;
//   - the tenant, so the sandbox is looked up in that tenant only: no
//     call ever searches the tenants for an id;
//   - the session's created_at, so a token dies with its sandbox even if
//     a new one takes the id;
//   - its expiry (TokenTTL after a create or connect; the SDKs get a fresh
//     token from Sandbox.connect);
//   - the digest of the API key that asked for it, so removing a key from
//     the server's configuration revokes the tokens handed out under it.
//
// All of this is checked before a handler runs, so before any body is
// read.

// DefaultTokenTTL is how long an access token stays good by default.
const DefaultTokenTTL = 24 * time.Hour

// Token purposes: a token of one is not good as the other.
const (
	purposeEnvd    = "envd"
	purposeTraffic = "traffic"
)

// Auth is how requests are authenticated: the main API's keys.
type Auth struct {
	// Lookup returns the tenant of an API key and the key's SHA-256. Nil
	// means the server has no keys: every request is DefaultTenant's,
	// whatever key it carries.
	Lookup func(key string) (tenant string, digest [32]byte, ok bool)
	// Digests returns the SHA-256s of the keys the server has now for a
	// tenant. A token is good only while the key it was handed out under is
	// one of them.
	Digests func(tenant string) [][32]byte
	// DefaultTenant owns everything when there are no keys.
	DefaultTenant string
}

// caller is who a request comes from, as authentication found it.
type caller struct {
	tenant string
	// key is the digest of a control-plane call's API key (zero without
	// keys): the tokens it is handed are bound to it.
	key [32]byte
	// sandbox is the sandbox of an in-sandbox call.
	sandbox string
}

type callerKey struct{}

func (h *Handler) withCaller(r *http.Request, c caller) *http.Request {
	if h.opt.Authenticated != nil {
		h.opt.Authenticated(r.Context(), c.tenant)
	}
	return r.WithContext(context.WithValue(r.Context(), callerKey{}, c))
}

// callerOf is the caller ServeHTTP authenticated.
func callerOf(r *http.Request) (caller, bool) {
	c, ok := r.Context().Value(callerKey{}).(caller)
	return c, ok
}

// apiTenant is the tenant of an authenticated control-plane call.
func (h *Handler) apiTenant(r *http.Request) (string, error) {
	c, ok := callerOf(r)
	if !ok {
		return "", fmt.Errorf("the request was not authenticated: %w", errdefs.ErrUnauthenticated)
	}
	return c.tenant, nil
}

// sandboxTenant is the sandbox and tenant of an authenticated in-sandbox
// call.
func (h *Handler) sandboxTenant(r *http.Request) (id, tenant string, err error) {
	c, ok := callerOf(r)
	if !ok || c.sandbox == "" {
		return "", "", fmt.Errorf("the request was not authenticated: %w", errdefs.ErrUnauthenticated)
	}
	return c.sandbox, c.tenant, nil
}

// authAPI authenticates a control-plane call by its X-API-KEY (or
// Authorization: Bearer), with the main API's keys.
func (h *Handler) authAPI(r *http.Request) (caller, error) {
	a := h.opt.Auth
	if a.Lookup == nil {
		return caller{tenant: a.DefaultTenant}, nil
	}
	key := r.Header.Get("X-API-Key")
	if auth := r.Header.Get("Authorization"); key == "" && auth != "" {
		if scheme, rest, _ := strings.Cut(auth, " "); strings.EqualFold(scheme, "Bearer") {
			key = strings.TrimSpace(rest)
		}
	}
	if key == "" {
		return caller{}, fmt.Errorf("missing API key: set E2B_API_KEY to a key the sbx server was given: %w", errdefs.ErrUnauthenticated)
	}
	t, digest, ok := a.Lookup(key)
	if !ok {
		return caller{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	return caller{tenant: t, key: digest}, nil
}

// authSandbox authenticates an in-sandbox call: by its X-Access-Token, or
// on the interpreter's port by its E2B-Traffic-Access-Token. The token
// names the tenant; the sandbox is looked up there and nowhere else, and
// only once the token's MAC is good. Without keys a call may come without
// a token (it is the default tenant's).
func (h *Handler) authSandbox(r *http.Request, port string) (caller, error) {
	id := r.Header.Get("E2b-Sandbox-Id")
	tok, purpose := r.Header.Get("X-Access-Token"), purposeEnvd
	if tok == "" && port == interpreterPort {
		tok, purpose = r.Header.Get("E2B-Traffic-Access-Token"), purposeTraffic
	}
	c := caller{sandbox: id}
	var created int64
	switch {
	case tok != "":
		var err error
		if c.tenant, created, err = h.verifyToken(purpose, tok, id); err != nil {
			return caller{}, err
		}
	case h.opt.Auth.Lookup == nil:
		c.tenant = h.opt.Auth.DefaultTenant
	default:
		return caller{}, fmt.Errorf("sandbox %s: missing X-Access-Token (the envdAccessToken the server gave at create or connect): %w", id, errdefs.ErrUnauthenticated)
	}
	s, err := h.opt.Sessions.Get(r.Context(), c.tenant, id)
	if err != nil {
		return caller{}, err
	}
	if tok != "" && s.CreatedAt.UnixMicro() != created {
		return caller{}, fmt.Errorf("sandbox %s: the access token is of an earlier sandbox of this id: %w", id, errdefs.ErrUnauthenticated)
	}
	return c, nil
}

// accessTokens are the envdAccessToken and trafficAccessToken of a
// create or connect by c.
func (h *Handler) accessTokens(c caller, s *session.Session) (envd, traffic string) {
	return h.token(purposeEnvd, c, s), h.token(purposeTraffic, c, s)
}

// A token is TENANT "." EXPIRES "." CREATED "." MAC: its expiry in unix
// seconds, the session's created_at in unix microseconds (what the store
// keeps), and the MAC of all of them with the purpose, the sandbox id and
// the API key's digest.
func (h *Handler) token(purpose string, c caller, s *session.Session) string {
	exp := h.clock().Add(h.opt.TokenTTL).Unix()
	created := s.CreatedAt.UnixMicro()
	return c.tenant + "." + strconv.FormatInt(exp, 10) + "." + strconv.FormatInt(created, 10) + "." +
		h.tokenMAC(purpose, c.tenant, s.ID, exp, created, c.key)
}

func (h *Handler) tokenMAC(purpose, tenant, id string, exp, created int64, key [32]byte) string {
	m := hmac.New(sha256.New, h.opt.SigningKey)
	fmt.Fprintf(m, "sbx e2b %s token\x00%s\x00%s\x00%d\x00%d\x00", purpose, tenant, id, exp, created)
	m.Write(key[:])
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// verifyToken checks a token of purpose for sandbox id without reading
// the store: its MAC under one of its tenant's keys (the zero digest
// without keys), then its expiry. It returns the tenant and the session's
// created_at the token was made for.
func (h *Handler) verifyToken(purpose, tok, id string) (string, int64, error) {
	bad := fmt.Errorf("sandbox %s: the access token is not this sandbox's: %w", id, errdefs.ErrUnauthenticated)
	parts := strings.Split(tok, ".")
	if len(parts) != 4 {
		return "", 0, bad
	}
	tenant := parts[0]
	exp, err1 := strconv.ParseInt(parts[1], 10, 64)
	created, err2 := strconv.ParseInt(parts[2], 10, 64)
	if tenant == "" || err1 != nil || err2 != nil {
		return "", 0, bad
	}
	keys := [][32]byte{{}}
	if h.opt.Auth.Lookup != nil {
		keys = h.opt.Auth.Digests(tenant)
	}
	good := false
	for _, k := range keys {
		if hmac.Equal([]byte(parts[3]), []byte(h.tokenMAC(purpose, tenant, id, exp, created, k))) {
			good = true
		}
	}
	if !good {
		return "", 0, bad
	}
	if !h.clock().Before(time.Unix(exp, 0)) {
		return "", 0, fmt.Errorf("sandbox %s: the access token has expired: Sandbox.connect gets a fresh one: %w", id, errdefs.ErrUnauthenticated)
	}
	return tenant, created, nil
}

// clock is the time tokens are made and checked at (tests set now).
func (h *Handler) clock() time.Time {
	if h.now != nil {
		return h.now()
	}
	return time.Now()
}
