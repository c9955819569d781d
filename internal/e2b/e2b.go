// Package e2b lets the unmodified E2B SDKs (npm e2b and
// @e2b/code-interpreter) use sbx: it speaks E2B's control-plane API, the
// in-sandbox daemon's Connect API (envd: processes and files) and the code
// interpreter's HTTP API, and maps all of them onto what sbx already has.
// An E2B sandbox is an sbx session (visible through both APIs), a command
// is a bash execution, a code cell a Python execution in a stateful
// context, and a file call a workspace operation. docs/e2b.md is the user's
// side of it.
//
// The SDKs reach one base URL for everything when E2B_SANDBOX_URL is set;
// in-sandbox requests then name the sandbox in the E2b-Sandbox-Id header
// and the daemon in E2b-Sandbox-Port (49983 envd, 49999 the interpreter).
// Matches says which requests are this package's.
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/sbx-sandbox/sbx/internal/errdefs"
	"github.com/sbx-sandbox/sbx/internal/execution"
	"github.com/sbx-sandbox/sbx/internal/session"
)

// Ports the SDKs name in E2b-Sandbox-Port.
const (
	envdPort        = "49983"
	interpreterPort = "49999"
)

// envdVersion is the daemon version sbx claims. The SDKs switch features
// on it: 0.5.7 turns on streamed (octet-stream) uploads; file metadata
// (0.6.2) and watch events with entries (0.6.3), which sbx lacks, stay
// off, so the SDK itself says they need a newer template.
const envdVersion = "0.5.7"

// Auth is how requests are authenticated: the main API's keys.
type Auth struct {
	// Lookup returns the tenant of an API key. Nil means the server has no
	// keys: every request is DefaultTenant's, whatever key it carries.
	Lookup func(key string) (tenant string, ok bool)
	// Tenants lists the tenants keys map to (for the in-sandbox calls the
	// SDK sends without a token, see tenantOf).
	Tenants func() []string
	// DefaultTenant owns everything when there are no keys.
	DefaultTenant string
}

// Options configure a Handler.
type Options struct {
	Sessions   *session.Manager
	Executions *execution.Service
	Auth       Auth
	// SigningKey makes the sandboxes' access tokens (envdAccessToken).
	SigningKey []byte
	Log        *slog.Logger
}

// Handler serves the E2B APIs.
type Handler struct {
	opt      Options
	log      *slog.Logger
	control  *http.ServeMux
	envd     *http.ServeMux
	interp   *http.ServeMux
	procs    *processTable
	contexts *contextTable
}

// New returns the handler.
func New(opt Options) *Handler {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	h := &Handler{opt: opt, log: opt.Log, procs: newProcessTable(), contexts: newContextTable()}
	h.control = http.NewServeMux()
	h.controlRoutes()
	h.envd = http.NewServeMux()
	h.envdRoutes()
	h.interp = http.NewServeMux()
	h.interpreterRoutes()
	opt.Sessions.OnDelete(h.forget)
	return h
}

// Matches reports whether r is an E2B request: an in-sandbox call (it
// names a sandbox in E2b-Sandbox-Id) or a control-plane call under
// /sandboxes or /v2/sandboxes. The main API has neither.
func Matches(r *http.Request) bool {
	if r.Header.Get("E2b-Sandbox-Id") != "" {
		return true
	}
	p := r.URL.Path
	for _, prefix := range []string{"/sandboxes", "/v2/sandboxes"} {
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			return true
		}
	}
	return false
}

// ServeHTTP serves a request Matches accepted.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("E2b-Sandbox-Id")
	if id == "" {
		h.control.ServeHTTP(w, r)
		return
	}
	switch port := r.Header.Get("E2b-Sandbox-Port"); port {
	case envdPort:
		h.envd.ServeHTTP(w, r)
	case interpreterPort:
		h.interp.ServeHTTP(w, r)
	default:
		// What E2B's proxy answers for a port nothing listens on.
		writeAPIError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: port %q: sbx serves only the envd (49983) and code interpreter (49999) ports", id, port))
	}
}

// forget drops what the handler keeps of a deleted session.
func (h *Handler) forget(tenant, id string) {
	h.contexts.drop(tenant, id)
}

var errUnauthenticated = errors.New("unauthenticated")

