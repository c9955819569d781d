package e2b

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/files"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

func (h *Handler) envdRoutes() {
	m := h.envd
	m.HandleFunc("GET /health", h.health)
	m.HandleFunc("GET /files", h.readFile)
	m.HandleFunc("POST /files", h.writeFiles)
	m.HandleFunc("POST /filesystem.Filesystem/{method}", h.filesystem)
	m.HandleFunc("POST /process.Process/{method}", h.process)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeUnaryError(w, unimplemented("no envd endpoint %s %s in sbx (docs/e2b.md lists what is supported)", r.Method, r.URL.Path))
	})
}

// health: GET /health: 204 while the sandbox lives, 502 once it is gone
// (what E2B's proxy answers for a sandbox that is not running; the SDK's
// isRunning reads it).
func (h *Handler) health(w http.ResponseWriter, r *http.Request) {
	id, tenant, err := h.sandboxTenant(r)
	if err == nil {
		_, err = h.live(r.Context(), tenant, id)
	}
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		writeAPIError(w, http.StatusBadGateway, err.Error())
	case err != nil:
		h.writeErr(w, r, err)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// workspace opens the workspace of an in-sandbox call's session; the
// caller closes it.
func (h *Handler) workspace(r *http.Request) (*files.Call, error) {
	id, tenant, err := h.sandboxTenant(r)
	if err != nil {
		return nil, err
	}
	return h.opt.Files.Open(r.Context(), tenant, id)
}

// entryInfo is envd's filesystem.EntryInfo in proto3 JSON.
type entryInfo struct {
	Name          string `json:"name"`
	Type          string `json:"type"`
	Path          string `json:"path"`
	Size          string `json:"size"` // int64: a string in proto3 JSON
	Mode          uint32 `json:"mode"`
	Permissions   string `json:"permissions"`
	Owner         string `json:"owner"`
	Group         string `json:"group"`
	ModifiedTime  string `json:"modifiedTime"`
	SymlinkTarget string `json:"symlinkTarget,omitempty"`
}

func fileType(t string) string {
	switch t {
	case "file":
		return "FILE_TYPE_FILE"
	case "dir":
		return "FILE_TYPE_DIRECTORY"
	case "symlink":
		return "FILE_TYPE_SYMLINK"
	}
	return "FILE_TYPE_UNSPECIFIED"
}

// fileMode is e's mode as Go's fs.FileMode says it ("drwxr-xr-x").
func fileMode(e workspace.Entry) fs.FileMode {
	m := e.Mode.Perm()
	switch e.Type {
	case "dir":
		m |= fs.ModeDir
	case "symlink":
		m |= fs.ModeSymlink
	case "other":
		m |= fs.ModeIrregular
	}
	return m
}

// newEntryInfo describes fi, at workspace path rel, in the caller's
// terms.
func (h *Handler) newEntryInfo(sp sandboxPath, rel string, fi workspace.Entry) entryInfo {
	owner := fi.Owner
	if owner == "" {
		owner = "unknown"
	}
	return entryInfo{
		Name: path.Base(sp.show(rel)), Type: fileType(fi.Type), Path: sp.show(rel),
		Size: strconv.FormatInt(fi.Size, 10), Mode: uint32(fi.Mode.Perm()),
		Permissions: fileMode(fi).String(), ModifiedTime: fi.ModTime.UTC().Format(time.RFC3339Nano),
		Owner: owner, Group: owner, SymlinkTarget: fi.Target,
	}
}

type pathRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

// filesystem serves the unary methods of envd's filesystem.Filesystem.
func (h *Handler) filesystem(w http.ResponseWriter, r *http.Request) {
	method := r.PathValue("method")
	switch method {
	case "Stat", "ListDir", "MakeDir", "Remove", "Move":
	default:
		// WatchDir and the watcher calls: sbx does not watch files.
		writeUnaryError(w, unimplemented("filesystem.Filesystem/%s is not supported by sbx (no file watching)", method))
		return
	}
	var req struct {
		pathRequest
		Source      string `json:"source"`
		Destination string `json:"destination"`
	}
	if err := readUnary(r, &req); err != nil {
		h.unaryError(w, r, err)
		return
	}
	ws, err := h.workspace(r)
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	defer ws.Close()
	var resp any
	switch method {
	case "Stat":
		resp, err = h.stat(r.Context(), ws, req.Path)
	case "ListDir":
		resp, err = h.listDir(r.Context(), ws, req.Path, req.Depth)
	case "MakeDir":
		resp, err = h.makeDir(r.Context(), ws, req.Path)
	case "Remove":
		resp, err = h.remove(r.Context(), ws, req.Path)
	case "Move":
		resp, err = h.move(r.Context(), ws, req.Source, req.Destination)
	}
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	writeUnary(w, resp)
}

type entryResponse struct {
	Entry entryInfo `json:"entry"`
}

func (h *Handler) entry(ctx context.Context, ws *files.Call, sp sandboxPath, rel string) (entryResponse, error) {
	fi, err := ws.Stat(ctx, rel)
	if err != nil {
		return entryResponse{}, err
	}
	return entryResponse{h.newEntryInfo(sp, rel, fi)}, nil
}

func (h *Handler) stat(ctx context.Context, ws *files.Call, p string) (any, error) {
	sp, err := resolve(p)
	if err != nil {
		return nil, err
	}
	return h.entry(ctx, ws, sp, sp.Rel)
}

// maxListed bounds a listing, as the main API's does.
const maxListed = workspace.DefaultMaxEntries

func (h *Handler) listDir(ctx context.Context, ws *files.Call, p string, depth uint32) (any, error) {
	sp, err := resolve(p)
	if err != nil {
		return nil, err
	}
	if depth == 0 {
		depth = 1
	}
	fi, err := ws.Stat(ctx, sp.Rel)
	if err != nil {
		return nil, err
	}
	link := fi.Type == "symlink"
	if fi.Type != "dir" && !link {
		return nil, fmt.Errorf("path %q is not a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	// List follows a link at the path itself while it stays inside.
	list, _, err := ws.List(ctx, sp.Rel, depth > 1, maxListed)
	if err != nil {
		return nil, err
	}
	if rel, _ := workspace.CleanPath(sp.Rel); link && len(list) == 1 && list[0].Path == rel && list[0].Type != "dir" {
		return nil, fmt.Errorf("path %q is not a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	base := 0
	if rel, _ := workspace.CleanPath(sp.Rel); rel != "." {
		base = strings.Count(rel, "/") + 1
	}
	out := struct {
		Entries []entryInfo `json:"entries"`
	}{Entries: []entryInfo{}}
	for _, e := range list {
		if uint32(strings.Count(e.Path, "/")+1-base) > depth {
			continue
		}
		fi, err := ws.Stat(ctx, e.Path)
		if err != nil {
			continue // gone since the listing
		}
		out.Entries = append(out.Entries, h.newEntryInfo(sp, e.Path, fi))
	}
	return out, nil
}

// writable resolves a path a call will write, move or remove. What may
// change there is the session's file policy's to say (files.Call): the
// same for every front door, and decided on the real file, not this text.
func writable(p string) (sandboxPath, error) {
	sp, err := resolve(p)
	if err != nil {
		return sp, err
	}
	_, err = workspace.CleanPath(sp.Rel)
	return sp, err
}

func (h *Handler) makeDir(ctx context.Context, ws *files.Call, p string) (any, error) {
	sp, err := writable(p)
	if err != nil {
		return nil, err
	}
	if err := ws.MakeDir(ctx, sp.Rel); err != nil {
		return nil, err
	}
	return h.entry(ctx, ws, sp, sp.Rel)
}

func (h *Handler) remove(ctx context.Context, ws *files.Call, p string) (any, error) {
	sp, err := writable(p)
	if err != nil {
		return nil, err
	}
	if err := ws.Remove(ctx, sp.Rel, true); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

func (h *Handler) move(ctx context.Context, ws *files.Call, from, to string) (any, error) {
	src, err := writable(from)
	if err != nil {
		return nil, err
	}
	dst, err := writable(to)
	if err != nil {
		return nil, err
	}
	if err := ws.Move(ctx, src.Rel, dst.Rel); err != nil {
		return nil, err
	}
	return h.entry(ctx, ws, dst, dst.Rel)
}

// readFile: GET /files?path=: the file's bytes (ranges too).
func (h *Handler) readFile(w http.ResponseWriter, r *http.Request) {
	sp, err := resolve(r.URL.Query().Get("path"))
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	ws, err := h.workspace(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	defer ws.Close()
	f, err := ws.Open(r.Context(), sp.Rel)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", f.Info().ModTime, f)
}

// writtenFile is envd's EntryInfo of the /files API.
type writtenFile struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// writeFiles: POST /files?path=: multipart (field "file"; each part's
// file name is its path when the query has none) or the raw bytes
// (application/octet-stream, gzip allowed) of one file. Each file is
// streamed to the workspace, owned by the sandbox user, through the
// session's file policy: the upload limits of the main API's uploads, and
// an upload record.
func (h *Handler) writeFiles(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query().Get("path")
	ws, err := h.workspace(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	defer ws.Close()
	save := func(p, mediaType string, body io.Reader) (writtenFile, error) {
		sp, err := writable(p)
		if err != nil {
			return writtenFile{}, err
		}
		saved, err := ws.Write(r.Context(), files.FileWrite{Path: sp.Rel, MediaType: mediaType, Body: body})
		if err != nil {
			return writtenFile{}, err
		}
		return writtenFile{Name: path.Base(saved.Path), Type: "file", Path: sp.show(saved.Path)}, nil
	}
	out := []writtenFile{}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case mt == "multipart/form-data" && params["boundary"] != "":
		mr, err := r.MultipartReader()
		if err != nil {
			h.writeErr(w, r, invalid("multipart body: %v", err))
			return
		}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				h.writeErr(w, r, invalid("multipart body: %v", err))
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			p := query
			if p == "" {
				// Not part.FileName(): that keeps only the base name.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				p = dp["filename"]
			}
			f, err := save(p, part.Header.Get("Content-Type"), part)
			part.Close()
			if err != nil {
				h.writeUploadErr(w, r, err)
				return
			}
			out = append(out, f)
		}
	case mt == "application/octet-stream" || mt == "":
		var body io.Reader = r.Body
		switch enc := strings.ToLower(r.Header.Get("Content-Encoding")); enc {
		case "", "identity":
		case "gzip":
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				h.writeErr(w, r, invalid("gzip body: %v", err))
				return
			}
			defer zr.Close()
			body = zr
		default:
			h.writeErr(w, r, invalid("Content-Encoding %q: only gzip is supported", enc))
			return
		}
		f, err := save(query, mt, body)
		if err != nil {
			h.writeUploadErr(w, r, err)
			return
		}
		out = append(out, f)
	default:
		h.writeErr(w, r, invalid("Content-Type %q: want multipart/form-data or application/octet-stream", mt))
		return
	}
	if len(out) == 0 {
		h.writeErr(w, r, invalid(`no file in the request: send a multipart part named "file"`))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// writeUploadErr answers a failed write: over the session's size limit
// (or a full workspace disk) is 413, a type the session does not allow
// 415, a broken body 400.
func (h *Handler) writeUploadErr(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, errdefs.ErrResourceExhausted):
		writeAPIError(w, http.StatusRequestEntityTooLarge, err.Error())
	case errors.Is(err, errdefs.ErrUnsupportedType):
		writeAPIError(w, http.StatusUnsupportedMediaType, err.Error())
	case errors.Is(err, gzip.ErrHeader), errors.Is(err, gzip.ErrChecksum), errors.Is(err, io.ErrUnexpectedEOF):
		writeAPIError(w, http.StatusBadRequest, "request body: "+err.Error())
	default:
		h.writeErr(w, r, err)
	}
}
