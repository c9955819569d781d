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
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// The file routes against an executor the sandbox replaced: whatever it
// answers, the client reads no more than its bounds, hands on nothing it
// did not check, and fails with ErrBadResponse.

func entryHeader(e workspace.Entry) string {
	b, _ := json.Marshal(e)
	return base64.RawURLEncoding.EncodeToString(b)
}

func fileEntry(p string, size int64) workspace.Entry {
	return workspace.Entry{Name: p[strings.LastIndexByte(p, '/')+1:], Path: p, Type: "file", Size: size, Mode: 0o644, Owner: "user"}
}

func listLine(e workspace.Entry) string {
	b, _ := json.Marshal(wire.ListLine{Entry: &e})
	return string(b) + "\n"
}

func TestWorkspaceBoundsWhatTheExecutorSends(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	// What the client may take in before it gives up: its bound and the
	// transport's buffers.
	const slack = 1 << 20
	cases := []struct {
		name    string
		handler func(sent *atomic.Int64) http.HandlerFunc
		call    func(ctx context.Context, w *Workspace) error
		want    string
		bound   int64
	}{
		{"a listing of 1 GiB in one line", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) { endless(w, `{"name":"`, big, sent) }
		}, func(ctx context.Context, w *Workspace) error {
			_, _, err := w.List(ctx, ".", true, 0)
			return err
		}, "a line of more than", wire.MaxEntryJSON + slack},
		{"an endless listing", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				endless(w, "", listLine(fileEntry("f", 1)), sent)
			}
		}, func(ctx context.Context, w *Workspace) error {
			_, _, err := w.List(ctx, ".", false, 10)
			return err
		}, "more than the 10 entries", slack},
		{"an entry outside the directory listed", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, listLine(fileEntry("b/passwd", 1))+`{"end":true}`+"\n")
			}
		}, func(ctx context.Context, w *Workspace) error {
			_, _, err := w.List(ctx, "a", false, 0)
			return err
		}, "outside the directory", 0},
		{"an entry with a path up and out", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, listLine(fileEntry("a/../../etc", 1))+`{"end":true}`+"\n")
			}
		}, func(ctx context.Context, w *Workspace) error {
			_, _, err := w.List(ctx, "a", true, 0)
			return err
		}, "an entry with the path", 0},
		{"an entry of a negative size", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, listLine(fileEntry("f", -5))+`{"end":true}`+"\n")
			}
		}, func(ctx context.Context, w *Workspace) error {
			_, _, err := w.List(ctx, ".", true, 0)
			return err
		}, "bytes", 0},
		{"a listing without its end", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, listLine(fileEntry("f", 1))) }
		}, func(ctx context.Context, w *Workspace) error {
			_, _, err := w.List(ctx, ".", true, 0)
			return err
		}, "ended before its end", 0},
		{"a stat of another path", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) { json.NewEncoder(w).Encode(fileEntry("other", 1)) }
		}, func(ctx context.Context, w *Workspace) error {
			_, err := w.Stat(ctx, "mine")
			return err
		}, "was asked for", 0},
		{"an endless stat", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) { endless(w, `{"name":"`, big, sent) }
		}, func(ctx context.Context, w *Workspace) error {
			_, err := w.Stat(ctx, "mine")
			return err
		}, "larger than", wire.MaxEntryJSON + slack},
		{"an endless download", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set(wire.FilesEntryHeader, entryHeader(fileEntry("f", 10)))
				endless(w, "", big, sent)
			}
		}, func(ctx context.Context, w *Workspace) error {
			return readAll(ctx, w, "f", 10)
		}, "more than the 10 bytes", slack},
		{"a lying Content-Length", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set(wire.FilesEntryHeader, entryHeader(fileEntry("f", 10)))
				w.Header().Set("Content-Length", "1099511627776")
				io.WriteString(w, "0123456789")
			}
		}, func(ctx context.Context, w *Workspace) error {
			return readAll(ctx, w, "f", 10)
		}, "1099511627776 bytes announced", 0},
		{"a download shorter than its description", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set(wire.FilesEntryHeader, entryHeader(fileEntry("f", 10)))
				w.(http.Flusher).Flush() // chunked: no length to go by
				io.WriteString(w, "01234")
			}
		}, func(ctx context.Context, w *Workspace) error {
			return readAll(ctx, w, "f", 5)
		}, "ended at 5 of its 10 bytes", 0},
		{"a download of another file", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set(wire.FilesEntryHeader, entryHeader(fileEntry("etc/shadow", 3)))
				io.WriteString(w, "abc")
			}
		}, func(ctx context.Context, w *Workspace) error {
			return readAll(ctx, w, "f", 0)
		}, "was asked for", 0},
		{"a download without a description", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "abc") }
		}, func(ctx context.Context, w *Workspace) error {
			return readAll(ctx, w, "f", 0)
		}, "no description", 0},
		{"another range than asked for", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(wire.FilesEntryHeader, entryHeader(fileEntry("f", 10)))
				if r.Header.Get("Range") == "" {
					io.WriteString(w, "0123456789")
					return
				}
				w.Header().Set("Content-Range", "bytes 0-9/10")
				w.WriteHeader(http.StatusPartialContent)
				io.WriteString(w, "0123456789")
			}
		}, func(ctx context.Context, w *Workspace) error {
			f, err := w.Open(ctx, "f")
			if err != nil {
				return err
			}
			defer f.Close()
			f.Seek(5, io.SeekStart)
			_, err = f.Read(make([]byte, 5))
			return err
		}, `when "bytes 5-9/10" was asked for`, 0},
		{"a range for the whole file", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(wire.FilesEntryHeader, entryHeader(fileEntry("f", 10)))
				w.Header().Set("Content-Range", "bytes 0-9/10")
				w.WriteHeader(http.StatusPartialContent)
				io.WriteString(w, "0123456789")
			}
		}, func(ctx context.Context, w *Workspace) error {
			return readAll(ctx, w, "f", 0)
		}, "when the whole file was asked for", 0},
		{"a save that did not save what was sent", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				json.NewEncoder(w).Encode(workspace.SavedFile{Path: "f", Size: 3, SHA256: strings.Repeat("0", 64)})
			}
		}, func(ctx context.Context, w *Workspace) error {
			_, err := w.Save(ctx, "f", strings.NewReader("abc"), 0)
			return err
		}, "were sent", 0},
		{"a save of another path", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				json.NewEncoder(w).Encode(workspace.SavedFile{Path: "uploads/x"})
			}
		}, func(ctx context.Context, w *Workspace) error {
			_, err := w.Save(ctx, "f", strings.NewReader(""), 0)
			return err
		}, "not \"f\"", 0},
		{"an endless archive", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				tw := tar.NewWriter(w) // fakeExecutor counts what it sends
				tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 1 << 40, Mode: 0o644})
				for sent.Load() < 1<<30 {
					if _, err := io.WriteString(tw, big); err != nil {
						return
					}
				}
			}
		}, func(ctx context.Context, w *Workspace) error {
			w.maxArchive = 8 << 20
			return w.Export(ctx, io.Discard)
		}, "the archive is larger than", 8<<20 + slack},
		{"data after the archive", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				tw := tar.NewWriter(w)
				tw.Close()
				io.WriteString(w, "trailing")
			}
		}, func(ctx context.Context, w *Workspace) error {
			return w.Export(ctx, io.Discard)
		}, "after the archive's end", 0},
		{"an account of resources not asked for", func(*atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet {
					io.WriteString(w, `{"resources":[]}`)
					return
				}
				io.Copy(io.Discard, r.Body)
				io.WriteString(w, `{"added":["../../etc/passwd"]}`)
			}
		}, func(ctx context.Context, w *Workspace) error {
			_, err := w.SyncResources(ctx, nil, func(context.Context, string) (io.ReadCloser, int64, error) { return nil, 0, nil })
			return err
		}, "more resources than", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var h http.HandlerFunc
			c, sent := fakeExecutor(t, func(w http.ResponseWriter, r *http.Request) { h(w, r) })
			h = tc.handler(sent)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := tc.call(ctx, NewWorkspace(c, 0))
			if !errors.Is(err, ErrBadResponse) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want ErrBadResponse: %s", err, tc.want)
			}
			c.Close()
			if tc.bound == 0 {
				return
			}
			// The fake stops writing once the client has hung up.
			deadline := time.Now().Add(time.Minute)
			for last := int64(-1); sent.Load() != last && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				last = sent.Load()
			}
			t.Logf("%v; the fake sent %d bytes", err, sent.Load())
			if sent.Load() > tc.bound {
				t.Errorf("the fake sent %d bytes before the client gave up; the bound is %d", sent.Load(), tc.bound)
			}
		})
	}
}