// apiTenant authenticates a control-plane request by its X-API-KEY (or
// Authorization: Bearer), with the main API's keys.
func (h *Handler) apiTenant(r *http.Request) (string, error) {
	a := h.opt.Auth
	if a.Lookup == nil {
		return a.DefaultTenant, nil
	}
	key := r.Header.Get("X-API-Key")
	if auth := r.Header.Get("Authorization"); key == "" && auth != "" {
		if scheme, rest, _ := strings.Cut(auth, " "); strings.EqualFold(scheme, "Bearer") {
			key = strings.TrimSpace(rest)
		}
	}
	if key == "" {
		return "", fmt.Errorf("missing API key: set E2B_API_KEY to a key the sbx server was given: %w", errUnauthenticated)
	}
	t, ok := a.Lookup(key)
	if !ok {
		return "", fmt.Errorf("invalid API key: %w", errUnauthenticated)
	}
	return t, nil
}

// accessToken is a sandbox's envdAccessToken: its tenant and a MAC of the
// tenant and the sandbox id under the server's signing key. In-sandbox
// calls carry no API key, only this token, so it says whose sandbox it is.
func (h *Handler) accessToken(tenant, sandboxID string) string {
	return tenant + "." + h.mac(tenant, sandboxID)
}

func (h *Handler) mac(tenant, sandboxID string) string {
	m := hmac.New(sha256.New, h.opt.SigningKey)
	m.Write([]byte("sbx e2b envd access\x00" + tenant + "\x00" + sandboxID))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// sandboxTenant authenticates an in-sandbox request: the sandbox id and
// the tenant that owns it. A request with an X-Access-Token must carry
// the sandbox's token. Without one (the code interpreter's context calls
// send none): with no API keys it is the default tenant's; with keys only
// tokenless calls may go without (their harm is bounded: contexts, never
// code), and the sandbox is looked up among the keys' tenants.
func (h *Handler) sandboxTenant(r *http.Request, tokenless bool) (string, string, error) {
	id := r.Header.Get("E2b-Sandbox-Id")
	if !session.ValidID(id) {
		return "", "", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if tok := r.Header.Get("X-Access-Token"); tok != "" {
		tenant, sum, ok := strings.Cut(tok, ".")
		if !ok || !hmac.Equal([]byte(sum), []byte(h.mac(tenant, id))) {
			return "", "", fmt.Errorf("sandbox %s: the access token is not this sandbox's: %w", id, errUnauthenticated)
		}
		return id, tenant, nil
	}
	a := h.opt.Auth
	if a.Lookup == nil {
		return id, a.DefaultTenant, nil
	}
	if !tokenless {
		return "", "", fmt.Errorf("sandbox %s: missing X-Access-Token (the envdAccessToken the server gave at create or connect): %w", id, errUnauthenticated)
	}
	for _, t := range a.Tenants() {
		if _, err := h.opt.Sessions.Get(r.Context(), t, id); err == nil {
			return id, t, nil
		}
	}
	return "", "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

// live returns the session of an in-sandbox call if it can take work: a
// terminated one is gone (E2B: the sandbox is not found).
func (h *Handler) live(ctx context.Context, tenant, id string) (*session.Session, error) {
	s, err := h.opt.Sessions.Get(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if s.Status == "terminated" {
		return nil, fmt.Errorf("sandbox %s was killed or timed out: %w", id, errdefs.ErrNotFound)
	}
	return s, nil
}

// apiStatus maps an error to the HTTP status of E2B's REST APIs.
func apiStatus(err error) int {
	switch {
	case errors.Is(err, errUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusTooManyRequests
	case errors.Is(err, errdefs.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// writeErr answers a REST call (control plane, /files, the interpreter)
// with E2B's error shape, {"code": status, "message"}. Internal errors are
// logged and not shown.
func (h *Handler) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	code := apiStatus(err)
	msg := err.Error()
	if code == http.StatusInternalServerError {
		h.log.Error("e2b: internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error (the server log has the details)"
	}
	if code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "5")
	}
	writeAPIError(w, code, msg)
}

func writeAPIError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"code": code, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// unaryError logs an internal error of a Connect call and hides it.
func (h *Handler) unaryError(w http.ResponseWriter, r *http.Request, err error) {
	writeUnaryError(w, h.hide(r, err))
}

func (h *Handler) hide(r *http.Request, err error) error {
	if connectCode(err) == "internal" {
		h.log.Error("e2b: internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		return &rpcError{Code: "internal", Message: "internal error (the server log has the details)"}
	}
	return err
}
