package e2b

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// templates maps E2B's template names to sbx's; any other name is taken
// as an sbx template name.
var templates = map[string]string{
	"base":                "python",
	"code-interpreter-v1": "python-datascience",
	"code-interpreter":    "python-datascience",
}

// metaTemplate is the metadata key that remembers the template name the
// E2B client asked for (shown back as templateID, hidden from metadata).
const metaTemplate = "e2b.template"

// defaultTimeout is E2B's default sandbox lifetime (seconds).
const defaultTimeout = 300

func (h *Handler) controlRoutes() {
	m := h.control
	for _, p := range []string{"/sandboxes", "/v2/sandboxes"} {
		m.HandleFunc("POST "+p, h.createSandbox)
		m.HandleFunc("GET "+p, h.listSandboxes)
		m.HandleFunc("GET "+p+"/{id}", h.getSandbox)
		m.HandleFunc("DELETE "+p+"/{id}", h.killSandbox)
		m.HandleFunc("POST "+p+"/{id}/timeout", h.setTimeout)
		m.HandleFunc("POST "+p+"/{id}/refreshes", h.refresh)
		m.HandleFunc("POST "+p+"/{id}/pause", h.pauseSandbox)
		m.HandleFunc("POST "+p+"/{id}/resume", h.connectSandbox)
		m.HandleFunc("POST "+p+"/{id}/connect", h.connectSandbox)
	}
	m.HandleFunc("GET /sandboxes/{id}/metrics", h.sandboxMetrics) // not under /v2 in E2B either
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, http.StatusNotFound, fmt.Sprintf("no E2B endpoint %s %s in sbx (docs/e2b.md lists what is supported)", r.Method, r.URL.Path))
	})
}

// createRequest is E2B's NewSandbox. Fields sbx cannot honour are decoded
// so that they can be refused with a reason rather than ignored.
type createRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *float64          `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AutoPause           *bool             `json:"autoPause"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	MCP                 json.RawMessage   `json:"mcp"`
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
}

// e2bFields names session.CreateRequest's fields as E2B's create body
// does, for the domain's errors.
var e2bFields = map[string]string{
	"Template": "templateID", "TTL": "timeout", "Env": "envVars", "Metadata": "metadata",
}

// session translates E2B's create body into the domain's request, and
// refuses what sbx cannot honour: a new session, with an E2B-like id,
// whose sandbox starts at once.
func (req *createRequest) session() (session.CreateRequest, error) {
	switch {
	case req.AllowInternetAccess != nil && *req.AllowInternetAccess:
		return session.CreateRequest{}, invalid("allow_internet_access: sbx sandboxes have no network (loopback only)")
	case len(req.MCP) > 0 && string(req.MCP) != "null":
		return session.CreateRequest{}, invalid("mcp: the MCP gateway is not supported by sbx")
	case len(req.VolumeMounts) > 0 && string(req.VolumeMounts) != "null":
		return session.CreateRequest{}, invalid("volumeMounts: volumes are not supported by sbx")
	case req.AutoPause != nil && *req.AutoPause:
		return session.CreateRequest{}, invalid("autoPause: sbx terminates a session at its timeout (it pauses idle sandboxes on its own, see docs/e2b.md)")
	}
	timeout, err := seconds(req.Timeout, defaultTimeout)
	if err != nil {
		return session.CreateRequest{}, err
	}
	name := req.TemplateID
	if name == "" {
		name = "base"
	}
	tmpl, ok := templates[name]
	if !ok {
		tmpl = name
	}
	if _, hidden := req.Metadata[metaTemplate]; hidden {
		return session.CreateRequest{}, invalid("metadata: the key %q is sbx's own", metaTemplate)
	}
	meta := maps.Clone(req.Metadata)
	if meta == nil {
		meta = map[string]string{}
	}
	meta[metaTemplate] = name
	return session.CreateRequest{
		ID: newSandboxID(), Template: tmpl, TTL: time.Duration(timeout) * time.Second, WarmUp: true,
		Env: req.EnvVars, Metadata: meta,
	}, nil
}

