package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/files"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// sandboxWorkspace is where a workspace is mounted in the sandbox.
const sandboxWorkspace = "/workspace"

// tempareaMount is where code of a conversation sees that conversation's
// uploads.
const tempareaMount = "/workspace/uploads/temparea"

// maxListEntries bounds a listing.
const maxListEntries = 10_000

// uploadFields are the text fields of an upload, which come before the
// files so that each file can be streamed straight to its place.
type uploadFields struct {
	path, conversation, subdir string
}

// upload: POST /sessions/{id}/files/upload. Each file part is
// streamed to disk (never whole in memory) through the session's file
// policy (files.Call.Write: size, type and count limits, the upload
// record); if any file fails, the files this request already stored are
// removed again, so a request stores all of its files or none.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	ws, err := s.opt.Files.Open(ctx, tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ws.Close()
	mr, err := r.MultipartReader()
	if err != nil {
		s.writeError(w, r, fmt.Errorf("upload: the body must be multipart/form-data with a \"file\" part: %v: %w", err, errdefs.ErrInvalidArgument))
		return
	}
	var (
		f     uploadFields
		saved []api.UploadedFile
	)
	fail := func(err error) {
		for _, u := range saved {
			// Not the request's context: a client gone is no reason to
			// keep half of its files.
			if rerr := ws.Remove(context.WithoutCancel(ctx), u.Path, false); rerr != nil && !errors.Is(rerr, errdefs.ErrNotFound) {
				s.log.Warn("rolling back upload", "path", u.Path, "err", rerr)
			}
		}
		s.writeError(w, r, err)
	}
	limit := ws.Session().Config.Upload.MaxFileCount
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			var se *statusError
			if !errors.As(err, &se) { // a body too slow is 408, not the client's syntax
				err = fmt.Errorf("upload: reading the multipart body: %v: %w", err, errdefs.ErrInvalidArgument)
			}
			fail(err)
			return
		}
		if part.FileName() == "" {
			if err := f.set(part, len(saved) > 0); err != nil {
				fail(err)
				return
			}
			continue
		}
		if part.FormName() != "file" {
			fail(fmt.Errorf("upload: file part %q: file parts must be named \"file\": %w", part.FormName(), errdefs.ErrInvalidArgument))
			return
		}
		// A request that could never be stored, whatever the session
		// holds, is the request's fault (422), not the session's (409).
		if len(saved)+1 > limit {
			fail(withStatus(http.StatusUnprocessableEntity, "unprocessable",
				fmt.Errorf("upload: more than %d files in one request (the session's max_file_count)", limit)))
			return
		}
		u, err := s.saveFile(ctx, ws, f, part, len(saved))
		if err != nil {
			fail(err)
			return
		}
		saved = append(saved, *u)
	}
	if len(saved) == 0 {
		s.writeError(w, r, fmt.Errorf("upload: no file part (send the file as a multipart part named \"file\" with a filename): %w", errdefs.ErrInvalidArgument))
		return
	}
	writeJSON(w, http.StatusCreated, api.UploadResponse{Files: saved})
}

