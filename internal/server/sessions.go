package server

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
)

const maxJSONBody = 2 << 20

// toAPISession is a session as the API shows it.
func toAPISession(s *session.Session) api.Session {
	env := make([]string, 0, len(s.Config.Env))
	for k := range s.Config.Env {
		env = append(env, k)
	}
	slices.Sort(env)
	meta := s.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	up := s.Config.Upload
	types := up.AllowedFileTypes
	if types == nil {
		types = []string{}
	}
	res := s.Config.Resources
	return api.Session{
		SessionID: s.ID, Status: s.Status, TemplateID: s.TemplateID, Error: s.Error,
		CreatedAt: s.CreatedAt, LastActivityAt: s.LastActivityAt, ExpiresAt: s.ExpiresAt,
		TTL: s.Config.TTL, IdleTimeout: s.Config.IdleTimeout, HibernateTimeout: s.Config.HibernateTimeout,
		SandboxState: s.SandboxState, Resources: api.Resources{CPU: res.CPU, Memory: res.MemoryMB, Disk: res.DiskMB},
		Network: s.Config.Network, Metadata: meta, EnvVars: env,
		FileUploadConfig: api.FileUploadConfig{
			MaxFileSize: up.MaxFileSize, MaxFileSizeUnit: up.MaxFileSizeUnit, MaxFileCount: up.MaxFileCount, AllowedFileTypes: types,
		},
	}
}

// restFields names session.CreateRequest's fields as the REST API's
// bodies do (POST /sessions; the agents' template_id too), for the
// domain's errors.
var restFields = map[string]string{
	"ID": "session_id", "Template": "template_id",
	"TTL": "timeout", "IdleTimeout": "idle_timeout", "HibernateTimeout": "hibernate_timeout",
	"Resources.CPU": "resources.cpu", "Resources.MemoryMB": "resources.memory", "Resources.DiskMB": "resources.disk",
	"Env": "env_vars", "Network": "network", "Metadata": "metadata",
	"Upload.MaxFileSize": "file_upload_config.max_file_size", "Upload.MaxFileSizeUnit": "file_upload_config.max_file_size_unit",
	"Upload.MaxFileCount": "file_upload_config.max_file_count", "Upload.AllowedFileTypes": "file_upload_config.allowed_file_types",
}

// createRequest translates the body of POST /sessions into the domain's
// request. The timeouts are the wire's to check: they are seconds, and
// past MaxTTL a count of them would overflow a time.Duration. The rest
// the session checks, and createSession names its fields back.
func createRequest(req *api.CreateSessionRequest, d session.Defaults) (session.CreateRequest, error) {
	max := int64(session.MaxTTL / time.Second)
	switch {
	case req.Timeout < 0 || req.Timeout > max:
		return session.CreateRequest{}, fmt.Errorf("timeout %d: the session's time to live is 1..%d seconds (0 for the default, %d): %w", req.Timeout, max, int64(d.TTL/time.Second), errdefs.ErrInvalidArgument)
	case req.IdleTimeout < 0 || req.IdleTimeout > max:
		return session.CreateRequest{}, fmt.Errorf("idle_timeout %d: want 1..%d seconds (0 for the default, %d): %w", req.IdleTimeout, max, int64(d.IdleTimeout/time.Second), errdefs.ErrInvalidArgument)
	case req.HibernateTimeout < 0 || req.HibernateTimeout > max:
		return session.CreateRequest{}, fmt.Errorf("hibernate_timeout %d: want 1..%d seconds (0 for the default, %d): %w", req.HibernateTimeout, max, int64(d.HibernateTimeout/time.Second), errdefs.ErrInvalidArgument)
	}
	out := session.CreateRequest{
		ID: req.SessionID, Template: req.TemplateID,
		TTL: time.Duration(req.Timeout) * time.Second, IdleTimeout: time.Duration(req.IdleTimeout) * time.Second,
		HibernateTimeout: time.Duration(req.HibernateTimeout) * time.Second,
		WarmUp:           req.WarmUp, Env: req.EnvVars, Network: req.Network, Metadata: req.Metadata,
	}
	if r := req.Resources; r != nil {
		out.Resources = session.Resources{CPU: r.CPU, MemoryMB: r.Memory, DiskMB: r.Disk}
	}
	if u := req.FileUploadConfig; u != nil {
		out.Upload = session.UploadConfig{
			MaxFileSize: u.MaxFileSize, MaxFileSizeUnit: u.MaxFileSizeUnit, MaxFileCount: u.MaxFileCount, AllowedFileTypes: u.AllowedFileTypes,
		}
	}
	return out, nil
}

// createSession: POST /sessions. 201 for a new session, 200 for an
// existing one.
func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSessionRequest
	if err := decodeJSON(r, &req, maxJSONBody, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	dreq, err := createRequest(&req, s.opt.Sessions.Defaults())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, created, err := s.opt.Sessions.Create(r.Context(), tenant(r), dreq)
	if err != nil {
		s.writeError(w, r, session.RenameField(err, restFields))
		return
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	writeJSON(w, code, toAPISession(sess))
}

// getSession: GET /sessions/{id}.
func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	sess, err := s.opt.Sessions.Get(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISession(sess))
}

