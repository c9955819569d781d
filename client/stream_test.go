package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name, stream string
		want         []string // "name=data"
	}{
		{"lf", "event: a\ndata: 1\n\nevent: b\ndata: 2\n\n", []string{"a=1", "b=2"}},
		{"crlf", "event: a\r\ndata: 1\r\n\r\n", []string{"a=1"}},
		{"cr", "event: a\rdata: 1\r\revent: b\rdata: 2\r\r", []string{"a=1", "b=2"}},
		{"multi-line data", "data: line 1\ndata: line 2\ndata:\n\n", []string{"message=line 1\nline 2\n"}},
		{"comments and unknown fields", ": hi\nid: 7\nretry: 10\nfoo: bar\nevent: a\n: mid\ndata: 1\n\n", []string{"a=1"}},
		{"no space after colon", "event:a\ndata:1\n\n", []string{"a=1"}},
		{"only one space dropped", "data:  two\n\n", []string{"message= two"}},
		{"field without colon", "event: a\ndata\n\n", []string{"a="}},
		{"event without data is none", "event: a\n\nevent: b\ndata: 2\n\n", []string{"b=2"}},
		{"colon in data", "data: {\"a\":\"b:c\"}\n\n", []string{`message={"a":"b:c"}`}},
		{"byte order mark", "\uFEFFevent: a\ndata: 1\n\n", []string{"a=1"}},
		{"unfinished event dropped", "event: a\ndata: 1\n\nevent: b\ndata: 2", []string{"a=1"}},
		{"blank lines between", "\n\n\nevent: a\ndata: 1\n\n\n\n", []string{"a=1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Feed a byte at a time too, so that CR LF is split across reads.
			for _, r := range []io.Reader{strings.NewReader(tt.stream), &oneByteReader{s: tt.stream}} {
				var got []string
				events := newSSEReader(r)
				for {
					ev, err := events.next()
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, ev.name+"="+ev.data)
				}
				if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", tt.want) {
					t.Errorf("%T: got %q, want %q", r, got, tt.want)
				}
			}
		})
	}
}

type oneByteReader struct {
	s string
	i int
}

func (r *oneByteReader) Read(p []byte) (int, error) {
	if r.i >= len(r.s) {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = r.s[r.i]
	r.i++
	return 1, nil
}

func FuzzSSEReader(f *testing.F) {
	f.Add("event: a\r\ndata: 1\r\n\r\n")
	f.Add("data:x\rdata:y\r\r:c\n")
	f.Fuzz(func(t *testing.T, s string) {
		events := newSSEReader(strings.NewReader(s))
		for i := 0; i <= len(s); i++ {
			if _, err := events.next(); err != nil {
				return
			}
		}
		t.Fatalf("more events than bytes in %q", s)
	})
}

func streamServer(t *testing.T, body string) *Client {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return New(srv.URL, WithHTTPClient(srv.Client()))
}

const submitted = "event: submitted\ndata: {\"execution_id\":\"exec-9\",\"status\":\"submitted\"}\n\n"

func TestExecuteStream(t *testing.T) {
	ctx := context.Background()
	req := api.ExecuteRequest{Code: "1"}

	t.Run("output in order", func(t *testing.T) {
		c := streamServer(t, submitted+
			"event: stdout\ndata: {\"text\":\"a\"}\n\n"+
			"event: stderr\r\ndata: {\"text\":\"b\\n\"}\r\n\r\n"+
			": keep-alive\n\n"+
			"event: progress\ndata: {}\n\n"+ // a later version's event
			"event: stdout\ndata: {\"text\":\"c\"}\n\n"+
			"event: result\ndata: {\"execution_id\":\"exec-9\",\"status\":\"failed\",\"error\":{\"type\":\"E\",\"message\":\"m\"}}\n\n")
		var got []string
		x, err := c.ExecuteStream(ctx, "s1", req, func(stream, text string) { got = append(got, stream+":"+text) })
		if err != nil {
			t.Fatal(err)
		}
		if x.ExecutionID != "exec-9" || x.Status != api.ExecFailed || x.Error.Type != "E" {
			t.Errorf("result %+v", x)
		}
		if fmt.Sprintf("%q", got) != `["stdout:a" "stderr:b\n" "stdout:c"]` {
			t.Errorf("output %q", got)
		}
	})
	t.Run("error event", func(t *testing.T) {
		c := streamServer(t, submitted+"event: error\ndata: {\"error\":{\"code\":\"unavailable\",\"message\":\"no sandbox\"}}\n\n")
		_, err := c.ExecuteStream(ctx, "s1", req, nil)
		var ae *APIError
		if !errors.As(err, &ae) || ae.Code != "unavailable" || ae.StatusCode != 503 || !IsUnavailable(err) {
			t.Errorf("got %v", err)
		}
	})
	t.Run("cut short", func(t *testing.T) {
		c := streamServer(t, submitted+"event: stdout\ndata: {\"text\":\"a\"}\n\n")
		_, err := c.ExecuteStream(ctx, "s1", req, nil)
		if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "exec-9") {
			t.Errorf("got %v; want an unexpected EOF naming the execution", err)
		}
	})
	t.Run("refused", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeError(w, 404, "not_found", "no session")
		}))
		defer srv.Close()
		_, err := New(srv.URL, WithHTTPClient(srv.Client())).ExecuteStream(ctx, "s1", req, nil)
		if !IsNotFound(err) {
			t.Errorf("got %v", err)
		}
	})
}

