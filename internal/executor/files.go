package executor

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"syscall"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// FilesHandler serves the file routes (PROTOCOL.md, "Files") on ws: every
// call of workspace.Workspace, done by ws itself, so that a workspace
// reached through the executor keeps every guarantee of a local one (it
// is one, inside the sandbox). It needs no zygote: Server.Handler mounts
// it, and tests serve it on its own.
func FilesHandler(ws *workspace.Local) http.Handler {
	f := &files{ws: ws}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+wire.FilesStat, f.stat)
	mux.HandleFunc("GET "+wire.FilesList, f.list)
	mux.HandleFunc("GET "+wire.FilesContent, f.download)
	mux.HandleFunc("PUT "+wire.FilesContent, f.save)
	mux.HandleFunc("DELETE "+wire.FilesContent, f.remove)
	mux.HandleFunc("PUT "+wire.FilesUpload, f.saveUpload)
	mux.HandleFunc("DELETE "+wire.FilesUpload, f.removeUpload)
	mux.HandleFunc("DELETE "+wire.FilesConvo, f.removeConversation)
	mux.HandleFunc("POST "+wire.FilesMkdir, f.mkdir)
	mux.HandleFunc("POST "+wire.FilesRename, f.rename)
	mux.HandleFunc("GET "+wire.FilesResources, f.resources)
	mux.HandleFunc("POST "+wire.FilesResources, f.syncResources)
	mux.HandleFunc("GET "+wire.FilesUsage, f.usage)
	mux.HandleFunc("GET "+wire.FilesArchive, f.export)
	mux.HandleFunc("PUT "+wire.FilesArchive, f.importArchive)
	mux.HandleFunc("/files/", func(w http.ResponseWriter, r *http.Request) {
		writeErrorStatus(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

type files struct {
	ws *workspace.Local
}

// flag reads a boolean query parameter: absent is false.
func flag(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%.32q: want true or false: %w", name, v, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// number reads a non-negative integer query parameter: absent is 0.
func number(r *http.Request, name string, max int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > max {
		return 0, fmt.Errorf("%s=%.32q: want an integer in 0..%d: %w", name, v, max, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

func (f *files) stat(w http.ResponseWriter, r *http.Request) {
	e, err := f.ws.Stat(r.Context(), r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

// list streams the listing a line an entry: the client reads it a line at
// a time, each bounded, instead of one document as large as the listing.
func (f *files) list(w http.ResponseWriter, r *http.Request) {
	recursive, err := flag(r, "recursive")
	if err != nil {
		writeError(w, err)
		return
	}
	max, err := number(r, "max_entries", wire.MaxListEntries)
	if err != nil {
		writeError(w, err)
		return
	}
	entries, truncated, err := f.ws.List(r.Context(), r.URL.Query().Get("path"), recursive, int(max))
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	for i := range entries {
		if enc.Encode(wire.ListLine{Entry: &entries[i]}) != nil {
			return // the client is gone
		}
	}
	_ = enc.Encode(wire.ListLine{End: true, Truncated: truncated})
}

// download serves the file by http.ServeContent, ranges included. The
// ETag names the file opened (device, inode, time, size), so that a range
// asked for with If-Range of another file (the sandbox replaced it
// since) gets the whole new file, which the client refuses, rather than a
// piece of it.
func (f *files) download(w http.ResponseWriter, r *http.Request) {
	file, err := f.ws.Open(r.Context(), r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer file.Close()
	info := file.Info()
	b, err := json.Marshal(info)
	if err != nil {
		writeError(w, err)
		return
	}
	h := w.Header()
	h.Set(wire.FilesEntryHeader, base64.RawURLEncoding.EncodeToString(b))
	h.Set("Content-Type", "application/octet-stream") // no sniffing
	h.Set("ETag", etag(file, info))
	// The size is the one the description says, taken when the file was
	// opened: a file code appends to meanwhile is served as it was then,
	// not announced at one size and described at another.
	http.ServeContent(w, r, "", info.ModTime, &asOpened{file: file, size: info.Size})
}

// asOpened is a file as large as it was when opened: reads stop there,
// and its end is there, whatever is appended since.
type asOpened struct {
	file io.ReadSeeker
	size int64
	pos  int64
}

func (a *asOpened) Read(p []byte) (int, error) {
	if a.pos >= a.size {
		return 0, io.EOF
	}
	if rest := a.size - a.pos; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := a.file.Read(p)
	a.pos += int64(n)
	if err == io.EOF && a.pos < a.size {
		err = io.ErrUnexpectedEOF // cut shorter than it was: the client refuses the body
	}
	return n, err
}

func (a *asOpened) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		off += a.pos
	case io.SeekEnd:
		off += a.size
	}
	if off < 0 {
		return 0, errors.New("seek before the start")
	}
	if _, err := a.file.Seek(off, io.SeekStart); err != nil {
		return 0, err
	}
	a.pos = off
	return off, nil
}

func etag(file workspace.File, info workspace.Entry) string {
	var dev, ino uint64
	if s, ok := file.(interface{ Stat() (fs.FileInfo, error) }); ok {
		if fi, err := s.Stat(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				dev, ino = st.Dev, st.Ino
			}
		}
	}
	return fmt.Sprintf(`"%x-%x-%x-%x"`, dev, ino, info.ModTime.UnixNano(), info.Size)
}

func (f *files) save(w http.ResponseWriter, r *http.Request) {
	max, err := number(r, "max_bytes", 1<<62)
	if err != nil {
		writeError(w, err)
		return
	}
	saved, err := f.ws.Save(r.Context(), r.URL.Query().Get("path"), r.Body, max)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, saved)
}

func (f *files) saveUpload(w http.ResponseWriter, r *http.Request) {
	max, err := number(r, "max_bytes", 1<<62)
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	saved, err := f.ws.SaveUpload(r.Context(), q.Get("conversation_id"), q.Get("path"), r.Body, max)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, saved)
}

func (f *files) remove(w http.ResponseWriter, r *http.Request) {
	f.removeWith(w, r, f.ws.Remove)
}

func (f *files) removeUpload(w http.ResponseWriter, r *http.Request) {
	f.removeWith(w, r, f.ws.RemoveUpload)
}

func (f *files) removeWith(w http.ResponseWriter, r *http.Request, remove func(context.Context, string, bool) error) {
	recursive, err := flag(r, "recursive")
	if err == nil {
		err = remove(r.Context(), r.URL.Query().Get("path"), recursive)
	}
	done(w, err)
}

func (f *files) removeConversation(w http.ResponseWriter, r *http.Request) {
	done(w, f.ws.RemoveConversation(r.Context(), r.URL.Query().Get("conversation_id")))
}

func (f *files) mkdir(w http.ResponseWriter, r *http.Request) {
	done(w, f.ws.MakeDir(r.Context(), r.URL.Query().Get("path")))
}

func (f *files) rename(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	done(w, f.ws.Rename(r.Context(), q.Get("from"), q.Get("to")))
}

// done answers a call that returns nothing but its error.
func done(w http.ResponseWriter, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (f *files) resources(w http.ResponseWriter, r *http.Request) {
	res, err := f.ws.Resources(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.Resources{Resources: res})
}

func (f *files) usage(w http.ResponseWriter, r *http.Request) {
	bytes, n, err := f.ws.Usage(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.Usage{Bytes: bytes, Files: n})
}

// export streams the archive. Once the first byte is out an error can
// only cut the stream short, which the client notices (a tar stream
// without its end).
func (f *files) export(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-tar")
	cw := &countingResponse{w: w}
	if err := f.ws.Export(r.Context(), cw); err != nil {
		if cw.n == 0 {
			w.Header().Del("Content-Type")
			writeError(w, err)
			return
		}
		panic(http.ErrAbortHandler) // the connection is cut, not ended
	}
}

type countingResponse struct {
	w http.ResponseWriter
	n int64
}

func (c *countingResponse) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (f *files) importArchive(w http.ResponseWriter, r *http.Request) {
	done(w, f.ws.Import(r.Context(), r.Body))
}

// syncResources takes a tar stream: the manifest (wire.Resources, named
// wire.ResourceManifestName), then the contents the client has for the
// resources not in place, each named by its SHA-256. The contents are
// staged in the workspace (so they count against its disk, not the
// sandbox's memory), checked against their names as they are written,
// and then placed by Local.SyncResources, which checks them again.
func (f *files) syncResources(w http.ResponseWriter, r *http.Request) {
	res, err := f.sync(r.Context(), tar.NewReader(r.Body))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.ResourceSync{
		Needed: orEmpty(res.Needed), Added: orEmpty(res.Added), Changed: orEmpty(res.Changed),
		Removed: orEmpty(res.Removed), Unchanged: res.Unchanged,
	})
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func badSync(format string, args ...any) error {
	return fmt.Errorf("resource sync: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

func (f *files) sync(ctx context.Context, tr *tar.Reader) (workspace.ResourceSync, error) {
	var none workspace.ResourceSync
	h, err := tr.Next()
	if err != nil || h.Name != wire.ResourceManifestName || h.Typeflag != tar.TypeReg {
		return none, badSync("the body must be a tar stream starting with %s", wire.ResourceManifestName)
	}
	if h.Size > wire.MaxManifestJSON {
		return none, badSync("a manifest of %d bytes, more than %d", h.Size, wire.MaxManifestJSON)
	}
	var m wire.Resources
	if err := json.NewDecoder(io.LimitReader(tr, h.Size)).Decode(&m); err != nil {
		return none, badSync("manifest: %v", err)
	}
	want, err := workspace.CheckManifest(m.Resources)
	if err != nil {
		return none, fmt.Errorf("resource sync: %w", err)
	}
	sizes := make(map[string]int64, len(want))
	for _, r := range want {
		sizes[r.SHA256] = r.Size
	}
	// The staging area is a conversation's upload directory no client can
	// name (a random id): uploads/ belongs to the sandbox's root, so the
	// sandbox can read what is staged there (it is about to be a resource
	// anyway) but not change it; and if the sandbox renamed uploads/ away
	// and staged files land in its own directory, Local.SyncResources
	// still refuses content that is not what the manifest says.
	staging := "sbx-resource-staging-" + strings.ToLower(rand.Text())
	defer f.ws.RemoveConversation(context.WithoutCancel(ctx), staging)
	staged := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return none, badSync("%v", err)
		}
		size, ok := sizes[h.Name]
		switch {
		case h.Typeflag != tar.TypeReg:
			return none, badSync("entry %.80q is not a regular file", h.Name)
		case !ok:
			return none, badSync("entry %.80q is the content of no resource of the manifest", h.Name)
		case staged[h.Name] != "":
			return none, badSync("entry %.80q comes twice", h.Name)
		case h.Size != size:
			return none, badSync("entry %.80q has %d bytes, the manifest says %d", h.Name, h.Size, size)
		}
		saved, err := f.ws.SaveUpload(ctx, staging, h.Name, tr, size)
		if err != nil {
			return none, fmt.Errorf("resource sync: staging %.80q: %w", h.Name, err)
		}
		if saved.Size != size || saved.SHA256 != h.Name {
			return none, badSync("entry %.80q holds %d bytes hashing to %s", h.Name, saved.Size, saved.SHA256)
		}
		staged[h.Name] = saved.Path
	}
	content := func(ctx context.Context, sum string) (io.ReadCloser, int64, error) {
		p, ok := staged[sum]
		if !ok {
			return nil, 0, fmt.Errorf("content %s: not sent: %w", sum, errdefs.ErrNotFound)
		}
		file, err := f.ws.Open(ctx, p)
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				// Gone from a directory the sandbox made: as if not sent.
				err = fmt.Errorf("content %s: staged, then gone: %w", sum, errdefs.ErrFailedPrecondition)
			}
			return nil, 0, err
		}
		return file, file.Info().Size, nil
	}
	return f.ws.SyncResources(ctx, want, content)
}
