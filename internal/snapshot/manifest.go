package snapshot

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// The manifest format. A manifest is one gzipped JSON object whose last
// field, "Entries", is the array of entries; the fields before it are the
// Manifest header. It is written as two gzip members, the header (with
// the array's opening) and then the entries, spooled to a temporary file
// as the walk goes, so that no manifest is ever a value in memory; gzip
// readers read the two members as one stream. Readers stream it too:
// Load stops at "Entries", Entries and Restore decode one entry at a
// time.
//
// Version 2 (this one) lists entries in walk order: parents before
// children and siblings sorted by name, so that paths are strictly
// increasing by comparePaths and a Save can walk the previous manifest
// alongside the tree. Version 1 manifests (no "v") are in the order of
// the directory listings; they are read, not written.
//
// Version 3 is version 2 saved from a workspace archive (SaveArchive):
// its header says "owners": "sandbox", its entries' owners are the
// sandbox's ids (0 for its root, 1000 for its user), not the host's, and
// its directories have no times. A server that predates it refuses it
// rather than give its files to the host's root.
const (
	manifestVersion = 2
	archiveVersion  = 3
	latestVersion   = archiveVersion
)

// sandboxOwners is the Owners of a version 3 manifest.
const sandboxOwners = "sandbox"

// Manifest describes a saved tree: the header of its manifest.
type Manifest struct {
	Version               int       `json:"v,omitempty"`
	Key                   string    `json:"key"`
	CreatedAt             time.Time `json:"created_at"`
	Files, Dirs, Symlinks int
	Size                  int64 // bytes of regular files: their sizes
	Data                  int64 `json:"data,omitempty"` // the same less holes: what a restore writes
	// SHA256 and KeepUntil are an object's (object.go): the hash of its
	// content and the time after which Collect deletes it.
	SHA256    string    `json:"sha256,omitempty"`
	KeepUntil time.Time `json:"keep_until,omitzero"`
	// Owners says whose ids the entries carry: "" the host's (Save),
	// "sandbox" the sandbox's (SaveArchive, version 3).
	Owners string `json:"owners,omitempty"`
}

// SandboxOwners reports whether the entries carry the sandbox's ids (0
// and 1000) rather than the host's.
func (m *Manifest) SandboxOwners() bool { return m.Owners == sandboxOwners }

// Entry is one file, directory or symbolic link; "." is the root.
type Entry struct {
	Path   string `json:"p,omitempty"`
	Type   string `json:"t"` // dir, file, symlink
	Mode   uint32 `json:"m"` // permission bits with setuid, setgid, sticky
	UID    int    `json:"u"`
	GID    int    `json:"g"`
	Size   int64  `json:"s,omitempty"`
	MTime  int64  `json:"mt"` // unix ns
	Target string `json:"l,omitempty"`
	// Chunks are a file's chunks in order: a SHA-256, or "zN", a run of
	// N chunks of zeros (a hole), stored nowhere.
	Chunks []string `json:"c,omitempty"`
	// Data is Size less the zero chunks.
	Data int64 `json:"d,omitempty"`
	// Ino and CTime tell Save that a file is unchanged since this
	// manifest.
	Ino   uint64 `json:"i,omitempty"`
	CTime int64  `json:"ct,omitempty"`
	// RawPath and RawTarget hold a path or target that is not UTF-8 (JSON
	// strings are, and encoding/json would replace the bytes, so that two
	// names could become one); Path and Target are empty then.
	RawPath   []byte `json:"pb,omitempty"`
	RawTarget []byte `json:"lb,omitempty"`
}

// wire moves a path or target that is not UTF-8 to its raw field.
func (e Entry) wire() Entry {
	if !utf8.ValidString(e.Path) {
		e.RawPath, e.Path = []byte(e.Path), ""
	}
	if !utf8.ValidString(e.Target) {
		e.RawTarget, e.Target = []byte(e.Target), ""
	}
	return e
}

// unwire is the inverse of wire.
func (e *Entry) unwire() {
	if e.RawPath != nil {
		e.Path, e.RawPath = string(e.RawPath), nil
	}
	if e.RawTarget != nil {
		e.Target, e.RawTarget = string(e.RawTarget), nil
	}
}

