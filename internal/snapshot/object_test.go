package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/blob/s3"
	"github.com/sbx-sandbox/sbx/internal/testenv"
	"github.com/sbx-sandbox/sbx/internal/testenv/miniotest"
)

func TestMain(m *testing.M) { miniotest.Main(m) }

// backends runs fn with a store on the file system and one on MinIO (if
// there is a MinIO to run: miniotest skips without one).
func backends(t *testing.T, fn func(t *testing.T, s *Store)) {
	t.Run("fs", func(t *testing.T) {
		s, _ := newStore(t)
		fn(t, s)
	})
	t.Run("s3", func(t *testing.T) {
		b, err := s3.Open(ctx, miniotest.New(t).URL)
		if err != nil {
			t.Fatal(err)
		}
		fn(t, New(b, "snapshots", Limits{TempDir: t.TempDir()}))
	})
}

func sha256hexOf(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// objectContent is two and a half chunks with a chunk of zeros between
// the first and the last data: ranged reads cross every kind of edge.
func objectContent() []byte {
	b := make([]byte, 0, 3*ChunkSize+ChunkSize/2)
	b = append(b, random(ChunkSize)...)
	b = append(b, make([]byte, ChunkSize)...)
	b = append(b, random(ChunkSize+ChunkSize/2)...)
	return b
}

// chunks counts the chunks of namespace ns.
func chunks(t *testing.T, s *Store, ns string) int {
	t.Helper()
	n := 0
	if err := s.blobs.List(ctx, s.prefix+"/tenants/"+ns+"/chunks/", func(blob.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestObjectRoundTrip(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		content := objectContent()
		sum := sha256hexOf(content)
		keep := time.Now().Add(time.Hour)
		obj, err := s.PutObject(ctx, "t1", sum, bytes.NewReader(content), int64(len(content)), keep)
		if err != nil {
			t.Fatal(err)
		}
		if !obj.Created || obj.SHA256 != sum || obj.Size != int64(len(content)) || obj.NewBytes < 3*ChunkSize-ChunkSize/2 {
			t.Fatalf("put: %+v", obj)
		}
		if n := chunks(t, s, "t1"); n != 3 { // the zero chunk is stored nowhere
			t.Fatalf("%d chunks stored, want 3", n)
		}
		r, err := s.OpenObject(ctx, "t1", sum)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if r.Size() != int64(len(content)) || r.SHA256() != sum {
			t.Fatalf("open: size %d sum %s", r.Size(), r.SHA256())
		}
		whole, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(whole, content) {
			t.Fatalf("read all: %d bytes, %v; equal %v", len(whole), err, bytes.Equal(whole, content))
		}
		for _, tc := range []struct{ off, n int64 }{
			{0, 10},
			{ChunkSize - 5, 10},                  // data into zeros
			{2*ChunkSize - 5, 10},                // zeros into data
			{ChunkSize / 2, 2 * ChunkSize},       // across three chunks
			{int64(len(content)) - 7, 7},         // the end
			{3 * ChunkSize, ChunkSize/2 + 1},     // past the end: short
			{int64(len(content)) + 1, 1},         // all past the end
			{ChunkSize + ChunkSize/2, ChunkSize}, // inside the zeros and out
		} {
			p := make([]byte, tc.n)
			n, err := r.ReadAt(p, tc.off)
			end := min(tc.off+tc.n, int64(len(content)))
			want := content[min(tc.off, end):end]
			if !bytes.Equal(p[:n], want) || (n < len(p)) != (err == io.EOF) {
				t.Errorf("ReadAt(%d, %d): %d bytes, %v; want %d bytes", tc.off, tc.n, n, err, len(want))
			}
			// The same range by Seek and Read, as http.ServeContent does.
			if _, err := r.Seek(tc.off, io.SeekStart); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(io.LimitReader(r, tc.n))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("Seek(%d) and Read %d: %d bytes, %v", tc.off, tc.n, len(got), err)
			}
		}
		// The empty object has no chunks at all.
		empty, err := s.PutObject(ctx, "t1", "", strings.NewReader(""), 10, keep)
		if err != nil || empty.SHA256 != sha256hexOf(nil) || !empty.Created {
			t.Fatalf("empty: %+v %v", empty, err)
		}
		er, err := s.OpenObject(ctx, "t1", empty.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := io.ReadAll(er); err != nil || len(b) != 0 {
			t.Errorf("empty object: %q %v", b, err)
		}
	})
}

// The same content put twice is stored once; it is new only the first
// time, and putting it again keeps it longer, never shorter.
func TestObjectDedupAndRefresh(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		content := random(ChunkSize + 100)
		soon, later := time.Now().Add(time.Minute).UTC(), time.Now().Add(time.Hour).UTC()
		first, err := s.PutObject(ctx, "t", "", bytes.NewReader(content), 1<<30, soon)
		if err != nil || !first.Created {
			t.Fatalf("first: %+v %v", first, err)
		}
		again, err := s.PutObject(ctx, "t", first.SHA256, bytes.NewReader(content), 1<<30, soon)
		if err != nil || again.Created || again.NewBytes != 0 || !again.KeepUntil.Equal(first.KeepUntil) {
			t.Fatalf("again: %+v %v", again, err)
		}
		if n := chunks(t, s, "t"); n != 2 {
			t.Fatalf("%d chunks after two puts, want 2", n)
		}
		longer, err := s.PutObject(ctx, "t", "", bytes.NewReader(content), 1<<30, later)
		if err != nil || longer.Created || longer.NewBytes != 0 || !longer.KeepUntil.Equal(later) {
			t.Fatalf("refreshed: %+v %v", longer, err)
		}
		shorter, err := s.PutObject(ctx, "t", "", bytes.NewReader(content), 1<<30, soon)
		if err != nil || !shorter.KeepUntil.Equal(later) {
			t.Fatalf("a put for less time shortened it: %+v %v", shorter, err)
		}
		// A snapshot of a file with the same content adds no chunk either.
		dir := t.TempDir()
		write(t, filepath.Join(dir, "src", "f"), content, 0o644)
		if _, st, err := s.Save(ctx, filepath.Join(dir, "src"), "t/s1/snapshots/a", nil); err != nil || st.NewChunks != 0 {
			t.Fatalf("snapshot of the same content: %+v %v", st, err)
		}
	})
}

