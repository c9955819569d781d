// Package server is the control plane's HTTP API (api/openapi.yaml): the
// handlers, one file per group of operations, and the edge concerns every
// request passes through: request ids and logs, authentication and
// tenancy, metrics, and the one place errors become HTTP statuses
// (errors.go).
package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/chat"
	"github.com/sbx-sandbox/sbx/internal/console"
	"github.com/sbx-sandbox/sbx/internal/e2b"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/execution"
	"github.com/sbx-sandbox/sbx/internal/files"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/template/registry"
	"github.com/sbx-sandbox/sbx/internal/usage"
	"github.com/sbx-sandbox/sbx/internal/webhook"
)

// Options configure a Server.
type Options struct {
	Store      store.Store
	Sessions   *session.Manager
	Executions *execution.Service
	Blobs      blob.Store
	// Files is the file policy every front door's file call goes
	// through: REST, the tools (and so MCP and chat), E2B.
	Files *files.Service
	// Objects keeps the content of session resources and the
	// copies behind presigned URLs: objects in the tenants' chunk
	// areas of the snapshot store, which its one collector frees.
	Objects *snapshot.Store
	// Templates are the tenants' templates.
	Templates *registry.Registry
	// Usage samples the sandboxes this process holds: the
	// sessions' metrics and E2B's getMetrics. Nil: neither is available.
	Usage *usage.Sampler
	// Limits are the tenant's limits (session.Limits): the server keeps
	// Streams, Chats and ChatTokens. Nil: no bound.
	Limits func(tenant string) session.Limits
	// Keys maps API keys to tenants; empty means no authentication (every
	// request is tenant "default"; the caller binds loopback only).
	Keys Keys
	// SigningKey signs presigned download URLs and E2B access tokens.
	SigningKey []byte
	// E2BTokenTTL is how long an E2B access token stays good (0: 24h).
	E2BTokenTTL time.Duration
	// PresignMaxBytes is the largest file a presigned URL is made for
	// (0: DefaultPresignMaxBytes): a presign reads and hashes all of it.
	PresignMaxBytes int64
	Metrics         *Metrics
	// MetricsToken is the credential GET /metrics asks for (metrics_auth.go);
	// "" with Keys: no one reads /metrics.
	MetricsToken string
	Log          *slog.Logger
	// Version is the server's version, as the MCP server tells clients.
	Version string
	// Ready reports whether the server can take work (for /readyz): each
	// check's name and nil or what is wrong.
	Ready func() map[string]error
	// Edge bounds how slowly clients may send; zero fields take the
	// defaults (EdgeLimits).
	Edge EdgeLimits
	// Chat is the chat loop; nil when no model endpoint is
	// configured (POST /agents/{id}/chat is then 503).
	Chat *chat.Chat
	// Events wakes event streams when this process records an event;
	// EventPoll is how often they look for other replicas' (default
	// DefaultEventPoll). Webhooks keeps the tenants' webhooks.
	Events    *events.Log
	EventPoll time.Duration
	Webhooks  *webhook.Service
}

// Server serves the API.
type Server struct {
	opt Options
	log *slog.Logger
	mux *http.ServeMux
	e2b http.Handler // the E2B-compatible APIs (e2b.go)
	// metricsHandler writes the Prometheus text of opt.Metrics.
	metricsHandler http.Handler
	// shutdown is closed when the HTTP server shuts down: streams that
	// would go on for ever end then.
	shutdown     chan struct{}
	shutdownOnce sync.Once

	// streams counts each tenant's open streams of each kind (streams.go).
	streamsMu sync.Mutex
	streams   map[streamKey]int
	// budgets are the tenants' chat tokens (chatbudget.go).
	budgets chatBudgets

	// syncLocks serialize each session's resource syncs (resources.go).
	syncLocks syncLocks
}

