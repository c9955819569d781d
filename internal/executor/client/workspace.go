package client

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"sync"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Workspace is a sandbox's workspace reached through its executor's file
// routes (PROTOCOL.md, "Files"): the executor does every operation with a
// workspace.Local inside the sandbox, so the guarantees against the
// sandbox's own changes are that type's. What this side adds is distrust
// of the answers: the executor may have been replaced by the sandbox's
// code, so every answer is bounded before it is read and checked before
// it is handed on (paths clean and where they were asked for, sizes that
// add up, contents of the length their description says), and one that
// fails is ErrBadResponse.
type Workspace struct {
	c *Client
	// maxArchive bounds an export's bytes.
	maxArchive int64
}

var _ workspace.Workspace = (*Workspace)(nil)

// NewWorkspace returns the workspace of c's sandbox. maxArchive bounds
// the bytes Export takes from it (the workspace's disk limit and some
// room for the archive's headers, say); <= 0 means no bound but the
// archive's entry count.
func NewWorkspace(c *Client, maxArchive int64) *Workspace {
	return &Workspace{c: c, maxArchive: maxArchive}
}

// Close releases nothing: the client belongs to the caller.
func (w *Workspace) Close() error { return nil }

func query(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			v.Set(kv[i], kv[i+1])
		}
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

func bad(route, format string, args ...any) error {
	return fmt.Errorf("executor %s: %w: "+format, append([]any{route, ErrBadResponse}, args...)...)
}

// send makes a request with a streamed body (nil for none) and returns
// the response of a 2xx answer, or the executor's error.
func (w *Workspace) send(ctx context.Context, method, route, q string, body io.Reader, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, clientBase+route+q, body)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body == nil {
		// Safe to send again on a new connection if a kept-alive one
		// turns out dead before any answer (see Client.do).
		req.Header.Set("X-Idempotency-Key", method+" "+route)
	}
	resp, err := w.c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("executor %s %s: %w: %w", method, route, ErrNoAnswer, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, errorResponse(resp)
	}
	return resp, nil
}

// errorResponse reads an error answer (at most maxSmallResponse of it).
func errorResponse(resp *http.Response) error {
	var eb wire.ErrorBody
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxSmallResponse))
	if json.Unmarshal(b, &eb) != nil || eb.Error.Code == "" {
		return &APIError{Status: resp.StatusCode, Code: "internal", Message: string(bytes.TrimSpace(b))}
	}
	return &APIError{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
}

// decode reads one JSON answer of at most max bytes into out, and the
// end of the body.
func decode(resp *http.Response, route string, max int64, out any) error {
	defer resp.Body.Close()
	body := &boundedReader{r: resp.Body, n: max, max: max, what: "the answer to " + route}
	if err := json.NewDecoder(body).Decode(out); err != nil {
		if errors.Is(err, ErrBadResponse) {
			return fmt.Errorf("executor %s: %w", route, err)
		}
		return bad(route, "undecodable answer: %v", err)
	}
	if _, err := io.Copy(io.Discard, body); err != nil {
		return fmt.Errorf("executor %s: %w", route, err)
	}
	return nil
}

// call makes a request without a body and reads its JSON answer (none
// for out == nil: a 204).
func (w *Workspace) call(ctx context.Context, method, route, q string, max int64, out any) error {
	resp, err := w.send(ctx, method, route, q, nil, nil)
	if err != nil {
		return err
	}
	if out == nil {
		defer resp.Body.Close()
		_, err := io.Copy(io.Discard, &boundedReader{r: resp.Body, n: maxSmallResponse, what: "the answer to " + route})
		return err
	}
	return decode(resp, route, max, out)
}

// Stat describes what is at rel, as the sandbox's workspace.Local does.
func (w *Workspace) Stat(ctx context.Context, rel string) (workspace.Entry, error) {
	rel, err := workspace.CleanPath(rel)
	if err != nil {
		return workspace.Entry{}, err
	}
	var e workspace.Entry
	if err := w.call(ctx, http.MethodGet, wire.FilesStat, query("path", rel), wire.MaxEntryJSON, &e); err != nil {
		return workspace.Entry{}, err
	}
	if err := checkEntry(e, rel, true); err != nil {
		return workspace.Entry{}, bad(wire.FilesStat, "%v", err)
	}
	return e, nil
}