// Tenants share no chunks, and one cannot open another's object.
func TestObjectTenants(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		secret := random(1000)
		keep := time.Now().Add(time.Hour)
		v, err := s.PutObject(ctx, "victim", "", bytes.NewReader(secret), 1<<20, keep)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.OpenObject(ctx, "attacker", v.SHA256); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("the attacker opens the victim's object: %v", err)
		}
		a, err := s.PutObject(ctx, "attacker", v.SHA256, bytes.NewReader(secret), 1<<20, keep)
		if err != nil || !a.Created || a.NewBytes <= int64(len(secret)) {
			t.Errorf("the attacker's put of the same content: %+v %v; it learnt the victim has it", a, err)
		}
		for _, ns := range []string{"", "a/b", "..", ".x"} {
			if _, err := s.PutObject(ctx, ns, "", strings.NewReader("x"), 10, keep); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("namespace %q: %v", ns, err)
			}
			if _, err := s.OpenObject(ctx, ns, v.SHA256); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("open in namespace %q: %v", ns, err)
			}
		}
	})
}

func TestObjectRefused(t *testing.T) {
	s, _ := newStore(t)
	keep := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		what, want, body string
		max              int64
		err              error
	}{
		{"wrong hash", sha256hexOf([]byte("a")), "b", 10, errdefs.ErrInvalidArgument},
		{"not a hash", "xyz", "b", 10, errdefs.ErrInvalidArgument},
		{"upper case", strings.ToUpper(sha256hexOf([]byte("a"))), "a", 10, errdefs.ErrInvalidArgument},
		{"too large", "", "0123456789x", 10, errdefs.ErrResourceExhausted},
		{"too large over chunks", "", strings.Repeat("x", ChunkSize+1), ChunkSize, errdefs.ErrResourceExhausted},
	} {
		if _, err := s.PutObject(ctx, "t", tc.want, strings.NewReader(tc.body), tc.max, keep); !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want %v", tc.what, err, tc.err)
		}
		if _, err := s.OpenObject(ctx, "t", sha256hexOf([]byte(tc.body))); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s: stored anyway (%v)", tc.what, err)
		}
	}
	// Exactly the limit is fine.
	if _, err := s.PutObject(ctx, "t", "", strings.NewReader("0123456789"), 10, keep); err != nil {
		t.Errorf("at the limit: %v", err)
	}
}

