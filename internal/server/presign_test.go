package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/blob/blobtest"
	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// swapBlobs rewrites a file with other content the first time the store
// is asked anything: the moment a sandbox would pick to swap the file
// between the server's reads of it.
type swapBlobs struct {
	blob.Store
	once sync.Once
	file string
	with []byte
}

func (s *swapBlobs) swap() {
	s.once.Do(func() { os.WriteFile(s.file, s.with, 0o644) })
}

func (s *swapBlobs) Stat(ctx context.Context, key string) (blob.Info, error) {
	s.swap()
	return s.Store.Stat(ctx, key)
}

func (s *swapBlobs) Put(ctx context.Context, key string, r io.Reader) (int64, error) {
	b, err := io.ReadAll(r)
	s.swap()
	if err != nil {
		return 0, err
	}
	return s.Store.Put(ctx, key, strings.NewReader(string(b)))
}

func presignServer(t *testing.T, blobs blob.Store) *Server {
	mgr := session.New(session.Options{}) // for the tenants' stored bytes; never started
	t.Cleanup(mgr.Close)
	objects := snapshot.New(blobs, "snapshots", snapshot.Limits{TempDir: t.TempDir()})
	s := &Server{opt: Options{Blobs: blobs, Objects: objects, Sessions: mgr, SigningKey: []byte("key"), Metrics: NewMetrics(nil, nil)}, log: slog.Default(), mux: http.NewServeMux()}
	s.mux.HandleFunc("GET "+api.Prefix+"/presigned/{ns}/{blob}/{name}", s.presigned)
	return s
}

func presignFile(t *testing.T, s *Server, tenant, file string) string {
	t.Helper()
	return presignFileFor(t, s, tenant, file, 0)
}

// presignFileFor presigns for expiry seconds (0: the default).
func presignFileFor(t *testing.T, s *Server, tenant, file string, expiry int) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rec := httptest.NewRecorder()
	target := "/x?presign=true"
	if expiry > 0 {
		target += "&expires_in=" + strconv.Itoa(expiry)
	}
	r := httptest.NewRequest("GET", target, nil)
	r = r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant))
	s.presign(rec, r, hostFile(t, f), "f.txt")
	var p api.PresignResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != 200 {
		t.Fatalf("presign: %d %s", rec.Code, rec.Body)
	}
	return p.URL
}

