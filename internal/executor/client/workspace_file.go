package client

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Open opens the regular file at rel for reading. The file's reads
// belong to ctx: they fail once it is done. Reading from the start
// streams the first answer; a Seek elsewhere costs a Range request on
// the next Read, tied by If-Range to the file first opened, so that a
// file the sandbox replaced meanwhile fails the read
// (errdefs.ErrFailedPrecondition) rather than mixes two files. Whatever
// the executor says, a read gives exactly the bytes of the file's Info
// size, never more.
func (w *Workspace) Open(ctx context.Context, rel string) (workspace.File, error) {
	rel, err := workspace.CleanPath(rel)
	if err != nil {
		return nil, err
	}
	resp, err := w.send(ctx, http.MethodGet, wire.FilesContent, query("path", rel), nil, nil)
	if err != nil {
		return nil, err
	}
	f := &remoteFile{ctx: ctx, w: w, rel: rel, etag: resp.Header.Get("ETag")}
	if err := f.describe(resp); err != nil {
		resp.Body.Close()
		return nil, err
	}
	if err := f.attach(resp, 0, false); err != nil {
		return nil, err
	}
	return f, nil
}

// remoteFile is a File read through the executor.
type remoteFile struct {
	ctx  context.Context
	w    *Workspace
	rel  string
	info workspace.Entry
	etag string

	mu      sync.Mutex
	pos     int64         // where the next Read reads
	body    io.ReadCloser // an answer positioned at bodyPos, or nil
	bodyPos int64
	closed  bool
}

// describe reads the file's Info from the answer's header.
func (f *remoteFile) describe(resp *http.Response) error {
	raw := resp.Header.Get(wire.FilesEntryHeader)
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if raw == "" || err != nil || len(b) > wire.MaxEntryJSON {
		return bad(wire.FilesContent, "no description of the file (%d bytes of %s)", len(raw), wire.FilesEntryHeader)
	}
	if err := json.Unmarshal(b, &f.info); err != nil {
		return bad(wire.FilesContent, "an undecodable description of the file: %v", err)
	}
	if err := checkEntry(f.info, f.rel, true); err != nil {
		return bad(wire.FilesContent, "%v", err)
	}
	if f.info.Type != "file" {
		return bad(wire.FilesContent, "served %.200q, a %s", f.rel, f.info.Type)
	}
	return nil
}

// attach makes resp, an answer starting at off, the body to read from,
// after checking that it is the answer asked for: the whole file (200)
// for the first request; for a later one, which asks for the range off-
// with If-Range, that range of the same file (206), at 0 too (a reader
// that sniffed the start, as http.ServeContent does, reads it again);
// never a length other than the rest of the file.
func (f *remoteFile) attach(resp *http.Response, off int64, ranged bool) error {
	size := f.info.Size
	fail := func(err error) error {
		resp.Body.Close()
		return err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if ranged {
			// If-Range did not match: the whole of another file.
			return fail(fmt.Errorf("file %.200q: changed since it was opened: %w", f.rel, errdefs.ErrFailedPrecondition))
		}
	case http.StatusPartialContent:
		want := fmt.Sprintf("bytes %d-%d/%d", off, size-1, size)
		switch got := resp.Header.Get("Content-Range"); {
		case !ranged:
			return fail(bad(wire.FilesContent, "a range %.80q when the whole file was asked for", got))
		case got != want:
			return fail(bad(wire.FilesContent, "a range %.80q when %q was asked for", got, want))
		}
	default:
		return fail(bad(wire.FilesContent, "status %d for a download", resp.StatusCode))
	}
	if resp.ContentLength >= 0 && resp.ContentLength != size-off {
		return fail(bad(wire.FilesContent, "%d bytes announced for %d bytes of %.200q", resp.ContentLength, size-off, f.rel))
	}
	f.body, f.bodyPos = resp.Body, off
	return nil
}

func (f *remoteFile) Info() workspace.Entry { return f.info }

func (f *remoteFile) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, fmt.Errorf("file %.200q: %w", f.rel, errors.New("read after close"))
	}
	size := f.info.Size
	if f.pos >= size {
		return 0, io.EOF
	}
	if f.body == nil || f.bodyPos != f.pos {
		if err := f.request(); err != nil {
			return 0, err
		}
	}
	if int64(len(p)) > size-f.pos {
		p = p[:size-f.pos]
	}
	n, err := f.body.Read(p)
	f.pos += int64(n)
	f.bodyPos += int64(n)
	switch {
	case f.pos == size:
		// The whole file is read: its answer must end here.
		var one [1]byte
		if m, _ := io.ReadFull(f.body, one[:]); m > 0 {
			return n, bad(wire.FilesContent, "more than the %d bytes of %.200q", size, f.rel)
		}
		return n, nil
	case err == io.EOF:
		return n, bad(wire.FilesContent, "%.200q ended at %d of its %d bytes", f.rel, f.pos, size)
	}
	return n, err
}

// request asks for the rest of the file from pos.
func (f *remoteFile) request() error {
	if f.body != nil {
		f.body.Close()
		f.body = nil
	}
	h := http.Header{"Range": {fmt.Sprintf("bytes=%d-", f.pos)}}
	if f.etag != "" {
		h.Set("If-Range", f.etag)
	}
	resp, err := f.w.send(f.ctx, http.MethodGet, wire.FilesContent, query("path", f.rel), nil, h)
	if err != nil {
		return err
	}
	return f.attach(resp, f.pos, true)
}

func (f *remoteFile) Seek(offset int64, whence int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var base int64
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		base = f.pos
	case io.SeekEnd:
		base = f.info.Size
	default:
		return f.pos, fmt.Errorf("seek: whence %d: %w", whence, errdefs.ErrInvalidArgument)
	}
	if base+offset < 0 {
		return f.pos, fmt.Errorf("seek to %d: a negative position: %w", base+offset, errdefs.ErrInvalidArgument)
	}
	f.pos = base + offset
	return f.pos, nil
}