// A chunk changed in the store is refused when read, not served.
func TestObjectCorruptChunk(t *testing.T) {
	s, _ := newStore(t)
	content := random(100)
	obj, err := s.PutObject(ctx, "t", "", bytes.NewReader(content), 1000, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	key := chunkKey(s.chunkArea("t/x", manifestVersion), obj.SHA256) // one chunk: its hash is the object's
	if _, err := s.blobs.Put(ctx, key, bytes.NewReader(random(100))); err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenObject(ctx, "t", obj.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(r); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("a corrupt chunk read: %v", err)
	}
}

// The one collector deletes expired objects and their chunks in one
// pass, and never a chunk that a snapshot or a live object uses.
func TestCollectObjects(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		shared := random(2000) // in a snapshot and in an expired object
		alone := random(4000)  // only in an expired object
		// A chunk both a live and an expired object start with.
		both := random(ChunkSize)
		tailLive, tailExpired := random(100), random(300) // the one chunk of each alone
		dir := t.TempDir()
		write(t, filepath.Join(dir, "src", "f"), shared, 0o644)
		if _, _, err := s.Save(ctx, filepath.Join(dir, "src"), "t/s1/snapshots/a", nil); err != nil {
			t.Fatal(err)
		}
		past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
		put := func(b []byte, until time.Time) Object {
			t.Helper()
			o, err := s.PutObject(ctx, "t", "", bytes.NewReader(b), 1<<30, until)
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
		expiredShared, expiredAlone := put(shared, past), put(alone, past)
		expiredMixed := put(append(append([]byte{}, both...), tailExpired...), past)
		liveObj := put(append(append([]byte{}, both...), tailLive...), future)
		// A refresh of an expired object before the collector comes keeps it.
		refreshed := put(random(500), past)
		if o := put(mustRead(t, s, "t", refreshed.SHA256, true), future); o.Created {
			t.Fatalf("refresh: %+v", o)
		}
		if _, err := s.OpenObject(ctx, "t", expiredAlone.SHA256); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("an expired object opens: %v", err)
		}
		c, err := s.Collect(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if c.Objects != 3 || c.Chunks != 2 || c.Bytes != int64(len(alone)+len(tailExpired)) {
			t.Errorf("collected %+v; want the 3 expired objects and the 2 chunks only they used", c)
		}
		for _, o := range []Object{expiredShared, expiredAlone, expiredMixed} {
			if _, err := s.Load(ctx, objectKey("t", o.SHA256)); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("expired object %s: %v", o.SHA256[:8], err)
			}
		}
		for _, o := range []Object{liveObj, refreshed} {
			mustRead(t, s, "t", o.SHA256, false)
		}
		if _, err := s.Restore(ctx, "t/s1/snapshots/a", filepath.Join(dir, "out")); err != nil {
			t.Errorf("the snapshot after collection: %v", err)
		}
		// A second pass finds nothing more.
		if c, err := s.Collect(ctx, 0); err != nil || c.Objects != 0 || c.Chunks != 0 {
			t.Errorf("second pass: %+v %v", c, err)
		}
	})
}