// sandboxJSON is E2B's Sandbox / SandboxDetail / ListedSandbox in one:
// the SDKs read the fields they know.
type sandboxJSON struct {
	SandboxID          string            `json:"sandboxID"`
	TemplateID         string            `json:"templateID"`
	Alias              string            `json:"alias,omitempty"`
	ClientID           string            `json:"clientID"`
	EnvdVersion        string            `json:"envdVersion"`
	EnvdAccessToken    string            `json:"envdAccessToken,omitempty"`
	Domain             *string           `json:"domain"`
	TrafficAccessToken *string           `json:"trafficAccessToken"`
	StartedAt          *time.Time        `json:"startedAt,omitempty"`
	EndAt              *time.Time        `json:"endAt,omitempty"`
	CPUCount           *int              `json:"cpuCount,omitempty"`
	MemoryMB           *int64            `json:"memoryMB,omitempty"`
	DiskSizeMB         *int64            `json:"diskSizeMB,omitempty"`
	Metadata           map[string]string `json:"metadata,omitempty"`
	State              string            `json:"state,omitempty"`
}

const maxBody = 1 << 20

func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("reading the request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(b) > maxBody {
		return fmt.Errorf("request body larger than %d bytes: %w", maxBody, errdefs.ErrInvalidArgument)
	}
	if strings.TrimSpace(string(b)) == "" {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// seconds checks an E2B timeout in seconds.
func seconds(v *float64, def int64) (int64, error) {
	if v == nil {
		return def, nil
	}
	max := int64(session.MaxTTL / time.Second)
	if math.IsNaN(*v) || *v < 1 || *v > float64(max) {
		return 0, invalid("timeout %v: want 1..%d seconds", *v, max)
	}
	return int64(math.Ceil(*v)), nil
}

// createSandbox: POST [/v2]/sandboxes. A new sbx session whose sandbox
// starts at once (E2B's create returns a running sandbox).
func (h *Handler) createSandbox(w http.ResponseWriter, r *http.Request) {
	c, ok := callerOf(r)
	if !ok {
		h.writeErr(w, r, fmt.Errorf("the request was not authenticated: %w", errdefs.ErrUnauthenticated))
		return
	}
	tenant := c.tenant
	var req createRequest
	err := decodeBody(r, &req)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	sreq, err := req.session()
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	sess, _, err := h.opt.Sessions.Create(r.Context(), tenant, sreq)
	if err != nil {
		h.writeErr(w, r, session.RenameField(err, e2bFields))
		return
	}
	writeJSON(w, http.StatusCreated, h.sandboxJSON(r.Context(), c, sess, false))
}

// newSandboxID makes an id like E2B's: "i" and 19 lowercase letters and
// digits drawn uniformly (about 98 bits), unguessable: it is what
// in-sandbox calls name.
func newSandboxID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	id := []byte{'i'}
	b := make([]byte, 1)
	for len(id) < 20 {
		rand.Read(b)
		if int(b[0]) < 256/len(alphabet)*len(alphabet) { // no modulo bias
			id = append(id, alphabet[int(b[0])%len(alphabet)])
		}
	}
	return string(id)
}