// checkEntry checks an entry an executor described: a clean path (want,
// if exact), a name that is its last component, a known type and owner,
// a size that is not negative and permission bits only.
func checkEntry(e workspace.Entry, want string, exact bool) error {
	p, err := workspace.CleanPath(e.Path)
	switch {
	case err != nil || p != e.Path:
		return fmt.Errorf("an entry with the path %.200q", e.Path)
	case exact && e.Path != want:
		return fmt.Errorf("an entry of %.200q when %.200q was asked for", e.Path, want)
	case !exact && !below(e.Path, want):
		return fmt.Errorf("an entry %.200q outside the directory %.200q listed", e.Path, want)
	case e.Name != path.Base(e.Path):
		return fmt.Errorf("an entry named %.200q at %.200q", e.Name, e.Path)
	case e.Size < 0:
		return fmt.Errorf("an entry %.200q of %d bytes", e.Path, e.Size)
	case e.Mode&^0o777 != 0:
		return fmt.Errorf("an entry %.200q with mode %v", e.Path, e.Mode)
	case len(e.Target) >= workspace.MaxPathLen:
		return fmt.Errorf("an entry %.200q with a link target of %d bytes", e.Path, len(e.Target))
	}
	switch e.Type {
	case "file", "dir", "symlink", "other":
	default:
		return fmt.Errorf("an entry %.200q of type %.32q", e.Path, e.Type)
	}
	switch e.Owner {
	case "", workspace.OwnerRoot, workspace.OwnerUser:
	default:
		return fmt.Errorf("an entry %.200q owned by %.32q", e.Path, e.Owner)
	}
	return nil
}

// below reports whether p is strictly below the directory dir.
func below(p, dir string) bool {
	if dir == "." {
		return p != "."
	}
	return len(p) > len(dir)+1 && p[:len(dir)] == dir && p[len(dir)] == '/'
}

// List lists the directory at rel (or describes the file there), at most
// maxEntries entries (workspace.DefaultMaxEntries if <= 0; past
// wire.MaxListEntries, that many). The listing streams a line an entry;
// each line is bounded, and so is their number.
func (w *Workspace) List(ctx context.Context, rel string, recursive bool, maxEntries int) ([]workspace.Entry, bool, error) {
	rel, err := workspace.CleanPath(rel)
	if err != nil {
		return nil, false, err
	}
	if maxEntries <= 0 {
		maxEntries = workspace.DefaultMaxEntries
	}
	maxEntries = min(maxEntries, wire.MaxListEntries)
	q := query("path", rel, "recursive", strconv.FormatBool(recursive), "max_entries", strconv.Itoa(maxEntries))
	resp, err := w.send(ctx, http.MethodGet, wire.FilesList, q, nil, nil)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	lines := newLineReader(resp.Body, wire.MaxEntryJSON)
	entries := []workspace.Entry{}
	for {
		line, err := lines.next()
		if errors.Is(err, errLineTooLong) {
			return nil, false, bad(wire.FilesList, "a line of more than %d bytes", wire.MaxEntryJSON)
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, false, fmt.Errorf("executor %s: the listing ended before its end: %w: %w", wire.FilesList, ErrBadResponse, err)
		}
		var l wire.ListLine
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, false, bad(wire.FilesList, "an undecodable line: %v", err)
		}
		if l.End {
			if l.Entry != nil {
				return nil, false, bad(wire.FilesList, "an end line with an entry")
			}
			if err := checkListing(entries, rel, recursive); err != nil {
				return nil, false, bad(wire.FilesList, "%v", err)
			}
			// Nothing follows the end but the end of the body.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
			return entries, l.Truncated, nil
		}
		if l.Entry == nil {
			return nil, false, bad(wire.FilesList, "a line with neither an entry nor the end")
		}
		if len(entries) == maxEntries {
			return nil, false, bad(wire.FilesList, "more than the %d entries asked for", maxEntries)
		}
		entries = append(entries, *l.Entry)
	}
}

// checkListing checks a listing of rel: either the one file at rel, or
// entries below it (directly below unless recursive), each once, in the
// order workspace.Local lists them.
func checkListing(entries []workspace.Entry, rel string, recursive bool) error {
	if len(entries) == 1 && entries[0].Path == rel && rel != "." {
		if entries[0].Type == "dir" {
			return fmt.Errorf("a directory %.200q listed as itself", rel)
		}
		return checkEntry(entries[0], rel, true)
	}
	for i, e := range entries {
		if err := checkEntry(e, rel, false); err != nil {
			return err
		}
		if !recursive && path.Dir(e.Path) != rel {
			return fmt.Errorf("an entry %.200q not directly in %.200q", e.Path, rel)
		}
		if i > 0 && comparePaths(entries[i-1].Path, e.Path) >= 0 {
			return fmt.Errorf("entries out of order or twice: %.200q, then %.200q", entries[i-1].Path, e.Path)
		}
	}
	return nil
}

// comparePaths orders paths as workspace.Local's listings are ordered:
// component by component, so that a directory's contents follow it.
func comparePaths(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := a[i], b[i]
		switch {
		case ca == cb:
			continue
		case ca == '/':
			return -1
		case cb == '/':
			return 1
		}
		return int(ca) - int(cb)
	}
	return len(a) - len(b)
}

