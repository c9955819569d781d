package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
)

// uploadAnswer is the fake server's upload: it notes the text fields in
// the request log and stores nothing.
func uploadAnswer(w http.ResponseWriter, r *http.Request, f *fakeAPI) {
	mr, err := r.MultipartReader()
	if err != nil {
		sendError(w, 400, "invalid_argument", err.Error())
		return
	}
	var (
		fields []string
		files  []api.UploadedFile
	)
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			sendError(w, 400, "invalid_argument", err.Error())
			return
		}
		if part.FileName() == "" {
			b, _ := io.ReadAll(part)
			fields = append(fields, part.FormName()+"="+string(b))
			continue
		}
		if part.FileName() == "huge.bin" {
			sendError(w, 413, "payload_too_large", `upload: "huge.bin" is larger than the session's max_file_size of 1 MB`)
			return
		}
		h := sha256.New()
		n, _ := io.Copy(h, part)
		files = append(files, api.UploadedFile{Name: part.FileName(), Path: "in/" + part.FileName(),
			SandboxPath: "/workspace/in/" + part.FileName(), Size: n, SHA256: hex.EncodeToString(h.Sum(nil))})
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, "fields "+strings.Join(fields, " "))
	f.mu.Unlock()
	sendJSON(w, 201, api.UploadResponse{Files: files})
}

func TestFiles(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	a, b, huge := filepath.Join(dir, "a.csv"), filepath.Join(dir, "b.txt"), filepath.Join(dir, "huge.bin")
	for _, p := range []string{a, b, huge} {
		if err := os.WriteFile(p, []byte("x,y\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sum := sha256.Sum256([]byte("x,y\n"))
	out := filepath.Join(dir, "out.csv")
	tests := []struct {
		name           string
		args           []string
		code           int
		request        string
		stdout, stderr string
	}{
		{
			name: "upload", args: []string{"files", "upload", "s1", a, b, "--path", "in/", "--conversation", "c1"},
			request: "fields path=in/ conversation_id=c1",
			stdout:  fmt.Sprintf("in/a.csv  4     %s  /workspace/in/a.csv", hex.EncodeToString(sum[:])),
		},
		{name: "upload too large", args: []string{"files", "upload", "s1", huge}, code: 1, stderr: "max_file_size of 1 MB"},
		{name: "upload a missing file", args: []string{"files", "upload", "s1", filepath.Join(dir, "nope")}, code: 3},
		{name: "upload a directory", args: []string{"files", "upload", "s1", dir}, code: 3, stderr: "is a directory"},
		{name: "upload nothing", args: []string{"files", "upload", "s1"}, code: 2},
		{
			name: "ls", args: []string{"files", "ls", "s1", "data", "-r", "--conversation", "c1"},
			request: "GET /api/v1/sessions/s1/files?conversation_id=c1&path=data&recursive=true",
			stdout:  "file  12",
		},
		{name: "ls the top", args: []string{"files", "ls", "s1"}, request: "GET /api/v1/sessions/s1/files"},
		{name: "get", args: []string{"files", "get", "s1", "dir/a b#1.csv"}, request: "GET /api/v1/sessions/s1/files/dir/a%20b%231.csv", stdout: "content of dir/a b#1.csv"},
		{name: "get missing", args: []string{"files", "get", "s1", "missing.txt", "-o", out}, code: 1, stderr: "no such file"},
		{name: "get a bad path", args: []string{"files", "get", "s1", "a//b"}, code: 2},
		{name: "rm", args: []string{"files", "rm", "s1", "data", "-r"}, request: "DELETE /api/v1/sessions/s1/files/data?recursive=true"},
		{name: "rm without a path", args: []string{"files", "rm", "s1"}, code: 2},
		{name: "unknown command", args: []string{"files", "cp"}, code: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := f.sbx(tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			if tt.request != "" && f.last() != tt.request {
				t.Errorf("request\n%s\nwant\n%s", f.last(), tt.request)
			}
			if !strings.Contains(stdout, tt.stdout) || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stdout:\n%s\nstderr:\n%s\nwant %q and %q in them", stdout, stderr, tt.stdout, tt.stderr)
			}
		})
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a failed get left %s behind: %v", out, err)
	}
	if code, _, stderr := f.sbx("files", "get", "s1", "data/a.csv", "-o", out); code != 0 {
		t.Fatalf("get -o: exit %d: %s", code, stderr)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "content of data/a.csv" {
		t.Errorf("get -o wrote %q, %v", b, err)
	}
}