// mustRead reads the object whole. expired reads it through the chunk
// store directly (OpenObject refuses an expired object).
func mustRead(t *testing.T, s *Store, ns, sum string, expired bool) []byte {
	t.Helper()
	if expired {
		// Its content is one chunk, named by the object's hash.
		r, err := s.blobs.Open(ctx, chunkKey(s.chunkArea(ns+"/x", manifestVersion), sum))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		b, _ := io.ReadAll(r)
		return b
	}
	r, err := s.OpenObject(ctx, ns, sum)
	if err != nil {
		t.Fatalf("object %s: %v", sum[:8], err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil || sha256hexOf(b) != sum {
		t.Fatalf("object %s: %v", sum[:8], err)
	}
	return b
}

// hookReader calls hook once, when it has given its first n bytes.
type hookReader struct {
	r    io.Reader
	n    int64
	hook func()
}

func (h *hookReader) Read(p []byte) (int, error) {
	if h.n <= 0 && h.hook != nil {
		h.hook()
		h.hook = nil
	}
	if h.hook != nil && int64(len(p)) > h.n {
		p = p[:h.n]
	}
	n, err := h.r.Read(p)
	h.n -= int64(n)
	return n, err
}

// A put does not hold off the collector while it reads (a client may
// send slowly), and a chunk collected meanwhile fails the put rather
// than leaving a manifest that names a chunk that is gone.
func TestObjectPutRacesCollect(t *testing.T) {
	s, _ := newStore(t)
	head := random(ChunkSize)
	// An expired object whose one chunk the put will find present.
	if _, err := s.PutObject(ctx, "t", "", bytes.NewReader(head), ChunkSize, time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	var collected Collected
	r := &hookReader{r: io.MultiReader(bytes.NewReader(head), strings.NewReader("tail")), n: ChunkSize, hook: func() {
		var err error
		if collected, err = s.Collect(ctx, 0); err != nil {
			t.Error(err)
		}
	}}
	_, err := s.PutObject(ctx, "t", "", r, 2*ChunkSize, time.Now().Add(time.Hour))
	if collected.Objects != 1 || collected.Chunks != 1 {
		t.Fatalf("the collector during the put: %+v", collected)
	}
	if err == nil || !strings.Contains(err.Error(), "collected while") {
		t.Fatalf("a put whose chunk was collected: %v", err)
	}
	sum := sha256hexOf(append(append([]byte{}, head...), "tail"...))
	if _, err := s.OpenObject(ctx, "t", sum); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the failed put left an object: %v", err)
	}
	// Sent again, it is stored whole.
	if _, err := s.PutObject(ctx, "t", sum, io.MultiReader(bytes.NewReader(head), strings.NewReader("tail")), 2*ChunkSize, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	mustRead(t, s, "t", sum, false)
}

// What a failed put wrote is counted (for the tenant's stored bytes), and
// a refreshed object keeps the time it was first stored.
func TestObjectAccounting(t *testing.T) {
	s, _ := newStore(t)
	big := random(ChunkSize + 10)
	obj, err := s.PutObject(ctx, "t", "", bytes.NewReader(big), ChunkSize, time.Now().Add(time.Hour))
	if !errors.Is(err, errdefs.ErrResourceExhausted) || obj.NewBytes != ChunkSize {
		t.Errorf("a put over its limit: %+v %v; want the chunk it wrote counted", obj, err)
	}
	first, err := s.PutObject(ctx, "t", "", strings.NewReader("x"), 10, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	r1, _ := s.OpenObject(ctx, "t", first.SHA256)
	time.Sleep(10 * time.Millisecond)
	if _, err := s.PutObject(ctx, "t", "", strings.NewReader("x"), 10, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	r2, _ := s.OpenObject(ctx, "t", first.SHA256)
	if !r2.ModTime().Equal(r1.ModTime()) || !r2.KeepUntil().After(r1.KeepUntil()) {
		t.Errorf("refreshed: stored %v then %v, kept until %v then %v", r1.ModTime(), r2.ModTime(), r1.KeepUntil(), r2.KeepUntil())
	}
}

// A small object read costs what it holds, not a whole chunk's buffer:
// a resource sync opens up to a thousand of them, mostly a few KiB each.
func TestSmallObjectsSmallBuffers(t *testing.T) {
	s, _ := newStore(t)
	const n = 100
	sums := make([]string, n)
	for i := range sums {
		o, err := s.PutObject(ctx, "t", "", bytes.NewReader(random(4096)), 1<<20, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		sums[i] = o.SHA256
	}
	readers := make([]*ObjectReader, n) // all held open, as a sync holds them
	grew := testenv.HeapGrowth(func() {
		for i, sum := range sums {
			r, err := s.OpenObject(ctx, "t", sum)
			if err != nil {
				t.Fatal(err)
			}
			if b, err := io.ReadAll(r); err != nil || len(b) != 4096 {
				t.Fatalf("read %d bytes, %v", len(b), err)
			}
			readers[i] = r
		}
	})
	for _, r := range readers {
		r.Close()
	}
	// 100 whole-chunk buffers would be 400 MiB.
	if grew > 32<<20 {
		t.Errorf("reading %d objects of 4 KiB held %d MiB", n, grew>>20)
	}
}

func TestValidSumAsThePatternSaid(t *testing.T) {
	sum := regexp.MustCompile(`^[0-9a-f]{64}$`)
	for _, s := range []string{"", strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("A", 64),
		strings.Repeat("0", 63) + "g", strings.Repeat("f", 64), strings.Repeat("9", 64) + "\n"} {
		if ValidSum(s) != sum.MatchString(s) {
			t.Errorf("ValidSum(%q) = %v", s, ValidSum(s))
		}
	}
}
