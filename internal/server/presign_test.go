package server

import (
	"context"
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
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/blob/blobtest"
	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/session"
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
	s := &Server{opt: Options{Blobs: blobs, Sessions: mgr, SigningKey: []byte("key"), Metrics: NewMetrics(nil, nil)}, log: slog.Default(), mux: http.NewServeMux()}
	s.mux.HandleFunc("GET "+api.Prefix+"/presigned/{blob}/{name}", s.presigned)
	s.mux.HandleFunc("GET "+api.Prefix+"/presigned/{ns}/{blob}/{name}", s.presigned)
	return s
}

func presignFile(t *testing.T, s *Server, tenant, file string) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rec := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/x?presign=true", nil)
	r = r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant))
	s.presign(rec, r, f, "f.txt")
	var p api.PresignResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != 200 {
		t.Fatalf("presign: %d %s", rec.Code, rec.Body)
	}
	return p.URL
}

func fetch(t *testing.T, s *Server, u string) (int, []byte) {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.mux.ServeHTTP(rec, httptest.NewRequest("GET", pu.RequestURI(), nil))
	return rec.Code, rec.Body.Bytes()
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
	infos, _ := blobtest.List(context.Background(), blobs, "presigned/")
	if len(infos) != 2 || u1 == u2 {
		t.Errorf("two tenants' copies: %v", infos)
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
	infos, _ := blobtest.List(context.Background(), blobs, "presigned/")
	if len(infos) != 1 || infos[0].Size != 1<<30 {
		t.Fatalf("copies: %+v", infos)
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(dir, "blobs", filepath.FromSlash(infos[0].Key)), &st)
	if st.Blocks*512 > 1<<20 {
		t.Errorf("the copy of a 1 GiB sparse file takes %d MiB", st.Blocks*512>>20)
	}
	if !strings.Contains(u, "/"+filepath.Base(infos[0].Key)+"/") {
		t.Errorf("the URL %s does not name the copy %s", u, infos[0].Key)
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
	s.presign(rec, r, fh, "big.txt")
	if rec.Code != 413 || !strings.Contains(rec.Body.String(), "presign-max-bytes") {
		t.Errorf("presign of a TiB: %d %s", rec.Code, rec.Body)
	}
	if infos, _ := blobtest.List(context.Background(), blobs, "presigned/"); len(infos) != 0 {
		t.Errorf("copies made: %+v", infos)
	}
}
