package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/execution"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// maxExecuteBody bounds an execute request: the executor's own bound on
// code, event and environment, and slack for the JSON around them.
const maxExecuteBody = wire.MaxRequestBytes + 1<<20

// execute: POST /sessions/{id}/execute. Asynchronous by
// default (202 and an id); ?wait=true answers with the result;
// Accept: text/event-stream streams the output and then the result.
func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	wait, err := queryBool(r.URL.Query().Get("wait"), "wait")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req api.ExecuteRequest
	if err := decodeJSON(r, &req, maxExecuteBody, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	release, err := s.holdExecution(r, wait)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	s.submit(w, r, r.PathValue("session_id"), req, wait)
}

// holdExecution counts an execute request that stays open (streamed or
// ?wait=true) against the tenant's streams, before anything is made or
// submitted: a refused one runs nothing.
func (s *Server) holdExecution(r *http.Request, wait bool) (release func(), err error) {
	if !wantsEventStream(r) && !wait {
		return func() {}, nil
	}
	return s.openStream(tenant(r), execStreams)
}

// submit runs an execute request in a session and answers as execute
// does.
func (s *Server) submit(w http.ResponseWriter, r *http.Request, sessionID string, req api.ExecuteRequest, wait bool) {
	run, err := s.opt.Executions.Submit(r.Context(), tenant(r), sessionID, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	switch {
	case wantsEventStream(r):
		s.stream(w, r, run)
	case wait:
		select {
		case <-run.Done():
		case <-r.Context().Done():
			return // the client left; the execution goes on and is recorded
		}
		res := run.Result()
		if unavailable(res) {
			// no sandbox is a retryable condition, not a result.
			s.writeError(w, r, fmt.Errorf("%s (execution %s): %w", res.Error.Message, res.ExecutionID, errdefs.ErrUnavailable))
			return
		}
		if res.Error != nil && res.Error.Type == api.ErrTypeTemplateNotBuilt {
			s.writeError(w, r, fmt.Errorf("%s (execution %s): %w", res.Error.Message, res.ExecutionID, errdefs.ErrFailedPrecondition))
			return
		}
		if res.Error != nil && res.Error.Type == api.ErrTypeQuotaExceeded {
			// 429 with Retry-After and the limit's name.
			s.writeError(w, r, fmt.Errorf("%s (execution %s): %w", res.Error.Message, res.ExecutionID, errdefs.ErrResourceExhausted))
			return
		}
		writeJSON(w, http.StatusOK, res)
	default:
		writeJSON(w, http.StatusAccepted, api.SubmitResponse{ExecutionID: run.ID(), Status: api.ExecSubmitted})
	}
}

func wantsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(strings.TrimSpace(mt), "text/event-stream") {
				return true
			}
		}
	}
	return false
}

// beginStream answers 200 with a stream of contentType that no cache or
// proxy holds back, and flushes the header out; what follows is flushed
// with the controller it returns.
func beginStream(w http.ResponseWriter, contentType string) *http.ResponseController {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	return rc
}

// sseHeartbeat keeps idle streams alive through proxies that close quiet
// connections.
const sseHeartbeat = 15 * time.Second

// stream sends an execution as server-sent events: submitted, the output
// as it happens, then result.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, run *execution.Run) {
	rc := beginStream(w, "text/event-stream")
	send := func(event string, v any) bool {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return false
		}
		return true
	}
	send(api.EventSubmitted, api.SubmitResponse{ExecutionID: run.ID(), Status: api.ExecSubmitted})
	rc.Flush()
	beat := time.NewTicker(sseHeartbeat)
	defer beat.Stop()
	next := 0
	for {
		evs, changed := run.Events(next)
		for _, ev := range evs {
			if !send(ev.Stream, api.StreamOutput{Text: ev.Text}) {
				return
			}
		}
		next += len(evs)
		if len(evs) > 0 {
			rc.Flush()
		}
		select {
		case <-changed:
			continue
		case <-run.Done():
			if evs, _ := run.Events(next); len(evs) > 0 {
				continue // output that came with the end
			}
			if res := run.Result(); unavailable(res) {
				send(api.EventError, api.Error{Error: api.ErrorBody{Code: "unavailable", Message: res.Error.Message + " (execution " + res.ExecutionID + "); retry later"}})
			} else {
				send(api.EventResult, res)
			}
			rc.Flush()
			return
		case <-beat.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			rc.Flush()
		case <-r.Context().Done():
			return
		}
	}
}

// listExecutions: GET /sessions/{id}/executions.
func (s *Server) listExecutions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := queryInt(q.Get("limit"), 50, 1, 1000, "limit")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, next, err := s.opt.Executions.List(r.Context(), tenant(r), r.PathValue("session_id"), limit, q.Get("page_token"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.ExecutionList{Executions: make([]api.Execution, 0, len(list)), NextPageToken: next}
	for _, x := range list {
		out.Executions = append(out.Executions, *x)
	}
	writeJSON(w, http.StatusOK, out)
}

// getExecution: GET /executions/{id}: status and timings.
func (s *Server) getExecution(w http.ResponseWriter, r *http.Request) {
	x, err := s.opt.Executions.Get(r.Context(), tenant(r), r.PathValue("execution_id"), false)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, x)
}

// maxResultWait bounds ?wait=true on the result endpoint: a long poll,
// which the client repeats.
const maxResultWait = 300

// getResult: GET /executions/{id}/result, optionally waiting for
// the end (?wait=true&timeout=SECONDS, default 60).
func (s *Server) getResult(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	wait, err := queryBool(q.Get("wait"), "wait")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("execution_id")
	if !wait {
		x, err := s.opt.Executions.Get(r.Context(), tenant(r), id, true)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, x)
		return
	}
	timeout := 60.0
	if v := q.Get("timeout"); v != "" {
		timeout, err = strconv.ParseFloat(v, 64)
		if err != nil || timeout <= 0 || timeout > maxResultWait {
			s.writeError(w, r, fmt.Errorf("timeout %q: want seconds, more than 0 and at most %d: %w", v, maxResultWait, errdefs.ErrInvalidArgument))
			return
		}
	}
	release, err := s.openStream(tenant(r), execStreams)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(timeout*float64(time.Second)))
	defer cancel()
	x, err := s.opt.Executions.Wait(ctx, tenant(r), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, x)
}

// cancelExecution: POST /executions/{id}/cancel.
func (s *Server) cancelExecution(w http.ResponseWriter, r *http.Request) {
	x, err := s.opt.Executions.Cancel(r.Context(), tenant(r), r.PathValue("execution_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, x)
}

// unavailable reports whether an execution never ran because no sandbox
// could be had: a retryable condition, answered as 503 (or an SSE
// error event) rather than as a result.
func unavailable(x *api.Execution) bool {
	return x.Error != nil && x.Error.Type == execution.ErrTypeUnavailable
}
