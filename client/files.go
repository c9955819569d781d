package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"path"
	"strconv"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
)

// UploadOptions say where uploaded files go.
type UploadOptions struct {
	// Path is the destination in the workspace: a directory ending in "/",
	// or, for a single file, its full path. Default: each file's name at
	// the top of the workspace (or of the conversation's temp area).
	Path string
	// ConversationID puts the files in that conversation's temp area,
	// where only its code sees them (/workspace/uploads/temparea/).
	ConversationID string
	// Subdir is the conversation's area, "temparea" (the default).
	Subdir string
}

// UploadFile is one file to upload.
type UploadFile struct {
	// Name is the file's name (a path's last element is taken).
	Name string
	// Reader gives the content; it is read once, as the request is sent.
	Reader io.Reader
	// ContentType is the file's media type (the session's
	// allowed_file_types may check it). Default: guessed from Name's
	// extension, else application/octet-stream.
	ContentType string
}

// errUploadOver stops the writer of an upload's body once the server has
// answered.
var errUploadOver = errors.New("upload: the server answered")

// Upload streams files into the session: each is read from its Reader as
// the request goes out, never held whole in memory. The server stores all
// of them or none. A file over the session's size limit is a 413
// *APIError, a type it does not allow 415, too many files 422 or 409.
func (c *Client) Upload(ctx context.Context, sessionID string, opts UploadOptions, files ...UploadFile) (*api.UploadResponse, error) {
	p, err := sessionPath(sessionID, "/files/upload")
	if err != nil {
		return nil, err
	}
	return c.upload(ctx, p, nil, opts, files)
}

func (c *Client) upload(ctx context.Context, p string, query url.Values, opts UploadOptions, files []UploadFile) (*api.UploadResponse, error) {
	if len(files) == 0 {
		return nil, fmt.Errorf("upload: no files: %w", errdefs.ErrInvalidArgument)
	}
	for _, f := range files {
		if f.Reader == nil || path.Base(f.Name) == "." || path.Base(f.Name) == "/" {
			return nil, fmt.Errorf("upload: file %q: want a name and a reader: %w", f.Name, errdefs.ErrInvalidArgument)
		}
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	req, err := c.request(ctx, http.MethodPost, p, query, pr)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Accept", "application/json")
	written := make(chan error, 1)
	go func() {
		err := writeUpload(mw, opts, files)
		pw.CloseWithError(err) // nil: the body ends here
		written <- err
	}()
	resp, err := c.do(req, http.StatusCreated)
	// The server may answer before it has read everything (a file over the
	// limit); the writer must stop then, and be gone before we return.
	pr.CloseWithError(errUploadOver)
	werr := <-written
	if err != nil {
		var ae *APIError
		if werr != nil && !errors.As(err, &ae) && !errors.Is(werr, errUploadOver) && !errors.Is(werr, io.ErrClosedPipe) {
			return nil, werr // reading a file failed, and so the request did
		}
		return nil, err
	}
	defer resp.Body.Close()
	var out api.UploadResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("upload: decoding the answer: %w", err)
	}
	return &out, nil
}

// writeUpload writes the multipart body: the text fields first, as the
// server needs them before the files, then each file.
func writeUpload(mw *multipart.Writer, opts UploadOptions, files []UploadFile) error {
	for _, f := range [][2]string{{"path", opts.Path}, {"conversation_id", opts.ConversationID}, {"subdir", opts.Subdir}} {
		if f[1] != "" {
			if err := mw.WriteField(f[0], f[1]); err != nil {
				return err
			}
		}
	}
	for _, f := range files {
		name := path.Base(f.Name)
		ct := f.ContentType
		if ct == "" {
			ct = mime.TypeByExtension(path.Ext(name))
		}
		if ct == "" {
			ct = "application/octet-stream"
		}
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", multipart.FileContentDisposition("file", name))
		h.Set("Content-Type", ct)
		part, err := mw.CreatePart(h)
		if err != nil {
			return err
		}
		if _, err := io.Copy(part, f.Reader); err != nil {
			return fmt.Errorf("upload: %s: %w", f.Name, err)
		}
	}
	return mw.Close()
}

// ListFilesOptions say what to list.
type ListFilesOptions struct {
	// Path is the directory, workspace-relative (default the top); with
	// ConversationID, relative to the conversation's temp area.
	Path      string
	Recursive bool
	// ConversationID lists that conversation's uploads only.
	ConversationID string
	// Subdir is the conversation's area, "temparea" (the default).
	Subdir string
}

