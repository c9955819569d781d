package snapshot

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// hdr is one entry of an archive made by hand; a file's content is body.
type hdr struct {
	tar.Header
	body []byte
}

func dirH(name string) hdr {
	return hdr{Header: tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1000, Gid: 1000}}
}
func fileH(name string, body []byte) hdr {
	return hdr{Header: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Uid: 1000, Gid: 1000, Size: int64(len(body)),
		ModTime: time.Unix(1700000000, 123456000)}, body: body}
}
func linkH(name, target string) hdr {
	return hdr{Header: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Uid: 1000, Gid: 1000}}
}

// archiveOf writes hs as a PAX archive, with its end marker.
func archiveOf(t testing.TB, hs ...hdr) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hs {
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h.Header); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(h.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// rawHeader is an archive of one header block that tar.Writer would not
// write (a size it does not have the content of), without end marker.
func rawHeader(t testing.TB, h tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	h.Format = tar.FormatPAX
	if err := tw.WriteHeader(&h); err != nil {
		t.Fatal(err)
	}
	tw.Flush()
	return buf.Bytes()
}

// An archive-saved manifest's owners are the sandbox's: restored on the
// host they are the host ids of MapIDs (0 is the root's, any other the
// user's), written as an archive they are 0 and 1000 again; and a
// directory-saved one is written with the sandbox's ids. Without ids,
// both translations are refused, never guessed.
func TestArchiveOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	s, dir := newStore(t)
	root, user := fileH("root.txt", []byte("root's")), fileH("user.txt", []byte("user's"))
	root.Uid, root.Gid = 0, 0
	other := fileH("other.txt", []byte("someone's"))
	other.Uid, other.Gid = 4242, 0
	if _, _, err := s.SaveArchive(ctx, bytes.NewReader(archiveOf(t, other, root, user)), "t/s/a", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RestoreInto(ctx, "t/s/a", t.TempDir()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("restore of an archive-saved manifest without ids: %v, want ErrFailedPrecondition", err)
	}
	src := filepath.Join(dir, "src")
	write(t, filepath.Join(src, "host-root"), []byte("x"), 0o644)
	write(t, filepath.Join(src, "host-user"), []byte("y"), 0o644)
	os.Lchown(filepath.Join(src, "host-root"), 100000, 100000)
	os.Lchown(filepath.Join(src, "host-user"), 101000, 101000)
	if _, _, err := s.Save(ctx, src, "t/s/d", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteArchive(ctx, "t/s/d", io.Discard); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("archive of a directory-saved manifest without ids: %v, want ErrFailedPrecondition", err)
	}

	s.MapIDs(IDs{Root: ID{100000, 100001}, User: ID{101000, 101001}})
	out := filepath.Join(dir, "out")
	os.Mkdir(out, 0o700)
	if _, err := s.RestoreInto(ctx, "t/s/a", out); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]ID{".": {101000, 101001}, "root.txt": {100000, 100001}, "user.txt": {101000, 101001}, "other.txt": {101000, 101001}} {
		fi, err := os.Lstat(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fileOwner(fi); got != want {
			t.Errorf("%s restored owned by %v, want %v", name, got, want)
		}
	}
	for key, want := range map[string]map[string]int{
		"t/s/a": {"root.txt": 0, "user.txt": 1000, "other.txt": 1000},
		"t/s/d": {"host-root": 0, "host-user": 1000},
	} {
		var buf bytes.Buffer
		if _, err := s.WriteArchive(ctx, key, &buf); err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if id, ok := want[h.Name]; !ok || h.Uid != id || h.Gid != id {
				t.Errorf("%s: %s written owned by %d:%d, want %d", key, h.Name, h.Uid, h.Gid, id)
			}
		}
	}
}

func fileOwner(fi os.FileInfo) ID {
	st := fi.Sys().(*syscall.Stat_t)
	return ID{int(st.Uid), int(st.Gid)}
}

// A manifest's kind of owners and its version go together: a version 3
// manifest without "owners" (or a version 2 one with them) is refused
// rather than restored with the wrong ids.
func TestArchiveManifestOwnersChecked(t *testing.T) {
	s, _ := newStore(t)
	s.MapIDs(IDs{Root: ID{100000, 100000}, User: ID{101000, 101000}})
	for _, m := range []*Manifest{
		{Version: 3, Key: "t/v3"},
		{Version: 2, Key: "t/v2", Owners: sandboxOwners},
		{Version: 3, Key: "t/v3x", Owners: "martians"},
	} {
		putEntries(t, s, m, []Entry{{Path: ".", Type: "dir", Mode: 0o755}})
		if _, err := s.Load(ctx, m.Key); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("version %d with owners %q: %v, want ErrInvalidArgument", m.Version, m.Owners, err)
		}
	}
}