// Save streams r into the file at rel. The client counts and hashes what
// it sends, and the executor's account of what it saved must match.
func (w *Workspace) Save(ctx context.Context, rel string, r io.Reader, maxBytes int64) (workspace.SavedFile, error) {
	rel, err := workspace.CleanPath(rel)
	if err != nil {
		return workspace.SavedFile{}, err
	}
	return w.save(ctx, wire.FilesContent, query("path", rel, "max_bytes", limitParam(maxBytes)), rel, r, maxBytes)
}

// SaveUpload saves a conversation's upload (see workspace.Local).
func (w *Workspace) SaveUpload(ctx context.Context, cid, rel string, r io.Reader, maxBytes int64) (workspace.SavedFile, error) {
	if !workspace.ValidID(cid) {
		return workspace.SavedFile{}, fmt.Errorf("conversation id %.200q: want 1-128 of [A-Za-z0-9._-], not starting with . _ - and without \"..\": %w", cid, errdefs.ErrInvalidArgument)
	}
	rel, err := workspace.CleanPath(rel)
	if err != nil {
		return workspace.SavedFile{}, err
	}
	q := query("conversation_id", cid, "path", rel, "max_bytes", limitParam(maxBytes))
	return w.save(ctx, wire.FilesUpload, q, path.Join(workspace.ConversationDir(cid), rel), r, maxBytes)
}

func limitParam(maxBytes int64) string {
	if maxBytes <= 0 {
		return ""
	}
	return strconv.FormatInt(maxBytes, 10)
}

func (w *Workspace) save(ctx context.Context, route, q, want string, r io.Reader, maxBytes int64) (workspace.SavedFile, error) {
	sent := &hashingReader{r: r, h: sha256.New()}
	// The transport reads the body on a goroutine of its own, which may
	// still hold r when the answer has come (an early error): the body
	// given to it is closed on return, and r is not read after that.
	body := &guardedReader{r: sent}
	defer body.Close()
	resp, err := w.send(ctx, http.MethodPut, route, q, body, http.Header{"Content-Type": {"application/octet-stream"}})
	// An answer has come (or none will): what was sent is what the
	// executor had to go on. Closing also orders the reads below after
	// the transport's last read of sent.
	body.Close()
	if err != nil {
		if sent.err != nil && !errors.As(err, new(*APIError)) {
			// The upload's reader failed, not the executor.
			return workspace.SavedFile{}, fmt.Errorf("path %.200q: reading the upload: %w", want, sent.err)
		}
		return workspace.SavedFile{}, err
	}
	var saved workspace.SavedFile
	if err := decode(resp, route, maxSmallResponse, &saved); err != nil {
		return workspace.SavedFile{}, err
	}
	sum := hex.EncodeToString(sent.h.Sum(nil))
	switch {
	case saved.Path != want:
		return workspace.SavedFile{}, bad(route, "saved %.200q, not %.200q", saved.Path, want)
	case !sent.eof:
		return workspace.SavedFile{}, bad(route, "answered before it had read the whole upload")
	case saved.Size != sent.n || saved.SHA256 != sum:
		return workspace.SavedFile{}, bad(route, "saved %d bytes hashing to %.64q; %d bytes hashing to %s were sent", saved.Size, saved.SHA256, sent.n, sum)
	}
	return saved, nil
}

// hashingReader counts and hashes what is read through it.
type hashingReader struct {
	r   io.Reader
	h   hash.Hash
	n   int64
	eof bool
	err error
}

func (s *hashingReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.h.Write(p[:n])
	s.n += int64(n)
	switch {
	case err == io.EOF:
		s.eof = true
	case err != nil:
		s.err = err
	}
	return n, err
}

// guardedReader stops reading its reader once closed, so that a caller's
// reader is never read after the call that was given it returned.
type guardedReader struct {
	mu     sync.Mutex
	r      io.Reader
	closed bool
}

func (g *guardedReader) Read(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return 0, errors.New("the upload is over")
	}
	return g.r.Read(p)
}

func (g *guardedReader) Close() error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	return nil
}

// MakeDir makes the directory rel and its missing parents.
func (w *Workspace) MakeDir(ctx context.Context, rel string) error {
	rel, err := workspace.CleanPath(rel)
	if err != nil {
		return err
	}
	return w.call(ctx, http.MethodPost, wire.FilesMkdir, query("path", rel), 0, nil)
}

// Rename moves what is at from to to.
func (w *Workspace) Rename(ctx context.Context, from, to string) error {
	from, err := workspace.CleanPath(from)
	if err != nil {
		return err
	}
	if to, err = workspace.CleanPath(to); err != nil {
		return err
	}
	return w.call(ctx, http.MethodPost, wire.FilesRename, query("from", from, "to", to), 0, nil)
}