// synthetic is size bytes of a repeating pattern, made as they are read,
// that never runs more than maxAhead bytes ahead of what the server has
// received: an upload that buffered the file would read all of it before
// the server saw any, and fail.
type synthetic struct {
	size, read int64
	received   *atomic.Int64
	maxAhead   int64
	sum        hash.Hash
}

func (s *synthetic) Read(p []byte) (int, error) {
	if s.read >= s.size {
		return 0, io.EOF
	}
	if ahead := s.read - s.received.Load(); ahead > s.maxAhead {
		return 0, fmt.Errorf("read %d bytes while the server has %d: the upload is buffered", s.read, s.received.Load())
	}
	n := int64(len(p))
	n = min(n, s.size-s.read)
	for i := range p[:n] {
		p[i] = byte((s.read + int64(i)) % 251)
	}
	s.sum.Write(p[:n])
	s.read += n
	return int(n), nil
}

func TestUploadStreams(t *testing.T) {
	const size = 200 << 20
	var received atomic.Int64
	var fields []string
	var gotSum string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mr, err := r.MultipartReader()
		if err != nil {
			writeError(w, 400, "invalid_argument", err.Error())
			return
		}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeError(w, 400, "invalid_argument", err.Error())
				return
			}
			if part.FileName() == "" {
				b, _ := io.ReadAll(part)
				fields = append(fields, part.FormName()+"="+string(b))
				continue
			}
			fields = append(fields, "file:"+part.FileName()+":"+part.Header.Get("Content-Type"))
			h := sha256.New()
			buf := make([]byte, 64<<10)
			for {
				n, err := part.Read(buf)
				h.Write(buf[:n])
				received.Add(int64(n))
				if err == io.EOF {
					break
				}
				if err != nil {
					writeError(w, 400, "invalid_argument", err.Error())
					return
				}
			}
			gotSum = hex.EncodeToString(h.Sum(nil))
		}
		writeJSON(w, 201, api.UploadResponse{Files: []api.UploadedFile{{Name: "big.csv", Path: "big.csv", SandboxPath: "/workspace/big.csv",
			Size: received.Load(), SHA256: gotSum}}})
	}))
	defer srv.Close()
	// Kernel socket buffers and the transport's own hold some megabytes
	// between the reader and the server; nothing holds hundreds.
	src := &synthetic{size: size, received: &received, maxAhead: 48 << 20, sum: sha256.New()}
	c := New(srv.URL, WithHTTPClient(srv.Client()))
	up, err := c.Upload(context.Background(), "s1", UploadOptions{Path: "in/", ConversationID: "c1"},
		UploadFile{Name: "big.csv", Reader: src})
	if err != nil {
		t.Fatal(err)
	}
	if up.Files[0].Size != size || up.Files[0].SHA256 != hex.EncodeToString(src.sum.Sum(nil)) {
		t.Errorf("the server got %d bytes, sha256 %s", up.Files[0].Size, up.Files[0].SHA256)
	}
	ct := mime.TypeByExtension(".csv") // from the system's tables, if it has them
	if ct == "" {
		ct = "application/octet-stream"
	}
	if want := "[path=in/ conversation_id=c1 file:big.csv:" + ct + "]"; fmt.Sprint(fields) != want {
		t.Errorf("parts %v, want %s (fields before files)", fields, want)
	}
}

// TestUploadRefusedEarly: when the server refuses a file before reading
// it all, the upload stops reading it and returns the server's error.
func TestUploadRefusedEarly(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mr, _ := r.MultipartReader()
		part, _ := mr.NextPart()
		io.CopyN(io.Discard, part, 1<<20)
		writeError(w, 413, "payload_too_large", "big.bin is larger than the session's max_file_size of 1 MB")
	}))
	defer srv.Close()
	var received atomic.Int64
	received.Store(1 << 62) // no bound on reading ahead; the total is checked below
	src := &synthetic{size: 1 << 40, received: &received, maxAhead: 1 << 62, sum: sha256.New()}
	_, err := New(srv.URL, WithHTTPClient(srv.Client())).Upload(context.Background(), "s1", UploadOptions{},
		UploadFile{Name: "big.bin", Reader: src})
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != 413 || !strings.Contains(ae.Message, "max_file_size") || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("got %v", err)
	}
	if src.read > 256<<20 {
		t.Errorf("read %d MB of the file after the server refused it", src.read>>20)
	}
}

// TestUploadReaderFails: an error reading a file is the upload's error.
func TestUploadReaderFails(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeError(w, 400, "invalid_argument", "broken body")
	}))
	defer srv.Close()
	boom := errors.New("disk on fire")
	_, err := New(srv.URL, WithHTTPClient(srv.Client())).Upload(context.Background(), "s1", UploadOptions{},
		UploadFile{Name: "a.txt", Reader: io.MultiReader(strings.NewReader("some"), &failingReader{boom})})
	if !errors.Is(err, boom) {
		// The server may also have answered first; then its error stands.
		var ae *APIError
		if !errors.As(err, &ae) {
			t.Errorf("got %v, want %v", err, boom)
		}
	}
	if _, err := New(srv.URL).Upload(context.Background(), "s1", UploadOptions{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("no files: %v", err)
	}
}

type failingReader struct{ err error }

func (r *failingReader) Read([]byte) (int, error) { return 0, r.err }