// A file of zeros, a hole as the archive cannot say, stores no chunk and
// comes back as zeros of its size.
func TestArchiveZeros(t *testing.T) {
	s, _ := newStore(t)
	zeros := make([]byte, 2*ChunkSize+5)
	m, st, err := s.SaveArchive(ctx, bytes.NewReader(archiveOf(t, fileH("zeros", zeros))), "t/s/z", nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.NewChunks != 0 || m.Data != 0 || m.Size != int64(len(zeros)) {
		t.Errorf("a file of zeros: %+v, manifest %+v; want no chunk, no data", st, m)
	}
	var buf bytes.Buffer
	if _, err := s.WriteArchive(ctx, "t/s/z", &buf); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	h, err := tr.Next()
	if err != nil || h.Name != "zeros" || h.Size != int64(len(zeros)) {
		t.Fatalf("%+v %v", h, err)
	}
	if b, err := io.ReadAll(tr); err != nil || !bytes.Equal(b, zeros) {
		t.Errorf("read back %d bytes, %v", len(b), err)
	}
}

// Every limit of Save holds on a stream, as ErrResourceExhausted, and a
// refused archive leaves no manifest.
func TestArchiveLimits(t *testing.T) {
	deep := []hdr{}
	p := ""
	for range 5 {
		p += "d/"
		deep = append(deep, dirH(strings.TrimSuffix(p, "/")))
	}
	many := []hdr{}
	for i := range 10 {
		many = append(many, fileH(string(rune('a'+i)), nil))
	}
	for name, tc := range map[string]struct {
		lim  Limits
		hs   []hdr
		want string
	}{
		"entries": {Limits{MaxEntries: 9}, many, "more than 9 entries"},
		"depth":   {Limits{MaxDepth: 4}, deep, "deeper than 4"},
		"path":    {Limits{MaxPath: 20}, []hdr{fileH(strings.Repeat("x", 21), nil)}, "longer than 20 bytes"},
		"bytes":   {Limits{MaxBytes: 1 << 20}, []hdr{fileH("a", random(1<<19)), fileH("b", random(1<<19+1))}, "more than 1048576 bytes"},
		"time":    {Limits{Timeout: time.Nanosecond}, many, "took longer than"},
	} {
		t.Run(name, func(t *testing.T) {
			s, dir := newStore(t)
			tc.lim.TempDir = dir
			s.lim = tc.lim.withDefaults()
			_, _, err := s.SaveArchive(ctx, bytes.NewReader(archiveOf(t, tc.hs...)), "t/s/x", nil)
			if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want ErrResourceExhausted saying %q", err, tc.want)
			}
			if list := manifests(t, s, ""); len(list) != 0 {
				t.Errorf("a refused save left manifests %v", list)
			}
			// At the limit it goes through.
			if name == "entries" || name == "depth" || name == "path" || name == "bytes" {
				hs := tc.hs[:len(tc.hs)-1]
				if name == "path" {
					hs = []hdr{fileH(strings.Repeat("x", 20), nil)}
				}
				if _, _, err := s.SaveArchive(ctx, bytes.NewReader(archiveOf(t, hs...)), "t/s/y", nil); err != nil {
					t.Errorf("at the limit: %v", err)
				}
			}
		})
	}
}

// endless is a stream of archive entries that never ends: files of 1 MiB
// named in order. It counts what it gave.
type endless struct {
	n    int64
	next int
	cur  *bytes.Reader
}

func (e *endless) Read(p []byte) (int, error) {
	if e.cur == nil || e.cur.Len() == 0 {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		h := tar.Header{Name: fmt.Sprintf("f%08d", e.next), Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 20, Format: tar.FormatPAX}
		tw.WriteHeader(&h)
		tw.Write(random(1 << 20))
		tw.Flush()
		e.next++
		e.cur = bytes.NewReader(buf.Bytes())
	}
	n, err := e.cur.Read(p)
	e.n += int64(n)
	return n, err
}

func itoa(i int) string { return strconv.Itoa(i) }