// manifestWriter spools a manifest's entries, gzipped, to an unlinked
// temporary file; finish stores header and entries under the manifest's
// key.
type manifestWriter struct {
	f   *os.File
	bw  *bufio.Writer
	zw  *gzip.Writer
	enc *json.Encoder
	n   int
}

func newManifestWriter(tempDir string) (*manifestWriter, error) {
	f, err := os.CreateTemp(tempDir, "sbx-manifest-")
	if err != nil {
		return nil, fmt.Errorf("manifest spool: %w", err)
	}
	// Unlinked at once: a crash leaves nothing behind.
	os.Remove(f.Name())
	bw := bufio.NewWriterSize(f, 256<<10)
	zw := gzip.NewWriter(bw)
	return &manifestWriter{f: f, bw: bw, zw: zw, enc: json.NewEncoder(zw)}, nil
}

func (w *manifestWriter) add(e Entry) error {
	if w.n > 0 {
		if _, err := w.zw.Write([]byte{','}); err != nil {
			return err
		}
	}
	w.n++
	return w.enc.Encode(e.wire())
}

// reader returns the whole manifest: the header member, then the spooled
// entries with the closing of the array and the object.
func (w *manifestWriter) reader(m *Manifest) (io.Reader, error) {
	if _, err := w.zw.Write([]byte("]}\n")); err != nil {
		return nil, err
	}
	if err := w.zw.Close(); err != nil {
		return nil, err
	}
	if err := w.bw.Flush(); err != nil {
		return nil, err
	}
	if _, err := w.f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	head, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	var hb bytes.Buffer
	zw := gzip.NewWriter(&hb)
	zw.Write(head[:len(head)-1]) // without the closing brace
	zw.Write([]byte(`,"Entries":[`))
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return io.MultiReader(&hb, w.f), nil
}

func (w *manifestWriter) close() { w.f.Close() }

// manifestReader decodes a manifest as a stream.
type manifestReader struct {
	dec *json.Decoder
	// legacy is a version 1 manifest: no order between siblings.
	legacy bool
}

func bad(format string, args ...any) error {
	return fmt.Errorf("manifest: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// readHeader decodes the fields before "Entries" into m and leaves the
// decoder at the first entry. A manifest without entries is refused: it
// has no root.
func readHeader(r io.Reader, m *Manifest) (*manifestReader, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, bad("%v", err)
	}
	dec := json.NewDecoder(zr)
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, bad("not a JSON object (%v)", err)
	}
	for {
		t, err := dec.Token()
		if err != nil {
			return nil, bad("%v", err)
		}
		name, ok := t.(string)
		if !ok {
			return nil, bad("no entries")
		}
		var dst any
		switch name {
		case "Entries":
			if t, err := dec.Token(); err != nil || t != json.Delim('[') {
				return nil, bad("entries are not an array (%v)", err)
			}
			if m.Version > latestVersion {
				return nil, bad("version %d is newer than this server's %d", m.Version, latestVersion)
			}
			// The owners are the sandbox's in version 3 and only there:
			// mistaking one kind for the other would give files to the
			// wrong users.
			if (m.Version == archiveVersion) != (m.Owners == sandboxOwners) || (m.Owners != "" && m.Owners != sandboxOwners) {
				return nil, bad("version %d with owners %q", m.Version, m.Owners)
			}
			return &manifestReader{dec: dec, legacy: m.Version < 2}, nil
		case "v":
			dst = &m.Version
		case "key":
			dst = &m.Key
		case "created_at":
			dst = &m.CreatedAt
		case "Files":
			dst = &m.Files
		case "Dirs":
			dst = &m.Dirs
		case "Symlinks":
			dst = &m.Symlinks
		case "Size":
			dst = &m.Size
		case "data":
			dst = &m.Data
		case "sha256":
			dst = &m.SHA256
		case "keep_until":
			dst = &m.KeepUntil
		case "owners":
			dst = &m.Owners
		default:
			dst = new(json.RawMessage)
		}
		if err := dec.Decode(dst); err != nil {
			return nil, bad("field %q: %v", name, err)
		}
	}
}

// next decodes the next entry; io.EOF after the last.
func (r *manifestReader) next(e *Entry) error {
	if !r.dec.More() {
		if t, err := r.dec.Token(); err != nil || t != json.Delim(']') {
			return bad("unterminated entries (%v)", err)
		}
		return io.EOF
	}
	*e = Entry{}
	if err := r.dec.Decode(e); err != nil {
		return bad("%v", err)
	}
	e.unwire()
	return nil
}