// New returns the server; Handler is what to serve.
func New(opt Options) *Server {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.Metrics == nil {
		opt.Metrics = NewMetrics(opt.Store, opt.Sessions)
	}
	opt.Edge = opt.Edge.withDefaults()
	if opt.EventPoll <= 0 {
		opt.EventPoll = DefaultEventPoll
	}
	s := &Server{opt: opt, log: opt.Log, mux: http.NewServeMux(), shutdown: make(chan struct{}), streams: map[streamKey]int{}}
	s.metricsHandler = opt.Metrics.Handler()
	s.budgets = chatBudgets{buckets: map[string]*bucket{}, now: time.Now}
	s.routes()
	s.e2b = s.newE2B()
	return s
}

// Metrics returns the server's metrics (for the execution and session
// layers' hooks).
func (s *Server) Metrics() *Metrics { return s.opt.Metrics }

func (s *Server) routes() {
	p := api.Prefix
	// Operations: one handler each, in the files named after them.
	s.handle("POST "+p+"/sessions", s.createSession)
	s.handle("GET "+p+"/sessions", s.listSessions)
	s.handle("GET "+p+"/sessions/{session_id}", s.getSession)
	s.handle("DELETE "+p+"/sessions/{session_id}", s.deleteSession)
	s.handle("POST "+p+"/sessions/{session_id}/pause", s.pauseSession)
	s.handle("POST "+p+"/sessions/{session_id}/resume", s.resumeSession)
	s.handle("POST "+p+"/sessions/{session_id}/keepalive", s.keepalive)
	s.handle("POST "+p+"/sessions/{session_id}/hibernate", s.hibernateSession)
	s.handle("POST "+p+"/sessions/{session_id}/snapshots", s.createSnapshot)
	s.handle("GET "+p+"/sessions/{session_id}/snapshots", s.listSnapshots)
	s.handle("GET "+p+"/sessions/{session_id}/snapshots/{snapshot_id}", s.getSnapshot)
	s.handle("DELETE "+p+"/sessions/{session_id}/snapshots/{snapshot_id}", s.deleteSnapshot)
	s.handle("POST "+p+"/sessions/{session_id}/snapshots/{snapshot_id}/restore", s.restoreSnapshot)
	s.handle("GET "+p+"/sessions/{session_id}/metrics", s.getSessionMetrics)
	s.handle("POST "+p+"/sessions/{session_id}/execute", s.execute)
	s.handle("GET "+p+"/sessions/{session_id}/executions", s.listExecutions)
	s.handle("GET "+p+"/executions/{execution_id}", s.getExecution)
	s.handle("GET "+p+"/executions/{execution_id}/result", s.getResult)
	s.handle("POST "+p+"/executions/{execution_id}/cancel", s.cancelExecution)
	s.handle("POST "+p+"/sessions/{session_id}/files/upload", s.upload)
	s.handle("GET "+p+"/sessions/{session_id}/files", s.listFiles)
	s.handle("GET "+p+"/sessions/{session_id}/files/{path...}", s.download)
	s.handle("DELETE "+p+"/sessions/{session_id}/files/{path...}", s.deleteFile)
	s.handle("DELETE "+p+"/sessions/{session_id}/conversations/{conversation_id}", s.deleteConversation)
	s.handle("PUT "+p+"/sessions/{session_id}/resources", s.syncResources)
	s.handle("GET "+p+"/sessions/{session_id}/resources", s.listResources)
	s.handle("PUT "+p+"/resources/{sha256}", s.putContent)
	s.handle("POST "+p+"/agents/{agent_id}/execute", s.agentExecute)
	s.handle("POST "+p+"/agents/{agent_id}/files/upload", s.agentUpload)
	s.handle("GET "+p+"/agents/{agent_id}/files", s.agentListFiles)
	s.handle("GET "+p+"/agents/{agent_id}/files/{path...}", s.agentDownload)
	s.handle("GET "+p+"/templates", s.needTemplates(s.listTemplates))
	s.handle("POST "+p+"/templates", s.needTemplates(s.createTemplate))
	s.handle("GET "+p+"/templates/{name}", s.needTemplates(s.getTemplate))
	s.handle("DELETE "+p+"/templates/{name}", s.needTemplates(s.deleteTemplate))
	s.handle("GET "+p+"/templates/{name}/builds/{build_id}/logs", s.needTemplates(s.templateBuildLogs))
	s.handle("POST "+p+"/templates/{name}/builds/{build_id}/cancel", s.needTemplates(s.cancelTemplateBuild))
	s.handle("POST "+p+"/agents/{agent_id}/chat", s.agentChat)
	s.handle("DELETE "+p+"/agents/{agent_id}/conversations/{conversation_id}", s.agentDeleteConversation)
	s.handle("GET "+p+"/tools", s.listTools)
	s.handle("POST "+p+"/tools/{name}/invoke", s.invokeTool)
	s.handle("/mcp", s.serveMCP)
	s.handle("GET "+p+"/events", s.listEvents)
	s.handle("GET "+p+"/sessions/{session_id}/events", s.sessionEvents)
	s.handle("POST "+p+"/webhooks", s.createWebhook)
	s.handle("GET "+p+"/webhooks", s.listWebhooks)
	s.handle("GET "+p+"/webhooks/{webhook_id}", s.getWebhook)
	s.handle("DELETE "+p+"/webhooks/{webhook_id}", s.deleteWebhook)
	s.handle("GET "+p+"/webhooks/{webhook_id}/deliveries", s.webhookDeliveries)
	s.mux.HandleFunc("GET "+p+"/presigned/{ns}/{blob}/{name}", s.presigned)
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET /metrics", s.serveMetrics)
	// The web console: public static files; every call the page
	// makes goes to the API above with the key the user gives it.
	s.mux.Handle("GET /ui", http.RedirectHandler(console.Prefix, http.StatusMovedPermanently))
	s.mux.Handle("GET "+console.Prefix, console.Handler())
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, fmt.Errorf("no endpoint %s %s (see api/openapi.yaml): %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
	})
}