// Remove removes what is at rel; a directory only if recursive.
func (w *Workspace) Remove(ctx context.Context, rel string, recursive bool) error {
	return w.remove(ctx, wire.FilesContent, rel, recursive)
}

// RemoveUpload removes an upload, or a directory of them.
func (w *Workspace) RemoveUpload(ctx context.Context, rel string, recursive bool) error {
	return w.remove(ctx, wire.FilesUpload, rel, recursive)
}

func (w *Workspace) remove(ctx context.Context, route, rel string, recursive bool) error {
	rel, err := workspace.CleanPath(rel)
	if err != nil {
		return err
	}
	return w.call(ctx, http.MethodDelete, route, query("path", rel, "recursive", strconv.FormatBool(recursive)), 0, nil)
}

// RemoveConversation removes everything kept for conversation cid.
func (w *Workspace) RemoveConversation(ctx context.Context, cid string) error {
	if !workspace.ValidID(cid) {
		return fmt.Errorf("conversation id %.200q: want 1-128 of [A-Za-z0-9._-], not starting with . _ - and without \"..\": %w", cid, errdefs.ErrInvalidArgument)
	}
	return w.call(ctx, http.MethodDelete, wire.FilesConvo, query("conversation_id", cid), 0, nil)
}

// Usage counts the workspace's bytes and files.
func (w *Workspace) Usage(ctx context.Context) (int64, int, error) {
	var u wire.Usage
	if err := w.call(ctx, http.MethodGet, wire.FilesUsage, "", maxSmallResponse, &u); err != nil {
		return 0, 0, err
	}
	if u.Bytes < 0 || u.Files < 0 || u.Files > wire.MaxListEntries {
		return 0, 0, bad(wire.FilesUsage, "a usage of %d bytes in %d files", u.Bytes, u.Files)
	}
	return u.Bytes, u.Files, nil
}

// Resources lists the resources in place.
func (w *Workspace) Resources(ctx context.Context) ([]workspace.Resource, error) {
	var rs wire.Resources
	if err := w.call(ctx, http.MethodGet, wire.FilesResources, "", wire.MaxManifestJSON, &rs); err != nil {
		return nil, err
	}
	checked, err := workspace.CheckManifest(rs.Resources)
	if err != nil {
		return nil, bad(wire.FilesResources, "%v", err)
	}
	return checked, nil
}

// Export writes the workspace's archive to out as the executor streams
// it, reading it as a tar stream on the way: at most
// workspace.MaxArchiveEntries entries and the bound NewWorkspace was
// given, and nothing after the archive's end. What was written before a
// failure is not an archive; the caller drops it.
func (w *Workspace) Export(ctx context.Context, out io.Writer) error {
	resp, err := w.send(ctx, http.MethodGet, wire.FilesArchive, "", nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var src io.Reader = resp.Body
	if w.maxArchive > 0 {
		src = &boundedReader{r: src, n: w.maxArchive, max: w.maxArchive, what: "the archive"}
	}
	tee := &teeReader{r: src, w: out}
	tr := tar.NewReader(tee)
	for n := 0; ; n++ {
		_, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return w.exportError(tee, err)
		}
		if n >= workspace.MaxArchiveEntries {
			return bad(wire.FilesArchive, "more than %d entries", workspace.MaxArchiveEntries)
		}
	}
	// The archive's end may be followed by nothing.
	var one [1]byte
	if n, _ := io.ReadFull(src, one[:]); n > 0 {
		return bad(wire.FilesArchive, "data after the archive's end")
	}
	return nil
}

func (w *Workspace) exportError(tee *teeReader, err error) error {
	switch {
	case tee.werr != nil:
		return fmt.Errorf("executor %s: writing the archive: %w", wire.FilesArchive, tee.werr)
	case errors.Is(err, ErrBadResponse):
		return fmt.Errorf("executor %s: %w", wire.FilesArchive, err)
	}
	return bad(wire.FilesArchive, "not a whole archive: %v", err)
}

// teeReader is io.TeeReader that tells a failed write from a failed read.
type teeReader struct {
	r    io.Reader
	w    io.Writer
	werr error
}

func (t *teeReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		if _, werr := t.w.Write(p[:n]); werr != nil {
			t.werr = werr
			return n, werr
		}
	}
	return n, err
}

// Import replaces the workspace's content with the archive r; the
// executor checks every entry (workspace.Local.Import).
func (w *Workspace) Import(ctx context.Context, r io.Reader) error {
	body := &guardedReader{r: r}
	defer body.Close()
	resp, err := w.send(ctx, http.MethodPut, wire.FilesArchive, "", body, http.Header{"Content-Type": {"application/x-tar"}})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, &boundedReader{r: resp.Body, n: maxSmallResponse, what: "the answer to " + wire.FilesArchive})
	return err
}