func (f *remoteFile) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.body != nil {
		f.body.Close()
		f.body = nil
	}
	return nil
}

// SyncResources brings the resources in step with want. The executor
// holds the record of what is in place, and the control plane the
// contents: so it asks the executor what is in place (Resources), sends
// the manifest with the contents of the rest that content has, in one
// tar stream, and the executor stages them in the workspace and places
// them with workspace.Local.SyncResources. A content whose size is not
// the manifest's fails the call before the executor changes anything.
// What content lacks, or what the executor's account of the resources
// in place left out, comes back as Needed.
func (w *Workspace) SyncResources(ctx context.Context, want []workspace.Resource, content workspace.ResourceContent) (workspace.ResourceSync, error) {
	var none workspace.ResourceSync
	want, err := workspace.CheckManifest(want)
	if err != nil {
		return none, err
	}
	have, err := w.Resources(ctx)
	if err != nil {
		return none, err
	}
	inPlace := make(map[workspace.Resource]bool, len(have))
	for _, r := range have {
		inPlace[r] = true
	}
	manifest, err := json.Marshal(wire.Resources{Resources: want})
	if err != nil {
		return none, err
	}
	pr, pw := io.Pipe()
	written := make(chan error, 1)
	go func() {
		err := writeSync(ctx, pw, manifest, want, inPlace, content)
		pw.CloseWithError(err)
		written <- err
	}()
	resp, err := w.send(ctx, http.MethodPost, wire.FilesResources, "", pr, http.Header{"Content-Type": {"application/x-tar"}})
	pr.CloseWithError(errSyncOver)
	if werr := <-written; werr != nil && !errors.Is(werr, errSyncOver) && !errors.Is(werr, io.ErrClosedPipe) && err != nil {
		// The contents failed first; the executor's answer is about that.
		if resp != nil {
			resp.Body.Close()
		}
		return none, werr
	}
	if err != nil {
		return none, err
	}
	var res wire.ResourceSync
	if err := decode(resp, wire.FilesResources, wire.MaxManifestJSON, &res); err != nil {
		return none, err
	}
	if err := checkSync(res, want); err != nil {
		return none, bad(wire.FilesResources, "%v", err)
	}
	return workspace.ResourceSync{
		Needed: nilIfEmpty(res.Needed), Added: nilIfEmpty(res.Added), Changed: nilIfEmpty(res.Changed),
		Removed: nilIfEmpty(res.Removed), Unchanged: res.Unchanged,
	}, nil
}

// errSyncOver stops the writing of a sync's body once its answer came.
var errSyncOver = errors.New("the resource sync is over")

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

// writeSync writes a resource sync's body: the manifest, then each
// content not in place that content has, once per SHA-256.
func writeSync(ctx context.Context, out io.Writer, manifest []byte, want []workspace.Resource, inPlace map[workspace.Resource]bool, content workspace.ResourceContent) error {
	tw := tar.NewWriter(out)
	if err := tw.WriteHeader(&tar.Header{Name: wire.ResourceManifestName, Mode: 0o644, Size: int64(len(manifest)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(manifest); err != nil {
		return err
	}
	sent := map[string]bool{}
	for _, r := range want {
		if inPlace[r] || sent[r.SHA256] {
			continue
		}
		rc, size, err := content(ctx, r.SHA256)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("resource %q: %w", r.Name, err)
		}
		err = sendContent(tw, rc, r, size)
		rc.Close()
		if err != nil {
			return err
		}
		sent[r.SHA256] = true
	}
	return tw.Close()
}

func sendContent(tw *tar.Writer, rc io.Reader, r workspace.Resource, size int64) error {
	if size != r.Size {
		return fmt.Errorf("resource %q: the manifest says %d bytes, its content has %d: %w", r.Name, r.Size, size, errdefs.ErrInvalidArgument)
	}
	if err := tw.WriteHeader(&tar.Header{Name: r.SHA256, Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	n, err := io.Copy(tw, io.LimitReader(rc, size))
	if err == nil && n < size {
		err = fmt.Errorf("resource %q: its content ended at %d of %d bytes: %w", r.Name, n, size, errdefs.ErrInvalidArgument)
	}
	return err
}

// checkSync checks an executor's account of a sync of want.
func checkSync(res wire.ResourceSync, want []workspace.Resource) error {
	wanted := make(map[string]workspace.Resource, len(want))
	for _, r := range want {
		wanted[r.Name] = r
	}
	if len(res.Needed) > len(want) || len(res.Added)+len(res.Changed)+res.Unchanged > len(want) || res.Unchanged < 0 {
		return fmt.Errorf("an account of more resources than the %d asked for", len(want))
	}
	for _, r := range res.Needed {
		if wanted[r.Name] != r {
			return fmt.Errorf("a needed resource %.200q that is not in the manifest", r.Name)
		}
	}
	for _, n := range append(append([]string{}, res.Added...), res.Changed...) {
		if _, ok := wanted[n]; !ok {
			return fmt.Errorf("a resource %.200q placed that is not in the manifest", n)
		}
	}
	if len(res.Removed) > workspace.MaxResources {
		return fmt.Errorf("%d resources removed, more than %d", len(res.Removed), workspace.MaxResources)
	}
	for _, n := range res.Removed {
		if p, err := workspace.CleanPath(n); err != nil || p != n || p == "." {
			return fmt.Errorf("a removed resource named %.200q", n)
		}
		if _, ok := wanted[n]; ok {
			return fmt.Errorf("a resource %.200q removed that is in the manifest", n)
		}
	}
	return nil
}