// sandboxJSON describes a session as E2B does: for a create or connect
// by c, with the sandbox's tokens; with detail, without them and with
// what GET /sandboxes/{id} and the list give.
func (h *Handler) sandboxJSON(ctx context.Context, c caller, s *session.Session, detail bool) sandboxJSON {
	tmpl := s.Metadata[metaTemplate]
	if tmpl == "" {
		tmpl = s.TemplateID
	}
	out := sandboxJSON{
		SandboxID: s.ID, TemplateID: tmpl, Alias: tmpl, ClientID: "sbx", EnvdVersion: envdVersion,
	}
	if !detail {
		// E2B hands out a traffic token only for sandboxes closed to
		// public traffic; sbx always does, so that the code interpreter
		// SDKs send a credential with their context calls too.
		envd, traffic := h.accessTokens(c, s)
		out.EnvdAccessToken, out.TrafficAccessToken = envd, &traffic
		return out
	}
	started, end := s.CreatedAt, s.ExpiresAt
	out.StartedAt, out.EndAt = &started, &end
	cpu, mem, disk := 1, int64(512), int64(0)
	if spec, err := h.opt.Sessions.Template(ctx, s.Tenant, s.TemplateID); err == nil {
		if spec.Resources.CPU > 0 {
			cpu = int(math.Ceil(spec.Resources.CPU))
		}
		if spec.Resources.MemoryMB > 0 {
			mem = spec.Resources.MemoryMB
		}
		disk = spec.Resources.DiskMB
	}
	if c := s.Config.Resources; c.CPU > 0 || c.MemoryMB > 0 || c.DiskMB > 0 {
		if c.CPU > 0 {
			cpu = int(math.Ceil(c.CPU))
		}
		if c.MemoryMB > 0 {
			mem = c.MemoryMB
		}
		if c.DiskMB > 0 {
			disk = c.DiskMB
		}
	}
	out.CPUCount, out.MemoryMB, out.DiskSizeMB = &cpu, &mem, &disk
	out.Metadata = map[string]string{}
	for k, v := range s.Metadata {
		if k != metaTemplate {
			out.Metadata[k] = v
		}
	}
	out.State = "running"
	if s.Status == api.StatusPaused || s.Status == api.StatusHibernated {
		out.State = "paused"
	}
	return out
}

// session returns the tenant's live session of the path's id; a
// terminated one is not found, as a killed E2B sandbox is.
func (h *Handler) session(r *http.Request) (string, *session.Session, error) {
	tenant, err := h.apiTenant(r)
	if err != nil {
		return "", nil, err
	}
	s, err := h.live(r.Context(), tenant, r.PathValue("id"))
	return tenant, s, err
}

// getSandbox: GET /sandboxes/{id}.
func (h *Handler) getSandbox(w http.ResponseWriter, r *http.Request) {
	tenant, s, err := h.session(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, h.sandboxJSON(r.Context(), caller{tenant: tenant}, s, true))
}

// killSandbox: DELETE /sandboxes/{id}: the session is deleted, workspace
// and all. 404 if there is none (kill() then returns false).
func (h *Handler) killSandbox(w http.ResponseWriter, r *http.Request) {
	tenant, s, err := h.session(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	if _, err := h.opt.Sessions.Delete(r.Context(), tenant, s.ID); err != nil {
		h.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// setTimeout: POST /sandboxes/{id}/timeout {"timeout": seconds}: the
// session now ends that long from now.
func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *float64 `json:"timeout"`
	}
	tenant, s, err := h.sessionAndBody(r, &req)
	if err == nil && req.Timeout == nil {
		err = invalid("timeout is required (seconds)")
	}
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	h.extend(w, r, tenant, s, req.Timeout)
}

// refresh: POST /sandboxes/{id}/refreshes {"duration": seconds}.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Duration *float64 `json:"duration"`
	}
	tenant, s, err := h.sessionAndBody(r, &req)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	h.extend(w, r, tenant, s, req.Duration)
}

// sessionAndBody is session, then the body decoded into req: a call on a
// sandbox that is not the caller's has its body left unread.
func (h *Handler) sessionAndBody(r *http.Request, req any) (string, *session.Session, error) {
	tenant, s, err := h.session(r)
	if err != nil {
		return "", nil, err
	}
	return tenant, s, decodeBody(r, req)
}

func (h *Handler) extend(w http.ResponseWriter, r *http.Request, tenant string, s *session.Session, v *float64) {
	timeout, err := seconds(v, defaultTimeout)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	if _, err := h.opt.Sessions.Keepalive(r.Context(), tenant, s.ID, timeout); err != nil {
		h.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pauseSandbox: POST /sandboxes/{id}/pause: the sandbox is frozen; 409 if
// it is paused already (pause() then returns false).
func (h *Handler) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	tenant, s, err := h.session(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	if s.Status == api.StatusPaused || s.Status == api.StatusHibernated {
		writeAPIError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is already paused", s.ID))
		return
	}
	if _, err := h.opt.Sessions.Pause(r.Context(), tenant, s.ID); err != nil {
		h.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connectSandbox: POST [/v2]/sandboxes/{id}/connect (and the older
// /resume): a paused sandbox is resumed (201), a running one kept (200);
// a timeout in the body extends its life.
func (h *Handler) connectSandbox(w http.ResponseWriter, r *http.Request) {
	c, _ := callerOf(r)
	var req struct {
		Timeout *float64 `json:"timeout"`
	}
	tenant, s, err := h.sessionAndBody(r, &req)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	code := http.StatusOK
	if s.Status == api.StatusPaused || s.Status == api.StatusHibernated || s.Status == api.StatusError {
		if s, err = h.opt.Sessions.Resume(r.Context(), tenant, s.ID); err != nil {
			h.writeErr(w, r, err)
			return
		}
		code = http.StatusCreated
	}
	if req.Timeout != nil {
		timeout, err := seconds(req.Timeout, defaultTimeout)
		if err != nil {
			h.writeErr(w, r, err)
			return
		}
		// E2B never shortens a sandbox's life on connect.
		if time.Until(s.ExpiresAt) < time.Duration(timeout)*time.Second {
			if s, err = h.opt.Sessions.Keepalive(r.Context(), tenant, s.ID, timeout); err != nil {
				h.writeErr(w, r, err)
				return
			}
		}
	}
	writeJSON(w, code, h.sandboxJSON(r.Context(), c, s, false))
}

// listSandboxes: GET [/v2]/sandboxes: the tenant's sessions that are not
// terminated, all of them (not only those made through E2B). Filters:
// state (running, paused; comma-separated), metadata (a URL-encoded
// query string of pairs), limit and nextToken (x-next-token answers).
func (h *Handler) listSandboxes(w http.ResponseWriter, r *http.Request) {
	tenant, err := h.apiTenant(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	q := r.URL.Query()
	states := map[string]bool{}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			switch st = strings.TrimSpace(st); st {
			case "running", "paused":
				states[st] = true
			case "":
			default:
				h.writeErr(w, r, invalid("state %q: want running or paused", st))
				return
			}
		}
	}
	f := store.SessionFilter{Tenant: tenant, Metadata: map[string]string{}, PageToken: q.Get("nextToken"), Limit: 100}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			h.writeErr(w, r, invalid("limit %q: want 1..1000", v))
			return
		}
		f.Limit = n
	}
	if v := q.Get("metadata"); v != "" {
		pairs, err := url.ParseQuery(v)
		if err != nil {
			h.writeErr(w, r, invalid("metadata %q: want key=value pairs, URL-encoded", v))
			return
		}
		for k, vs := range pairs {
			if k == metaTemplate {
				continue
			}
			f.Metadata[k] = vs[0]
		}
	}
	out := []sandboxJSON{}
	// Terminated sessions are left out after the store's paging, so a page
	// may be short; the token still leads on.
	list, next, err := h.opt.Sessions.List(r.Context(), f)
	if err != nil {
		if errors.Is(err, errdefs.ErrInvalidArgument) {
			err = invalid("nextToken %q is not one this server gave", f.PageToken)
		}
		h.writeErr(w, r, err)
		return
	}
	for _, s := range list {
		if s.Status == api.StatusTerminated {
			continue
		}
		sj := h.sandboxJSON(r.Context(), caller{tenant: tenant}, s, true)
		if len(states) > 0 && !states[sj.State] {
			continue
		}
		out = append(out, sj)
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}