// Hostile archives: each is refused with the error it deserves, before
// it can cost more than the limits allow, and leaves no manifest.
func TestHostileArchives(t *testing.T) {
	valid := archiveOf(t, dirH("a"), fileH("a/f", random(3*ChunkSize/2)), linkH("a/l", "f"), fileH("b", []byte("bee")))
	hardlink := hdr{Header: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "b"}}
	char := hdr{Header: tar.Header{Name: "c", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}
	block := hdr{Header: tar.Header{Name: "k", Typeflag: tar.TypeBlock, Devmajor: 8}}
	fifo := hdr{Header: tar.Header{Name: "p", Typeflag: tar.TypeFifo}}
	invalid := map[string][]byte{
		"hard link":        archiveOf(t, fileH("b", nil), hardlink),
		"char device":      archiveOf(t, char),
		"block device":     archiveOf(t, block),
		"fifo":             archiveOf(t, fifo),
		"absolute":         archiveOf(t, fileH("/etc/passwd", []byte("x"))),
		"dot-dot":          archiveOf(t, fileH("../x", []byte("x"))),
		"inner dot-dot":    archiveOf(t, dirH("a"), fileH("a/../b", []byte("x"))),
		"dot-slash":        archiveOf(t, fileH("./x", []byte("x"))),
		"double slash":     archiveOf(t, dirH("a"), fileH("a//x", []byte("x"))),
		"control char":     archiveOf(t, fileH("x\ny", []byte("x"))),
		"backslash":        archiveOf(t, fileH(`x\y`, []byte("x"))),
		"not utf-8":        archiveOf(t, fileH("x\xff", []byte("x"))),
		"long name":        archiveOf(t, fileH(strings.Repeat("n", 256), nil)),
		"twice":            archiveOf(t, fileH("x", []byte("1")), fileH("x", []byte("2"))),
		"dir twice":        archiveOf(t, dirH("x"), dirH("x")),
		"out of order":     archiveOf(t, fileH("b", nil), fileH("a", nil)),
		"no parent":        archiveOf(t, fileH("a/f", []byte("x"))),
		"file as parent":   archiveOf(t, fileH("a", nil), fileH("a/f", nil)),
		"link as parent":   archiveOf(t, linkH("a", "/etc"), fileH("a/passwd", nil)),
		"late root":        archiveOf(t, fileH("a", nil), dirH(".")),
		"dir with body":    retyped(t, tar.TypeDir),
		"link with body":   retyped(t, tar.TypeSymlink),
		"empty link":       archiveOf(t, hdr{Header: tar.Header{Name: "l", Typeflag: tar.TypeSymlink}}),
		"long link":        archiveOf(t, linkH("l", strings.Repeat("t", 4096))),
		"garbage":          random(64 << 10),
		"not tar, zeros+1": append(make([]byte, 512), random(512)...),
		"empty stream":     nil,
	}
	// Cut anywhere (at a block, mid-header, mid-file, before or inside
	// the end marker), it is refused, never saved as a smaller tree.
	for _, at := range []int{512, 700, 1024, 1536, 4096, len(valid) / 2, len(valid) - 1024, len(valid) - 512, len(valid) - 1} {
		invalid["cut at "+itoa(at)+"/"+itoa(len(valid))] = valid[:at]
	}
	for name, b := range invalid {
		t.Run(name, func(t *testing.T) {
			s, _ := newStore(t)
			_, _, err := s.SaveArchive(ctx, bytes.NewReader(b), "t/s/x", nil)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%v, want ErrInvalidArgument", err)
			}
			if list := manifests(t, s, ""); len(list) != 0 {
				t.Errorf("a refused archive left manifests %v", list)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		s, _ := newStore(t)
		if _, _, err := s.SaveArchive(ctx, bytes.NewReader(valid), "t/s/x", nil); err != nil {
			t.Fatal(err)
		}
	})

	// A header claiming 1 TiB is refused from the header: the stream has
	// nothing after it, and reading would say "cut short".
	t.Run("1 TiB", func(t *testing.T) {
		s, _ := newStore(t)
		b := rawHeader(t, tar.Header{Name: "huge", Typeflag: tar.TypeReg, Size: 1 << 40})
		_, _, err := s.SaveArchive(ctx, bytes.NewReader(b), "t/s/x", nil)
		if !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Errorf("%v, want ErrResourceExhausted", err)
		}
	})
	// An endless stream is read up to MaxBytes, not further.
	t.Run("endless", func(t *testing.T) {
		s, dir := newStore(t)
		s.lim = Limits{MaxBytes: 16 << 20, TempDir: dir}.withDefaults()
		src := &endless{}
		_, _, err := s.SaveArchive(ctx, src, "t/s/x", nil)
		if !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Errorf("%v, want ErrResourceExhausted", err)
		}
		if src.n > 18<<20 {
			t.Errorf("read %d bytes of an endless stream with a limit of 16 MiB", src.n)
		}
	})
	// Headers without content (huge PAX records) are bounded too.
	t.Run("junk headers", func(t *testing.T) {
		s, _ := newStore(t)
		var hs []hdr
		for i := range 40 {
			h := fileH(fmt.Sprintf("f%02d", i), nil)
			h.PAXRecords = map[string]string{"SBX.junk": strings.Repeat("j", 100<<10)}
			hs = append(hs, h)
		}
		_, _, err := s.SaveArchive(ctx, bytes.NewReader(archiveOf(t, hs...)), "t/s/x", nil)
		if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "bytes of headers") {
			t.Errorf("%v, want ErrResourceExhausted for the headers", err)
		}
	})
	// The stream's own failure is its own error, not the archive's.
	t.Run("stream fails", func(t *testing.T) {
		s, _ := newStore(t)
		boom := errors.New("connection reset")
		_, _, err := s.SaveArchive(ctx, io.MultiReader(bytes.NewReader(valid[:4096]), errReader{boom}), "t/s/x", nil)
		if !errors.Is(err, boom) || errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%v, want the stream's error", err)
		}
	})
}

// retyped is an archive of one entry of type typ with three bytes of
// content, which tar.Writer would not write: a file's ustar header with
// its type changed.
func retyped(t testing.TB, typ byte) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "d", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3, Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("abc"))
	tw.Close()
	b := buf.Bytes()
	b[156] = typ
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b[:512] {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	if h, err := tar.NewReader(bytes.NewReader(b)).Next(); err != nil || h.Typeflag != typ || h.Size != 3 {
		t.Fatalf("retyped: %+v %v", h, err)
	}
	return b
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