// validChunkName: a SHA-256 in lower-case hex. (Not a regular expression:
// see blob.validSegment.)
func validChunkName(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// maxChunks is the most chunks a file can have: its size is an int64.
const maxChunks = math.MaxInt64/ChunkSize + 1

func zeroRun(n int64) string { return "z" + strconv.FormatInt(n, 10) }

// parseZeroRun reads a run of zero chunks, "zN" with N >= 1.
func parseZeroRun(c string) (int64, bool) {
	if len(c) < 2 || c[0] != 'z' || c[1] == '0' || c[1] == '+' || c[1] == '-' {
		return 0, false
	}
	n, err := strconv.ParseInt(c[1:], 10, 64)
	if err != nil || n < 1 || n > maxChunks {
		return 0, false
	}
	return n, true
}

// checker refuses a manifest that could write outside the directory it is
// restored into, or that is not a tree, one entry at a time and in
// memory bounded by the tree's depth: the first entry is the root
// directory; every other path is clean and relative and its parent is a
// directory on the chain of directories open above it (which makes a
// symbolic link or a file never a parent, and a tree a contiguous
// pre-order walk). In a version 2 manifest paths are strictly increasing,
// so none appears twice.
type checker struct {
	lim    Limits
	legacy bool
	n      int
	last   string
	stack  []string // the directories open, root first
}

func (c *checker) check(e *Entry) error {
	c.n++
	if c.n == 1 {
		if e.Path != "." || e.Type != "dir" {
			return bad("the first entry is not the root directory")
		}
		c.stack = append(c.stack[:0], ".")
		return c.attrs(e)
	}
	if c.n > c.lim.MaxEntries {
		return bad("more than %d entries", c.lim.MaxEntries)
	}
	p := e.Path
	if p == "" || p == "." || path.Clean(p) != p || path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") ||
		strings.IndexByte(p, 0) >= 0 {
		return bad("path %q is not a clean relative path", p)
	}
	if len(p) > c.lim.MaxPath {
		return bad("a path of %d bytes, over the limit of %d", len(p), c.lim.MaxPath)
	}
	if !c.legacy {
		if comparePaths(c.last, p) >= 0 {
			return bad("path %q is not after %q", p, c.last)
		}
		c.last = p
	}
	parent := path.Dir(p)
	for len(c.stack) > 0 && c.stack[len(c.stack)-1] != parent {
		c.stack = c.stack[:len(c.stack)-1]
	}
	if len(c.stack) == 0 {
		return bad("the parent of %q is not a directory listed before it", p)
	}
	if e.Type == "dir" {
		if len(c.stack) > c.lim.MaxDepth {
			return bad("directories nested deeper than %d", c.lim.MaxDepth)
		}
		c.stack = append(c.stack, p)
	}
	return c.attrs(e)
}

func (c *checker) attrs(e *Entry) error {
	p := e.Path
	if e.Mode&^0o7777 != 0 || e.UID < 0 || e.GID < 0 || e.Size < 0 {
		return bad("entry %q has a bad mode, owner or size", p)
	}
	switch e.Type {
	case "dir":
	case "file":
		var n int64 // chunks
		for _, c := range e.Chunks {
			if z, ok := parseZeroRun(c); ok {
				n += z
			} else if validChunkName(c) {
				n++
			} else {
				return bad("entry %q names chunk %q", p, c)
			}
			if n > maxChunks {
				return bad("entry %q has too many chunks", p)
			}
		}
		if e.Size > n*ChunkSize || (n > 0 && e.Size <= (n-1)*ChunkSize) {
			return bad("entry %q: %d bytes in %d chunks", p, e.Size, n)
		}
	case "symlink":
		if e.Target == "" || strings.IndexByte(e.Target, 0) >= 0 {
			return bad("symlink %q has a bad target", p)
		}
	default:
		return bad("entry %q has type %q", p, e.Type)
	}
	return nil
}

// comparePaths orders paths component by component ("a", "a/b", "a-b"):
// the order of a walk that visits a directory's entries sorted by name
// right after the directory.
func comparePaths(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if x == '/' {
			return -1
		}
		if y == '/' {
			return 1
		}
		if x < y {
			return -1
		}
		return 1
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}