// set takes one text field of an upload.
func (f *uploadFields) set(part *multipart.Part, afterFiles bool) error {
	name := part.FormName()
	if afterFiles {
		return fmt.Errorf("upload: field %q comes after a file part; send path, conversation_id and subdir before the files: %w", name, errdefs.ErrInvalidArgument)
	}
	b, err := io.ReadAll(io.LimitReader(part, 4097))
	if err != nil {
		return fmt.Errorf("upload: field %q: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	if len(b) > 4096 {
		return fmt.Errorf("upload: field %q is longer than 4096 bytes: %w", name, errdefs.ErrInvalidArgument)
	}
	v := string(b)
	switch name {
	case "path":
		f.path = v
	case "conversation_id":
		if !session.ValidID(v) {
			return fmt.Errorf("upload: conversation_id %q: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit, without \"..\": %w", v, errdefs.ErrInvalidArgument)
		}
		f.conversation = v
	case "subdir":
		if v != "temparea" {
			return fmt.Errorf("upload: subdir %q: the only subdir is \"temparea\": %w", v, errdefs.ErrInvalidArgument)
		}
		f.subdir = v
	default:
		return fmt.Errorf("upload: unknown field %q (fields: file, path, conversation_id, subdir): %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// saveFile streams one file part to its place in the workspace.
func (s *Server) saveFile(ctx context.Context, ws *files.Call, f uploadFields, part *multipart.Part, index int) (*api.UploadedFile, error) {
	name := path.Base(strings.ReplaceAll(part.FileName(), "\\", "/"))
	if _, err := workspace.CleanPath(name); err != nil || name == "." || name == "/" {
		return nil, fmt.Errorf("upload: file name %q is not usable: %w", part.FileName(), errdefs.ErrInvalidArgument)
	}
	if f.subdir != "" && f.conversation == "" {
		return nil, fmt.Errorf("upload: subdir needs conversation_id: %w", errdefs.ErrInvalidArgument)
	}
	// rel is the file's path under base: the name, or the path field (a
	// directory when it ends in "/" or the request has several files).
	rel := name
	if f.path != "" {
		p, err := workspace.CleanPath(f.path)
		if err != nil {
			return nil, fmt.Errorf("upload: %w", err)
		}
		switch {
		case strings.HasSuffix(f.path, "/") || p == ".":
			rel = path.Join(p, name)
		case index > 0:
			return nil, fmt.Errorf("upload: path %q names a file but the request has several; end it with \"/\" to name a directory: %w", f.path, errdefs.ErrInvalidArgument)
		default:
			rel = p
		}
	}
	info, err := ws.Write(ctx, files.FileWrite{
		Path: rel, ConversationID: f.conversation, MediaType: part.Header.Get("Content-Type"), Body: part,
	})
	if err != nil {
		return nil, fmt.Errorf("upload: %w", err)
	}
	s.opt.Metrics.uploadBytes.Add(float64(info.Size))
	sandboxPath := path.Join(sandboxWorkspace, info.Path)
	if f.conversation != "" {
		sandboxPath = path.Join(tempareaMount, rel)
	}
	return &api.UploadedFile{
		Name: path.Base(info.Path), Path: info.Path, SandboxPath: sandboxPath, Size: info.Size, SHA256: info.SHA256,
		ConversationID: f.conversation,
	}, nil
}

// listFiles: GET /sessions/{id}/files. With conversation_id (and
// subdir=temparea) it lists that conversation's uploads, which sandboxed
// code cannot write to, so agent-made files never show up there.
func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	recursive, err := queryBool(q.Get("recursive"), "recursive")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rel, err := workspace.CleanPath(q.Get("path"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	cid, subdir := q.Get("conversation_id"), q.Get("subdir")
	switch {
	case subdir != "" && subdir != "temparea":
		s.writeError(w, r, fmt.Errorf("subdir %q: the only subdir is \"temparea\": %w", subdir, errdefs.ErrInvalidArgument))
		return
	case subdir != "" && cid == "":
		s.writeError(w, r, fmt.Errorf("subdir needs conversation_id: %w", errdefs.ErrInvalidArgument))
		return
	case cid != "" && !session.ValidID(cid):
		s.writeError(w, r, fmt.Errorf("conversation_id %q is not a valid id: %w", cid, errdefs.ErrInvalidArgument))
		return
	case cid != "":
		rel = path.Join(workspace.ConversationDir(cid), rel)
	}
	ws, err := s.opt.Files.Open(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ws.Close()
	entries, truncated, err := ws.List(r.Context(), rel, recursive, maxListEntries)
	if errors.Is(err, errdefs.ErrNotFound) && cid != "" {
		entries, err = nil, nil // a conversation without uploads yet
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.FileList{Files: make([]api.FileEntry, 0, len(entries)), Truncated: truncated}
	for _, e := range entries {
		out.Files = append(out.Files, api.FileEntry{Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size, ModifiedAt: e.ModTime.UTC()})
	}
	writeJSON(w, http.StatusOK, out)
}

// download: GET /sessions/{id}/files/{path}, with Range; or, with
// ?presign=true, a signed URL for it.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	presign, err := queryBool(q.Get("presign"), "presign")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rel, err := workspace.CleanPath(r.PathValue("path"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ws, err := s.opt.Files.Open(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ws.Close()
	file, err := ws.Open(r.Context(), rel)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer file.Close()
	if presign {
		s.presign(w, r, file, path.Base(rel))
		return
	}
	// Saved, never shown: a planted page must not run as the API's origin
	// (guard adds nosniff and a sandboxing CSP as well).
	w.Header().Set("Content-Disposition", attachment(path.Base(rel)))
	http.ServeContent(w, r, path.Base(rel), file.Info().ModTime, file)
}

// deleteFile: DELETE /sessions/{id}/files/{path}. A
// conversation's uploads may go one by one here (their records go with
// them); the rest of what sbx manages is refused by the file policy.
func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) {
	recursive, err := queryBool(r.URL.Query().Get("recursive"), "recursive")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rel, err := workspace.CleanPath(r.PathValue("path"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ws, err := s.opt.Files.Open(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ws.Close()
	if err := ws.Remove(r.Context(), rel, recursive); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// deleteConversation: DELETE /sessions/{id}/conversations/{cid}:
// the conversation's uploads go at once and for good, and so do its
// stateful contexts.
func (s *Server) deleteConversation(w http.ResponseWriter, r *http.Request) {
	cid := r.PathValue("conversation_id")
	if !session.ValidID(cid) {
		s.writeError(w, r, fmt.Errorf("conversation_id %q is not a valid id: %w", cid, errdefs.ErrInvalidArgument))
		return
	}
	if err := s.purgeConversation(r.Context(), tenant(r), r.PathValue("session_id"), cid); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// purgeConversation removes a conversation's temp area and stateful
// contexts from a session.
func (s *Server) purgeConversation(ctx context.Context, t, sid, cid string) error {
	ws, err := s.opt.Files.Open(ctx, t, sid)
	if err != nil {
		return err
	}
	defer ws.Close()
	if err := ws.RemoveConversation(ctx, cid); err != nil {
		return err
	}
	s.opt.Sessions.DropConversation(ctx, t, sid, cid)
	return nil
}
