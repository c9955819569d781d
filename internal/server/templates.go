package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/template/registry"
)

// Templates over the API: GET /templates lists the built-ins, the
// operator's and the tenant's own; POST /templates defines (or
// redefines) one of the tenant's by the spec `sbx template build --file`
// takes and builds it in the background (202; 200 when the spec is built
// already); its build log streams from .../builds/{id}/logs, and a build
// can be cancelled. DELETE refuses while sessions use the template.

// listTemplates: GET /templates.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	list, err := s.opt.Templates.List(r.Context(), tenant(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if list == nil {
		list = []api.Template{}
	}
	writeJSON(w, http.StatusOK, api.TemplateList{Templates: list})
}

// createTemplate: POST /templates.
func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request) {
	var spec template.Spec
	if err := decodeJSON(r, &spec, registry.MaxSpecBytes, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	t, queued, err := s.opt.Templates.Submit(r.Context(), tenant(r), spec)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", api.Prefix+"/templates/"+t.Name)
	if queued {
		writeJSON(w, http.StatusAccepted, t)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// getTemplate: GET /templates/{name}.
func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.opt.Templates.Get(r.Context(), tenant(r), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// deleteTemplate: DELETE /templates/{name}[?force=true].
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	force := false
	switch v := r.URL.Query().Get("force"); v {
	case "", "false", "0":
	case "true", "1":
		force = true
	default:
		s.writeError(w, r, fmt.Errorf("force=%q: want true or false: %w", v, errdefs.ErrInvalidArgument))
		return
	}
	if err := s.opt.Templates.Delete(r.Context(), tenant(r), r.PathValue("name"), force); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// cancelTemplateBuild: POST /templates/{name}/builds/{build_id}/cancel.
func (s *Server) cancelTemplateBuild(w http.ResponseWriter, r *http.Request) {
	t, err := s.opt.Templates.Cancel(r.Context(), tenant(r), r.PathValue("name"), r.PathValue("build_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, t)
}

// templateBuildLogs: GET /templates/{name}/builds/{build_id}/logs. With
// Accept: text/event-stream, the log as it grows ("log" events of one
// line each, then "end" with the template), else plain text: what there
// is so far, or all of it with ?follow=true.
func (s *Server) templateBuildLogs(w http.ResponseWriter, r *http.Request) {
	reg, t, name, id := s.opt.Templates, tenant(r), r.PathValue("name"), r.PathValue("build_id")
	// Unknown templates and builds are 404 before any of the stream is
	// sent.
	if _, err := reg.Get(r.Context(), t, name); err != nil {
		s.writeError(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	sse := wantsEventStream(r)
	follow := sse || r.URL.Query().Get("follow") == "true"
	if follow {
		release, err := s.openStream(t, logFollows)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		defer release()
	}
	started := false
	begin := func() {
		if started {
			return
		}
		started = true
		if sse {
			beginStream(w, "text/event-stream")
		} else {
			beginStream(w, "text/plain; charset=utf-8")
		}
	}
	var partial []byte // an unfinished last line, held back for SSE
	emit := func(b []byte) error {
		begin()
		if !sse {
			if _, err := w.Write(b); err != nil {
				return err
			}
			return rc.Flush()
		}
		partial = append(partial, b...)
		for {
			i := strings.IndexByte(string(partial), '\n')
			if i < 0 {
				break
			}
			if err := sendEvent(w, "log", api.StreamOutput{Text: string(partial[:i+1])}); err != nil {
				return err
			}
			partial = partial[i+1:]
		}
		return rc.Flush()
	}
	var mu sync.Mutex // emit and the heartbeat take turns at w
	locked := func(b []byte) error {
		mu.Lock()
		defer mu.Unlock()
		return emit(b)
	}
	ctx, cancel := context.WithCancel(r.Context())
	beats := make(chan struct{})
	go func() {
		// Heartbeats keep a quiet build's stream open through proxies.
		defer close(beats)
		beat := time.NewTicker(sseHeartbeat)
		defer beat.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-beat.C:
			}
			mu.Lock()
			if sse && started {
				fmt.Fprint(w, ": keep-alive\n\n")
				rc.Flush()
			}
			mu.Unlock()
		}
	}()
	err := reg.Logs(ctx, t, name, id, follow, locked)
	cancel()
	<-beats
	if err != nil && !started {
		s.writeError(w, r, err)
		return
	}
	if !sse || err != nil {
		return
	}
	begin()
	if len(partial) > 0 {
		sendEvent(w, "log", api.StreamOutput{Text: string(partial)})
	}
	if tmpl, err := reg.Get(r.Context(), t, name); err == nil {
		sendEvent(w, "end", tmpl)
	}
	rc.Flush()
}

// sendEvent writes one server-sent event.
func sendEvent(w http.ResponseWriter, event string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
	return err
}

// needTemplates answers 503 for the template calls of a server made
// without a registry (tests of other things), and lets the others
// through.
func (s *Server) needTemplates(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.opt.Templates == nil {
			s.writeError(w, r, fmt.Errorf("this server does not serve templates: %w", errdefs.ErrUnavailable))
			return
		}
		h(w, r)
	}
}