// ListFiles lists a directory of the session's workspace, or a
// conversation's uploads.
func (c *Client) ListFiles(ctx context.Context, sessionID string, opts ListFilesOptions) (*api.FileList, error) {
	p, err := sessionPath(sessionID, "/files")
	if err != nil {
		return nil, err
	}
	return c.listFiles(ctx, p, url.Values{}, opts)
}

func (c *Client) listFiles(ctx context.Context, p string, q url.Values, opts ListFilesOptions) (*api.FileList, error) {
	set(q, "path", opts.Path)
	if opts.Recursive {
		q.Set("recursive", "true")
	}
	set(q, "conversation_id", opts.ConversationID)
	set(q, "subdir", opts.Subdir)
	var out api.FileList
	if _, err := c.call(ctx, http.MethodGet, p, q, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

func workspaceFilePath(sessionID, file string) (string, error) {
	fp, err := filePath(file)
	if err != nil {
		return "", err
	}
	return sessionPath(sessionID, "/files/"+fp)
}

// Download copies a file of the session's workspace to w and returns how
// many bytes it copied.
func (c *Client) Download(ctx context.Context, sessionID, file string, w io.Writer) (int64, error) {
	rc, err := c.OpenFile(ctx, sessionID, file, 0, 0)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.Copy(w, rc)
}

// OpenFile opens length bytes of a file from offset on (length 0: to the
// end). Close the reader when done.
func (c *Client) OpenFile(ctx context.Context, sessionID, file string, offset, length int64) (io.ReadCloser, error) {
	if offset < 0 || length < 0 {
		return nil, fmt.Errorf("open %s: negative offset or length: %w", file, errdefs.ErrInvalidArgument)
	}
	p, err := workspaceFilePath(sessionID, file)
	if err != nil {
		return nil, err
	}
	return c.openFile(ctx, p, nil, file, offset, length)
}

func (c *Client) openFile(ctx context.Context, p string, query url.Values, file string, offset, length int64) (io.ReadCloser, error) {
	req, err := c.request(ctx, http.MethodGet, p, query, nil)
	if err != nil {
		return nil, err
	}
	switch {
	case length > 0:
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", offset, offset+length-1))
	case offset > 0:
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	resp, err := c.do(req, http.StatusOK, http.StatusPartialContent)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK && offset > 0 {
		// The server sent it all, without the range: skip to offset.
		if _, err := io.CopyN(io.Discard, resp.Body, offset); err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("open %s at %d: %w", file, offset, err)
		}
	}
	if length > 0 {
		return readCloser{io.LimitReader(resp.Body, length), resp.Body}, nil
	}
	return resp.Body, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// Presign returns a URL that downloads the file without an API key until
// it expires (expires 0: the server's default, an hour; at most 7 days).
func (c *Client) Presign(ctx context.Context, sessionID, file string, expires time.Duration) (*api.PresignResponse, error) {
	p, err := workspaceFilePath(sessionID, file)
	if err != nil {
		return nil, err
	}
	q := url.Values{"presign": {"true"}}
	if expires > 0 {
		q.Set("expires_in", strconv.FormatInt(int64(math.Ceil(expires.Seconds())), 10))
	}
	var out api.PresignResponse
	if _, err := c.call(ctx, http.MethodGet, p, q, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteFile deletes a file, or a directory (with recursive, one that is
// not empty too).
func (c *Client) DeleteFile(ctx context.Context, sessionID, file string, recursive bool) error {
	p, err := workspaceFilePath(sessionID, file)
	if err != nil {
		return err
	}
	var q url.Values
	if recursive {
		q = url.Values{"recursive": {"true"}}
	}
	_, err = c.call(ctx, http.MethodDelete, p, q, nil, nil, http.StatusNoContent)
	return err
}

// DeleteConversation purges a conversation's uploads (and stateful
// contexts) at once and for good. Purging one without files succeeds.
func (c *Client) DeleteConversation(ctx context.Context, sessionID, conversationID string) error {
	seg, err := segment("conversation id", conversationID)
	if err != nil {
		return err
	}
	p, err := sessionPath(sessionID, "/conversations/"+seg)
	if err != nil {
		return err
	}
	_, err = c.call(ctx, http.MethodDelete, p, nil, nil, nil, http.StatusNoContent)
	return err
}