func fetch(t *testing.T, s *Server, u string, hdr ...string) (int, []byte) {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	r := httptest.NewRequest("GET", pu.RequestURI(), nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	s.mux.ServeHTTP(rec, r)
	return rec.Code, rec.Body.Bytes()
}

// objects lists the manifests of the objects (and snapshots) of s.
func objects(t *testing.T, s *Server) []blob.Info {
	t.Helper()
	var out []blob.Info
	if err := s.opt.Objects.List(context.Background(), "", func(info blob.Info) error {
		out = append(out, info)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// A file swapped while it is presigned: the URL serves exactly the bytes
// whose hash it names, never content stored under another's hash.
func TestPresignSwap(t *testing.T) {
	dir := t.TempDir()
	blobs, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "f.txt")
	os.WriteFile(file, []byte("the real report"), 0o644)
	s := presignServer(t, &swapBlobs{Store: blobs, file: file, with: []byte("planted content")})
	u := presignFile(t, s, "attacker", file)
	code, body := fetch(t, s, u)
	sum := sha256.Sum256(body)
	if code != 200 || !strings.Contains(u, "/"+hex.EncodeToString(sum[:])+"/") {
		t.Errorf("the URL %s serves %d %q, whose hash it does not name", u, code, body)
	}
}

// Presigned copies are per tenant: the same content presigned by two
// tenants is two copies, and a URL cannot be moved to the other's.
func TestPresignTenants(t *testing.T) {
	dir := t.TempDir()
	blobs, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "f.txt")
	os.WriteFile(file, []byte("same"), 0o644)
	s := presignServer(t, blobs)
	u1, u2 := presignFile(t, s, "t1", file), presignFile(t, s, "t2", file)
	infos := objects(t, s)
	if len(infos) != 2 || u1 == u2 || strings.Split(infos[0].Key, "/")[0] == strings.Split(infos[1].Key, "/")[0] {
		t.Errorf("two tenants' copies: %v", infos)
	}
	// Neither is in the tenant's own namespace, which a tenant named
	// like a URL's namespace could not reach either.
	for _, info := range infos {
		if !strings.HasPrefix(info.Key, "_presigned-") {
			t.Errorf("a copy at %s", info.Key)
		}
	}
	ns1 := strings.Split(strings.SplitAfter(u1, "/presigned/")[1], "/")[0]
	ns2 := strings.Split(strings.SplitAfter(u2, "/presigned/")[1], "/")[0]
	if code, _ := fetch(t, s, strings.Replace(u1, ns1, ns2, 1)); code != http.StatusForbidden {
		t.Errorf("a URL moved to another namespace: %d", code)
	}
	for _, u := range []string{u1, u2} {
		if code, body := fetch(t, s, u); code != 200 || string(body) != "same" {
			t.Errorf("%s: %d %q", u, code, body)
		}
	}
}

// A presigned copy of a sparse file is sparse too.
func TestPresignSparse(t *testing.T) {
	dir := t.TempDir()
	blobs, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "f.txt")
	f, _ := os.Create(file)
	f.WriteAt([]byte("tail"), 1<<30-4)
	f.Close()
	s := presignServer(t, blobs)
	u := presignFile(t, s, "t", file)
	stored, _ := blobtest.List(context.Background(), blobs, "snapshots/")
	var total int64
	for _, info := range stored {
		total += info.Size
	}
	// The chunk with the tail, and a manifest; no chunk of zeros.
	if total > snapshot.ChunkSize+64<<10 {
		t.Errorf("the copy of a 1 GiB sparse file takes %d MiB", total>>20)
	}
	h := sha256.New()
	f, _ = os.Open(file)
	io.Copy(h, f)
	f.Close()
	if !strings.Contains(u, "/"+hex.EncodeToString(h.Sum(nil))+"/") {
		t.Errorf("the URL %s does not name the file's hash", u)
	}
	code, body := fetch(t, s, u, "Range", "bytes=1073741820-")
	if code != http.StatusPartialContent || string(body) != "tail" {
		t.Errorf("the tail of the sparse copy: %d %q", code, body)
	}
}

// countingBlobs counts the chunks opened.
type countingBlobs struct {
	blob.Store
	chunks atomic.Int64
}

func (c *countingBlobs) Open(ctx context.Context, key string) (blob.Reader, error) {
	if strings.Contains(key, "/chunks/") {
		c.chunks.Add(1)
	}
	return c.Store.Open(ctx, key)
}

// A range is served from the chunks it spans, and only those.
func TestPresignRange(t *testing.T) {
	dir := t.TempDir()
	fsBlobs, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	blobs := &countingBlobs{Store: fsBlobs}
	content := make([]byte, 2*snapshot.ChunkSize+snapshot.ChunkSize/2)
	rand.Read(content)
	file := filepath.Join(dir, "f.bin")
	os.WriteFile(file, content, 0o644)
	s := presignServer(t, blobs)
	u := presignFile(t, s, "t", file)
	for _, tc := range []struct {
		first, last int64
		chunks      int64
	}{
		{10, 20, 1},
		{snapshot.ChunkSize - 3, snapshot.ChunkSize + 3, 2},
		{2*snapshot.ChunkSize + 1, int64(len(content)) - 1, 1},
		{0, int64(len(content)) - 1, 3},
	} {
		blobs.chunks.Store(0)
		code, body := fetch(t, s, u, "Range", "bytes="+strconv.FormatInt(tc.first, 10)+"-"+strconv.FormatInt(tc.last, 10))
		if code != http.StatusPartialContent || !bytes.Equal(body, content[tc.first:tc.last+1]) {
			t.Errorf("range %d-%d: %d, %d bytes", tc.first, tc.last, code, len(body))
		}
		if n := blobs.chunks.Load(); n != tc.chunks {
			t.Errorf("range %d-%d read %d chunks, want %d", tc.first, tc.last, n, tc.chunks)
		}
	}
}

// A file over the presign limit is refused (413) before a byte of it is
// read: a sparse file costs its sandbox nothing and would cost the
// server the hashing of all its zeros.
func TestPresignMaxBytes(t *testing.T) {
	dir := t.TempDir()
	blobs, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "big.txt")
	f, _ := os.Create(file)
	f.Truncate(1 << 40) // a TiB of holes
	f.Close()
	s := presignServer(t, blobs)
	s.opt.PresignMaxBytes = 1 << 30
	fh, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	rec := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/x?presign=true", nil)
	r = r.WithContext(context.WithValue(r.Context(), tenantKey{}, "t"))
	s.presign(rec, r, hostFile(t, fh), "big.txt")
	if rec.Code != 413 || !strings.Contains(rec.Body.String(), "presign-max-bytes") {
		t.Errorf("presign of a TiB: %d %s", rec.Code, rec.Body)
	}
	if infos, _ := blobtest.List(context.Background(), blobs, ""); len(infos) != 0 {
		t.Errorf("copies made: %+v", infos)
	}
}

// hostFile is f as a workspace file.
func hostFile(t *testing.T, f *os.File) workspace.File {
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return osFile{f, workspace.Entry{Name: fi.Name(), Type: "file", Size: fi.Size(), ModTime: fi.ModTime()}}
}

type osFile struct {
	*os.File
	info workspace.Entry
}

func (f osFile) Info() workspace.Entry { return f.info }