// listSessions: GET /sessions.
func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.SessionFilter{Tenant: tenant(r), Status: q.Get("status"), PageToken: q.Get("page_token"), Metadata: map[string]string{}}
	switch f.Status {
	case "", api.StatusPending, api.StatusRunning, api.StatusPaused, api.StatusHibernated, api.StatusError, api.StatusTerminated:
	default:
		s.writeError(w, r, fmt.Errorf("status %q: want pending, running, paused, hibernated, error or terminated: %w", f.Status, errdefs.ErrInvalidArgument))
		return
	}
	limit, err := queryInt(q.Get("limit"), 100, 1, 1000, "limit")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f.Limit = limit
	for _, kv := range q["metadata"] {
		k, v, ok := strings.Cut(kv, ":")
		if !ok || k == "" {
			s.writeError(w, r, fmt.Errorf("metadata %q: want KEY:VALUE: %w", kv, errdefs.ErrInvalidArgument))
			return
		}
		f.Metadata[k] = v
	}
	if v := q.Get("user_id"); v != "" {
		f.Metadata["user_id"] = v
	}
	if v := q.Get("agent_id"); v != "" {
		f.Metadata["agent_id"] = v
	}
	list, next, err := s.opt.Sessions.List(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.SessionList{Sessions: make([]api.Session, 0, len(list)), NextPageToken: next}
	for _, sess := range list {
		out.Sessions = append(out.Sessions, toAPISession(sess))
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSession: DELETE /sessions/{id}.
func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) {
	sess, err := s.opt.Sessions.Delete(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.DeleteSessionResponse{SessionID: sess.ID, Status: sess.Status})
}

// pauseSession: POST /sessions/{id}/pause.
func (s *Server) pauseSession(w http.ResponseWriter, r *http.Request) {
	sess, err := s.opt.Sessions.Pause(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISession(sess))
}

// resumeSession: POST /sessions/{id}/resume.
func (s *Server) resumeSession(w http.ResponseWriter, r *http.Request) {
	sess, err := s.opt.Sessions.Resume(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISession(sess))
}

// hibernateSession: POST /sessions/{id}/hibernate (R-61, on demand).
func (s *Server) hibernateSession(w http.ResponseWriter, r *http.Request) {
	sess, err := s.opt.Sessions.Hibernate(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISession(sess))
}

// createSnapshot: POST /sessions/{id}/snapshots.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.opt.Sessions.Snapshots().Create(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toAPISnapshot(snap, true))
}

// toAPISnapshot is a snapshot as the API shows it; with created, what the
// snapshot added to the blob store too (only a create's answer has it).
func toAPISnapshot(sn *session.SnapshotInfo, created bool) api.Snapshot {
	out := api.Snapshot{
		SnapshotID: sn.ID, SessionID: sn.SessionID, CreatedAt: sn.CreatedAt,
		Files: sn.Files, Dirs: sn.Dirs, Symlinks: sn.Symlinks, Bytes: sn.Bytes,
	}
	if created {
		out.NewBytes = &sn.NewBytes
	}
	return out
}

// listSnapshots: GET /sessions/{id}/snapshots.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	list, err := s.opt.Sessions.Snapshots().List(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.SnapshotList{Snapshots: make([]api.Snapshot, 0, len(list))}
	for i := range list {
		out.Snapshots = append(out.Snapshots, toAPISnapshot(&list[i], false))
	}
	writeJSON(w, http.StatusOK, out)
}

// getSnapshot: GET /sessions/{id}/snapshots/{snapshot_id}.
func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.opt.Sessions.Snapshots().Get(r.Context(), tenant(r), r.PathValue("session_id"), r.PathValue("snapshot_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISnapshot(snap, false))
}

// deleteSnapshot: DELETE /sessions/{id}/snapshots/{snapshot_id}.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.opt.Sessions.Snapshots().Delete(r.Context(), tenant(r), r.PathValue("session_id"), r.PathValue("snapshot_id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// restoreSnapshot: POST /sessions/{id}/snapshots/{snapshot_id}/restore.
func (s *Server) restoreSnapshot(w http.ResponseWriter, r *http.Request) {
	sess, err := s.opt.Sessions.Snapshots().Restore(r.Context(), tenant(r), r.PathValue("session_id"), r.PathValue("snapshot_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISession(sess))
}

// keepalive: POST /sessions/{id}/keepalive.
func (s *Server) keepalive(w http.ResponseWriter, r *http.Request) {
	var req api.KeepaliveRequest
	if err := decodeJSON(r, &req, maxJSONBody, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, err := s.opt.Sessions.Keepalive(r.Context(), tenant(r), r.PathValue("session_id"), req.Timeout)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISession(sess))
}

// queryInt reads an integer query parameter in [lo, hi], def when absent.
func queryInt(v string, def, lo, hi int, name string) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s %q: want an integer %d..%d: %w", name, v, lo, hi, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

// queryBool reads a boolean query parameter, true or false as the
// contract says; absent is false.
func queryBool(v, name string) (bool, error) {
	switch v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, fmt.Errorf("%s %q: want true or false: %w", name, v, errdefs.ErrInvalidArgument)
}