// handle registers an operation that needs a tenant.
func (s *Server) handle(pattern string, h http.HandlerFunc) {
	s.mux.Handle(pattern, s.authenticate(h))
}

// Handler is the whole API with its middleware.
func (s *Server) Handler() http.Handler {
	return s.observe(s.recoverPanics(s.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e2b.Matches(r) {
			s.e2b.ServeHTTP(w, r)
			return
		}
		s.mux.ServeHTTP(w, r)
		if ri, ok := r.Context().Value(reqInfoKey{}).(*reqInfo); ok {
			ri.route = r.Pattern
		}
	}))))
}

// decodeJSON reads a JSON object into v: sent as application/json, at
// most limit bytes (a larger Content-Length is refused before a byte is
// read), no unknown fields, nothing after it. An empty body is an empty
// object when optional.
func decodeJSON(r *http.Request, v any, limit int64, optional bool) error {
	empty, err := checkJSONType(r)
	if err != nil {
		return err
	}
	tooLarge := withStatus(http.StatusRequestEntityTooLarge, "payload_too_large",
		fmt.Errorf("request body is larger than %d bytes", limit))
	if r.ContentLength > limit {
		return tooLarge
	}
	body := io.Reader(http.NoBody)
	if !empty {
		body = http.MaxBytesReader(nil, r.Body, limit)
	}
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if err == io.EOF && optional {
			return nil
		}
		var mbe *http.MaxBytesError
		var se *statusError
		switch {
		case errors.As(err, &mbe):
			return tooLarge
		case errors.As(err, &se):
			return err // the body came too slowly
		}
		if err == io.EOF {
			return fmt.Errorf("request body is empty; want a JSON object: %w", errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if dec.More() {
		return fmt.Errorf("request body: data after the JSON object: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// since is a time for logs.
func since(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }
