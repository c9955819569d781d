package e2b

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/execution"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// The code interpreter (E2B's port 49999): POST /execute runs a cell in a
// context and answers with newline-delimited JSON. A context is an sbx
// stateful context (executor contexts: a Python process that keeps its
// globals), named by sbxContext; a sandbox's default context is "default".
// The cell runs inside driver.py, which gives the notebook
// semantics sbx's executions lack (see there).

//go:embed driver.py
var driver string

// defaultContext is the context of cells that name none.
const defaultContext = "default"

// codeContext is what /contexts shows of a context.
type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// A context id carries all there is to know of a context: KEY "." and its
// working directory in unpadded base64url, KEY being 16 random hex digits
// that name its interpreter (the sbx stateful context "e2b-" + KEY). So a
// cell in a context runs on any replica, and after a restart that adopted
// the sandbox still running its interpreter, without a table.
const maxContextCwd = 1024

func newContextID(cwd string) string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b) + "." + base64.RawURLEncoding.EncodeToString([]byte(cwd))
}

// parseContext returns the context an id names, or false if it is not one
// (newContextID's form or the default context's).
func parseContext(id string) (*codeContext, bool) {
	if id == defaultContext {
		return &codeContext{ID: defaultContext, Language: "python", Cwd: homeDir}, true
	}
	key, enc, ok := strings.Cut(id, ".")
	if !ok || len(key) != 16 || strings.Trim(key, "0123456789abcdef") != "" {
		return nil, false
	}
	dir, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || len(dir) == 0 || len(dir) > maxContextCwd || !strings.HasPrefix(string(dir), "/") {
		return nil, false
	}
	if c, err := cwd(string(dir)); err != nil || c != string(dir) {
		return nil, false
	}
	return &codeContext{ID: id, Language: "python", Cwd: string(dir)}, true
}

// sbxContext is the executor context of a context id parseContext took.
func sbxContext(id string) string {
	key, _, _ := strings.Cut(id, ".")
	return "e2b-" + key
}

// contextTable is what GET /contexts lists besides the default context:
// the contexts this server made, or ran a cell in, since it started and
// that were not removed. It is only a list; nothing else depends on it.
type contextTable struct {
	mu   sync.Mutex
	byID map[[2]string]map[string]*codeContext // by {tenant, sandbox}
}

func newContextTable() *contextTable {
	return &contextTable{byID: map[[2]string]map[string]*codeContext{}}
}

// maxContexts bounds a sandbox's contexts, as the executor does (16).
const maxContexts = 15

// add records a context; fresh says it is being created, and may not go
// past maxContexts.
func (t *contextTable) add(tenant, sandbox string, c *codeContext, fresh bool) error {
	if c.ID == defaultContext {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	k := [2]string{tenant, sandbox}
	if t.byID[k] == nil {
		t.byID[k] = map[string]*codeContext{}
	}
	if fresh && len(t.byID[k]) >= maxContexts {
		return fmt.Errorf("sandbox %s has %d contexts, the most it may have; remove one: %w", sandbox, maxContexts, errdefs.ErrResourceExhausted)
	}
	t.byID[k][c.ID] = c
	return nil
}

func (t *contextTable) remove(tenant, sandbox, id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byID[[2]string{tenant, sandbox}], id)
}

func (t *contextTable) list(tenant, sandbox string) []*codeContext {
	t.mu.Lock()
	defer t.mu.Unlock()
	def, _ := parseContext(defaultContext)
	out := []*codeContext{def}
	for _, c := range t.byID[[2]string{tenant, sandbox}] {
		out = append(out, c)
	}
	slices.SortFunc(out[1:], func(a, b *codeContext) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (t *contextTable) drop(tenant, sandbox string) {
	t.mu.Lock()
	delete(t.byID, [2]string{tenant, sandbox})
	t.mu.Unlock()
}

func (h *Handler) interpreterRoutes() {
	m := h.interp
	m.HandleFunc("GET /health", h.health)
	m.HandleFunc("POST /execute", h.execute)
	m.HandleFunc("POST /contexts", h.createContext)
	m.HandleFunc("GET /contexts", h.listContexts)
	m.HandleFunc("DELETE /contexts/{id}", h.deleteContext)
	m.HandleFunc("POST /contexts/{id}/restart", h.restartContext)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, http.StatusNotFound, fmt.Sprintf("no code interpreter endpoint %s %s in sbx (docs/e2b.md lists what is supported)", r.Method, r.URL.Path))
	})
}

// pythonLanguage reports whether a cell or context language is Python,
// the only one sbx interprets.
func pythonLanguage(l string) bool {
	switch strings.ToLower(l) {
	case "", "python", "python3":
		return true
	}
	return false
}

// createContext: POST /contexts {language, cwd} -> {id, language, cwd}.
func (h *Handler) createContext(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decodeBody(r, &req); err != nil {
		h.writeErr(w, r, err)
		return
	}
	if !pythonLanguage(req.Language) {
		h.writeErr(w, r, invalid("language %q: sbx's code interpreter runs Python only", req.Language))
		return
	}
	dir, err := cwd(req.Cwd)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	if len(dir) > maxContextCwd {
		h.writeErr(w, r, invalid("cwd of %d bytes: longer than the limit of %d", len(dir), maxContextCwd))
		return
	}
	id, tenant, err := h.sandboxTenant(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	if _, err := h.live(r.Context(), tenant, id); err != nil {
		h.writeErr(w, r, err)
		return
	}
	c := &codeContext{ID: newContextID(dir), Language: "python", Cwd: dir}
	if err := h.contexts.add(tenant, id, c, true); err != nil {
		h.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// listContexts: GET /contexts.
func (h *Handler) listContexts(w http.ResponseWriter, r *http.Request) {
	id, tenant, err := h.sandboxTenant(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	if _, err := h.live(r.Context(), tenant, id); err != nil {
		h.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, h.contexts.list(tenant, id))
}

// deleteContext: DELETE /contexts/{id}: its interpreter is killed and the
// id forgotten.
func (h *Handler) deleteContext(w http.ResponseWriter, r *http.Request) {
	id, tenant, err := h.sandboxTenant(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	cid := r.PathValue("id")
	if _, ok := parseContext(cid); !ok || cid == defaultContext {
		h.writeErr(w, r, fmt.Errorf("context %q: %w", cid, errdefs.ErrNotFound))
		return
	}
	if err := h.killContext(r.Context(), tenant, id, cid); err != nil {
		h.writeErr(w, r, err)
		return
	}
	h.contexts.remove(tenant, id, cid)
	w.WriteHeader(http.StatusNoContent)
}

// restartContext: POST /contexts/{id}/restart: its interpreter is killed;
// the next cell starts a fresh one.
func (h *Handler) restartContext(w http.ResponseWriter, r *http.Request) {
	id, tenant, err := h.sandboxTenant(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	cid := r.PathValue("id")
	if _, ok := parseContext(cid); !ok {
		h.writeErr(w, r, fmt.Errorf("context %q: %w", cid, errdefs.ErrNotFound))
		return
	}
	if err := h.killContext(r.Context(), tenant, id, cid); err != nil {
		h.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// killContext ends a context's interpreter in the session's sandbox, if
// it has one.
func (h *Handler) killContext(ctx context.Context, tenant, id, cid string) error {
	lease, err := h.opt.Sessions.Acquire(ctx, tenant, id)
	if err != nil {
		return err
	}
	defer lease.Release()
	err = lease.Client.DeleteContext(ctx, "", sbxContext(cid))
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil // it never ran a cell, or its process is gone already
	}
	return err
}

// executeRequest is the body of POST /execute.
type executeRequest struct {
	Code      string            `json:"code"`
	ContextID *string           `json:"context_id"`
	Language  *string           `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// cellResult is what driver.py returns.
type cellResult struct {
	Results []map[string]any `json:"results"`
	Error   *struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		Traceback string `json:"traceback"`
	} `json:"error"`
	ExecutionCount int `json:"execution_count"`
}

// execute: POST /execute: run a cell; the answer streams stdout and
// stderr lines as they come, then the results, the error if any, the
// execution count and end_of_execution. A client that goes away
// interrupts the cell (its context is restarted, as sbx cannot interrupt
// a context without ending it).
func (h *Handler) execute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	if err := decodeBody(r, &req); err != nil {
		h.writeErr(w, r, err)
		return
	}
	if req.Language != nil && !pythonLanguage(*req.Language) {
		h.writeErr(w, r, invalid("language %q: sbx's code interpreter runs Python only", *req.Language))
		return
	}
	id, tenant, err := h.sandboxTenant(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	cid := defaultContext
	if req.ContextID != nil && *req.ContextID != "" {
		cid = *req.ContextID
	}
	c, ok := parseContext(cid)
	if !ok {
		h.writeErr(w, r, fmt.Errorf("context %q not found (create it with POST /contexts): %w", cid, errdefs.ErrNotFound))
		return
	}
	if _, err := h.live(r.Context(), tenant, id); err != nil {
		h.writeErr(w, r, err)
		return
	}
	release, err := h.openStream(tenant)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	defer release()
	code := driver + "\ntry:\n    return _sbx_e2b_cell(" + pyBase64(req.Code) + ", " + pyBase64(c.Cwd) + ")\nfinally:\n    del _sbx_e2b_cell\n"
	run, err := h.opt.Executions.Submit(r.Context(), tenant, id, api.ExecuteRequest{
		Code: code, Language: wire.LanguagePython, ContextID: sbxContext(cid), EnvVars: req.EnvVars,
		Timeout: float64(wire.MaxTimeoutMs / 1000),
	})
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	h.contexts.add(tenant, id, c, false) // listed from now on, here too
	h.streamCell(w, r, tenant, run)
}

func pyBase64(s string) string { return "'" + base64.StdEncoding.EncodeToString([]byte(s)) + "'" }

// streamCell writes a cell's output as the interpreter's NDJSON.
func (h *Handler) streamCell(w http.ResponseWriter, r *http.Request, tenant string, run *execution.Run) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	send := func(v map[string]any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		b = append(b, '\n')
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	next := 0
	for {
		evs, changed := run.Events(next)
		for _, ev := range evs {
			if !send(map[string]any{"type": ev.Stream, "text": ev.Text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)}) {
				h.interrupt(tenant, run)
				return
			}
		}
		next += len(evs)
		select {
		case <-changed:
			continue
		case <-run.Done():
			if evs, _ := run.Events(next); len(evs) > 0 {
				continue
			}
			for _, m := range cellMessages(run.Result()) {
				if !send(m) {
					return
				}
			}
			return
		case <-r.Context().Done():
			h.interrupt(tenant, run)
			return
		}
	}
}

// interrupt cancels a cell whose client left.
func (h *Handler) interrupt(tenant string, run *execution.Run) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	h.opt.Executions.Cancel(ctx, tenant, run.ID())
}

// cellMessages are the closing lines of a cell: results, error, count,
// end. A cell that did not get to return (a timeout, a crash, no
// sandbox) ends with the execution's error as the cell's.
func cellMessages(x *api.Execution) []map[string]any {
	var res cellResult
	if len(x.ReturnValue) == 0 || json.Unmarshal(x.ReturnValue, &res) != nil {
		name, value, tb := "ExecutionError", "the cell ended without a result", ""
		if x.Error != nil {
			name, value, tb = x.Error.Type, x.Error.Message, x.Error.Traceback
		}
		return []map[string]any{
			{"type": "error", "name": name, "value": value, "traceback": tb},
			{"type": "end_of_execution"},
		}
	}
	var out []map[string]any
	for _, r := range res.Results {
		m := map[string]any{"type": "result"}
		for k, v := range r {
			m[k] = v
		}
		if _, ok := m["is_main_result"]; !ok {
			m["is_main_result"] = false
		}
		out = append(out, m)
	}
	if e := res.Error; e != nil {
		out = append(out, map[string]any{"type": "error", "name": e.Name, "value": e.Value, "traceback": e.Traceback})
	}
	out = append(out,
		map[string]any{"type": "number_of_executions", "execution_count": res.ExecutionCount},
		map[string]any{"type": "end_of_execution"})
	return out
}
