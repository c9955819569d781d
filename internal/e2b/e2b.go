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
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/errdefs/errhttp"
	"github.com/sbx-sandbox/sbx/internal/execution"
	"github.com/sbx-sandbox/sbx/internal/files"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/usage"
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

// Options configure a Handler.
type Options struct {
	Sessions   *session.Manager
	Executions *execution.Service
	Auth       Auth
	// Files is the file policy every file call goes through.
	Files *files.Service
	// Usage answers getMetrics from the sandboxes' samples.
	Usage *usage.Sampler
	// SigningKey makes the sandboxes' access and traffic tokens.
	SigningKey []byte
	// TokenTTL is how long an access token stays good; default
	// DefaultTokenTTL.
	TokenTTL time.Duration
	// Authenticated, if set, hears the tenant of each call as soon as it
	// is authenticated (the server puts it in its access log).
	Authenticated func(ctx context.Context, tenant string)
	// OpenStream, if set, counts a tenant's new stream (a command's or a
	// cell's output) against its cap, or refuses it (ErrResourceExhausted)
	// before anything runs; release uncounts it.
	OpenStream func(tenant string) (release func(), err error)
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
	now      func() time.Time // nil: time.Now
}

// New returns the handler.
func New(opt Options) *Handler {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.TokenTTL == 0 {
		opt.TokenTTL = DefaultTokenTTL
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

// ServeHTTP serves a request Matches accepted. Every request is
// authenticated here, before a handler reads its body or looks anything
// up: a control-plane call by its API key, an in-sandbox call by its
// sandbox's access token (see auth.go).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("E2b-Sandbox-Id")
	if id == "" {
		c, err := h.authAPI(r)
		if err != nil {
			h.writeErr(w, r, err)
			return
		}
		h.control.ServeHTTP(w, h.withCaller(r, c))
		return
	}
	port := r.Header.Get("E2b-Sandbox-Port")
	var mux *http.ServeMux
	switch port {
	case envdPort:
		mux = h.envd
	case interpreterPort:
		mux = h.interp
	default:
		// What E2B's proxy answers for a port nothing listens on.
		writeAPIError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: port %q: sbx serves only the envd (49983) and code interpreter (49999) ports", id, port))
		return
	}
	c, err := h.authSandbox(r, port)
	switch {
	case err == nil:
		mux.ServeHTTP(w, h.withCaller(r, c))
	case r.URL.Path == "/health" && errors.Is(err, errdefs.ErrNotFound):
		// What E2B's proxy answers for a sandbox that is not running
		// (the SDK's isRunning reads it).
		writeAPIError(w, http.StatusBadGateway, err.Error())
	case port == envdPort && r.URL.Path != "/files" && r.URL.Path != "/health":
		h.unaryError(w, r, err) // a Connect call
	default:
		h.writeErr(w, r, err)
	}
}

// openStream counts one of the tenant's streams (Options.OpenStream).
func (h *Handler) openStream(tenant string) (release func(), err error) {
	if h.opt.OpenStream == nil {
		return func() {}, nil
	}
	return h.opt.OpenStream(tenant)
}

// forget drops what the handler keeps of a deleted session.
func (h *Handler) forget(tenant, id string) {
	h.contexts.drop(tenant, id)
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

// apiStatus maps an error to the HTTP status of E2B's REST APIs: the
// same as sbx's own (errhttp).
func apiStatus(err error) int {
	status, _ := errhttp.ToHTTP(err)
	return status
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