// readAll opens rel and reads it whole; it checks that no more than max
// bytes came out of the file before the error.
func readAll(ctx context.Context, w *Workspace, rel string, max int) error {
	f, err := w.Open(ctx, rel)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if len(b) > max {
		return fmt.Errorf("%d bytes handed on, more than %d (%v)", len(b), max, err)
	}
	return err
}

// TestWorkspaceFileReadAgain: a file read from its start again (as
// http.ServeContent does after sniffing its type) asks for the range 0-
// of the file it opened; an executor that answers with the whole of
// another file (the sandbox replaced it meanwhile) fails the read, and
// nothing of the other file is handed on.
func TestWorkspaceFileReadAgain(t *testing.T) {
	for _, replaced := range []bool{false, true} {
		t.Run(fmt.Sprintf("replaced=%v", replaced), func(t *testing.T) {
			c, _ := fakeExecutor(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(wire.FilesEntryHeader, entryHeader(fileEntry("f", 10)))
				if r.Header.Get("Range") == "" {
					w.Header().Set("ETag", `"first"`)
					io.WriteString(w, "0123456789")
					return
				}
				if r.Header.Get("Range") != "bytes=0-" || r.Header.Get("If-Range") != `"first"` {
					t.Errorf("Range %q, If-Range %q; want bytes=0- of \"first\"", r.Header.Get("Range"), r.Header.Get("If-Range"))
				}
				if replaced {
					w.Header().Set("ETag", `"second"`)
					io.WriteString(w, "abcdefghij")
					return
				}
				w.Header().Set("Content-Range", "bytes 0-9/10")
				w.WriteHeader(http.StatusPartialContent)
				io.WriteString(w, "0123456789")
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			f, err := NewWorkspace(c, 0).Open(ctx, "f")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			head := make([]byte, 4)
			if _, err := io.ReadFull(f, head); err != nil || string(head) != "0123" {
				t.Fatalf("first read: %q, %v", head, err)
			}
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(f)
			switch {
			case replaced && (!errors.Is(err, errdefs.ErrFailedPrecondition) || len(b) > 0):
				t.Errorf("read again of a replaced file: %q, %v; want nothing and ErrFailedPrecondition", b, err)
			case !replaced && (err != nil || string(b) != "0123456789"):
				t.Errorf("read again: %q, %v; want the file", b, err)
			}
		})
	}
}
