package snapshot

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Saving and writing workspace archives: the tar stream of
// internal/workspace's Export and Import (see its archive.go), which is
// how a workspace that is not on this host (a volume behind an executor,
// on another node) is saved and put back. SaveArchive stores one exactly
// as Save stores a directory (the same chunks, holes as runs of zero
// chunks, the same Limits, fence and keys), as a version 3 manifest whose
// owners are the sandbox's ids; WriteArchive writes any manifest as such
// an archive.
//
// An archive comes out of a sandbox and is hostile: SaveArchive takes
// only what the format holds (directories, regular files, symbolic links
// with clean relative UTF-8 paths without control characters, in the
// order Export writes them: a directory's entries sorted by name right
// after it, the manifest's order) and refuses anything else with
// errdefs.ErrInvalidArgument: hard links, devices, FIFOs, absolute or
// ".." paths, an entry twice, an entry before its directory, a stream that
// is cut short (an archive ends with its end marker) or is not tar. A
// header's size is charged to MaxBytes before its content is read, the
// bytes around the content (headers, long names) are bounded per entry,
// and past a limit the save fails with errdefs.ErrResourceExhausted, as
// Save does.
//
// The Timeout cannot interrupt a Read or Write that blocks: the caller's
// stream must end with ctx (an HTTP body does).

// maxEntryOverhead bounds the bytes of an archive that are not file
// content, per entry: its header blocks, a PAX header with a path and a
// link target of up to 4 KiB each, padding. Far more than Export writes,
// far less than what a stream of junk headers would cost.
const maxEntryOverhead = 16 << 10

// maxNameLen is the longest name a workspace path may have (NAME_MAX).
const maxNameLen = 255

// maxLinkLen bounds a link's target, as Import does (PATH_MAX).
const maxLinkLen = 4096

// SaveArchive snapshots the workspace archive read from r under key, as a
// manifest whose owners are the sandbox's ids (see MapIDs). prev, if not
// nil, is an earlier manifest of the same workspace: a chunk it has at the
// same path is known to be in the store and is not looked up again. The
// archive is read whole; a chunk the store has is not written again.
func (s *Store) SaveArchive(ctx context.Context, r io.Reader, key string, prev *Manifest) (*Manifest, Stats, error) {
	return s.saving(ctx, key, func(ctx context.Context, st *Stats) (*Manifest, error) {
		return s.saveArchive(ctx, r, key, prev, st)
	})
}

func (s *Store) saveArchive(ctx context.Context, r io.Reader, key string, prev *Manifest, st *Stats) (*Manifest, error) {
	mw, err := newManifestWriter(s.lim.TempDir)
	if err != nil {
		return nil, err
	}
	defer mw.close()
	w := &saver{s: s, ctx: ctx, st: st, mw: mw, buf: make([]byte, ChunkSize), area: s.chunkArea(key, archiveVersion)}
	// The previous manifest, in the same order as the archive, says which
	// chunks are there: it holds the chunks it names while it exists, and
	// Collect cannot run while this holds the fence.
	if prev != nil && prev.Version >= manifestVersion && s.chunkArea(prev.Key, prev.Version) == w.area {
		if w.prev, err = s.open(ctx, prev.Key); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
		if w.prev != nil {
			defer w.prev.Close()
		}
	}
	m := &Manifest{Version: archiveVersion, Key: key, CreatedAt: time.Now().UTC(), Owners: sandboxOwners}
	w.m = m
	src := &source{r: r}
	a := &archiveSaver{saver: w, src: src, tr: tar.NewReader(src)}
	// The limits are checked here, as ErrResourceExhausted; the checker
	// sees to the shape of the tree.
	a.check.lim = Limits{MaxDepth: math.MaxInt, MaxPath: math.MaxInt, MaxEntries: math.MaxInt}
	if err := a.run(); err != nil {
		return nil, err
	}
	return s.putManifest(ctx, mw, m, st)
}

type archiveSaver struct {
	*saver
	src   *source
	tr    *tar.Reader
	check checker
}

// source is the archive's stream: it tells a stream that failed from an
// archive that is not one, and counts what was read.
type source struct {
	r   io.Reader
	n   int64
	err error // the stream's own error, not io.EOF
	// emptyEOF is the last Read giving nothing but io.EOF: tar ended at a
	// header it could not read, not at its end marker.
	emptyEOF bool
}

func (s *source) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.n += int64(n)
	s.emptyEOF = n == 0 && err == io.EOF
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// fault is the error of reading the archive: the stream's own, or
// ErrInvalidArgument for what tar made of it.
func (s *source) fault(err error) error {
	if s.err != nil {
		return fmt.Errorf("reading the workspace archive: %w", s.err)
	}
	return fmt.Errorf("workspace archive: %v: %w", err, errdefs.ErrInvalidArgument)
}

func badArchive(format string, args ...any) error {
	return fmt.Errorf("workspace archive: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// run saves the archive's entries, then the root if the archive has no
// entry for it.
func (a *archiveSaver) run() error {
	first := true
	for {
		if err := a.ctx.Err(); err != nil {
			return err
		}
		h, err := a.tr.Next()
		if err == io.EOF {
			if a.src.emptyEOF {
				return badArchive("it ends before its end marker (cut short?)")
			}
			if first {
				return a.root(nil)
			}
			return nil
		}
		if err != nil {
			return a.src.fault(err)
		}
		// Everything read but file content is the entries' overhead.
		if over := a.src.n - a.read; over > int64(a.entries+1)*maxEntryOverhead {
			return exhausted("the workspace archive has %d bytes of headers for %d entries", over, a.entries+1)
		}
		if err := a.entry(h, first); err != nil {
			return err
		}
		first = false
	}
}

// root adds the root directory: the archive's entry for it, h, or if it
// has none, what a new workspace's is (mode 0711, the user's).
func (a *archiveSaver) root(h *tar.Header) error {
	e := Entry{Path: ".", Type: "dir", Mode: 0o711, UID: sandboxUserID, GID: sandboxUserID}
	if h != nil {
		e.Mode, e.UID, e.GID = perm(h), sandboxOwner(h.Uid), sandboxOwner(h.Uid)
	}
	if err := a.check.check(&e); err != nil {
		return err
	}
	a.m.Dirs++
	return a.add(e)
}

func perm(h *tar.Header) uint32 { return uint32(h.Mode & 0o777) }

// sandboxOwner is the sandbox's id of an entry owned by uid: its root's,
// or its user's for any other.
func sandboxOwner(uid int) int {
	if uid == sandboxRootID {
		return sandboxRootID
	}
	return sandboxUserID
}

// unixNano is t in unix ns, held to what an int64 holds.
func unixNano(t time.Time) int64 {
	switch {
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// entry checks and saves one entry; first is the archive's first, which
// may be the root.
func (a *archiveSaver) entry(h *tar.Header, first bool) error {
	name := h.Name
	if h.Typeflag == tar.TypeDir {
		name = strings.TrimSuffix(name, "/")
	}
	// tar reads the content of any entry it is not asked for: only a
	// file may have one, within MaxBytes.
	if h.Size < 0 || (h.Size > 0 && h.Typeflag != tar.TypeReg) {
		return badArchive("entry %.64q has a size of %d", name, h.Size)
	}
	if name == "." && h.Typeflag == tar.TypeDir {
		if !first {
			return badArchive("the root directory is not the first entry")
		}
		return a.root(h)
	}
	if first {
		if err := a.root(nil); err != nil {
			return err
		}
	}
	if len(name) > a.s.lim.MaxPath {
		return exhausted("a path is longer than %d bytes (%.64q...)", a.s.lim.MaxPath, name)
	}
	if err := checkName(name); err != nil {
		return err
	}
	if err := a.count(1); err != nil {
		return err
	}
	e := Entry{Path: name, Mode: perm(h), UID: sandboxOwner(h.Uid), GID: sandboxOwner(h.Uid)}
	switch h.Typeflag {
	case tar.TypeDir:
		if depth := strings.Count(name, "/") + 1; depth > a.s.lim.MaxDepth {
			return exhausted("directories are nested deeper than %d (%.64q...)", a.s.lim.MaxDepth, name)
		}
		e.Type = "dir"
		a.m.Dirs++
	case tar.TypeSymlink:
		if h.Linkname == "" || len(h.Linkname) >= maxLinkLen || strings.IndexByte(h.Linkname, 0) >= 0 {
			return badArchive("link %.64q has an empty, overlong or malformed target", name)
		}
		e.Type, e.Target, e.MTime = "symlink", h.Linkname, unixNano(h.ModTime)
		a.m.Symlinks++
	case tar.TypeReg:
		if a.read+h.Size > a.s.lim.MaxBytes {
			return exhausted("the workspace has more than %d bytes of files", a.s.lim.MaxBytes)
		}
		e.Type, e.MTime = "file", unixNano(h.ModTime)
	default:
		return badArchive("entry %.64q is of a type (%q) a workspace archive does not hold", name, h.Typeflag)
	}
	// Before any content is read: an entry out of order or outside a
	// directory costs nothing.
	if err := a.check.check(&e); err != nil {
		return fmt.Errorf("workspace archive: %w", err)
	}
	if e.Type == "file" {
		if err := a.file(&e, h.Size); err != nil {
			return err
		}
		a.m.Files++
		a.m.Size += e.Size
		a.m.Data += e.Data
	}
	return a.add(e)
}

// checkName refuses a path that a workspace archive cannot hold: what
// workspace.CleanPath refuses, and any path not already clean.
func checkName(p string) error {
	if !utf8.ValidString(p) {
		return badArchive("path %.64q is not UTF-8", p)
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return badArchive("path %.64q has a control character or a backslash", p)
		}
	}
	if p == "" || p == "." || path.IsAbs(p) || path.Clean(p) != p {
		return badArchive("path %.64q is not a clean relative path", p)
	}
	for c := range strings.SplitSeq(p, "/") {
		if c == ".." || len(c) > maxNameLen {
			return badArchive("path %.64q has a component that is \"..\" or longer than %d bytes", p, maxNameLen)
		}
	}
	return nil
}

// file reads a file's content, size bytes, into chunks, as content does
// for a file on disk: a chunk of zeros is counted in a run, not stored.
func (a *archiveSaver) file(e *Entry, size int64) error {
	a.st.Reread++
	// The chunks the previous manifest has at this path are in the store.
	var known map[string]bool
	old, err := a.previous(e.Path)
	if err != nil {
		// A previous manifest that cannot be read only costs the lookups.
		a.prev.Close()
		a.prev, old = nil, nil
	}
	if old != nil && old.Type == "file" {
		known = make(map[string]bool, len(old.Chunks))
		for _, c := range old.Chunks {
			known[c] = true
		}
	}
	var zeros int64
	flush := func() {
		if zeros > 0 {
			e.Chunks = append(e.Chunks, zeroRun(zeros))
			zeros = 0
		}
	}
	for off := int64(0); off < size; {
		if err := a.ctx.Err(); err != nil {
			return err
		}
		want := min(ChunkSize, size-off)
		n, err := io.ReadFull(a.tr, a.buf[:want])
		a.read += int64(n)
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return badArchive("file %.64q is cut short", e.Path)
			}
			return a.src.fault(err)
		}
		b := a.buf[:n]
		if bytes.Equal(b, zeroChunk[:n]) {
			zeros++
		} else {
			flush()
			sum := sha256.Sum256(b)
			hs := hex.EncodeToString(sum[:])
			if !known[hs] {
				if err := a.store(hs, b); err != nil {
					return err
				}
			}
			e.Chunks = append(e.Chunks, hs)
			e.Data += int64(n)
		}
		off += int64(n)
	}
	flush()
	e.Size = size
	return nil
}

// WriteArchive writes the tree of the manifest at key to w as a workspace
// archive, the stream Export writes and Import takes: PAX, parents before
// children, no entry for the root, directories with a "/" suffix and no
// time, permission bits only, the sandbox's owners (a manifest saved from
// a directory has its host ids translated with those of MapIDs). Holes
// and chunks of zeros are written out as zeros, since a tar writer
// cannot write a sparse file: a sparse file costs its full size in the
// stream and, written by Import, on disk. Every chunk is checked against
// its hash before it is written. On an error, w has part of an archive.
func (s *Store) WriteArchive(ctx context.Context, key string, w io.Writer) (*Manifest, error) {
	return s.restore(ctx, key, func(ctx context.Context, o *opened) error {
		if !o.sandbox && s.ids == nil {
			return noIDs("a manifest saved from a directory")
		}
		tw := tar.NewWriter(w)
		buf := make([]byte, ChunkSize)
		var e Entry
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			err := o.next(&e)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			if e.Path == "." {
				continue // Import keeps its own root
			}
			id := sandboxOwner(e.UID)
			if !o.sandbox {
				id = s.ids.sandboxID(e.UID)
			}
			h := &tar.Header{
				Name: e.Path, Mode: int64(e.Mode & 0o777), Uid: id, Gid: id,
				ModTime: time.Unix(0, e.MTime), Format: tar.FormatPAX,
			}
			switch e.Type {
			case "dir":
				h.Name, h.Typeflag, h.ModTime = e.Path+"/", tar.TypeDir, time.Time{}
			case "symlink":
				h.Typeflag, h.Linkname = tar.TypeSymlink, e.Target
			case "file":
				h.Typeflag, h.Size = tar.TypeReg, e.Size
			}
			if err := tw.WriteHeader(h); err != nil {
				return fmt.Errorf("%s: %w", e.Path, err)
			}
			if e.Type == "file" {
				if err := s.writeContent(ctx, tw, o.area, &e, buf); err != nil {
					return fmt.Errorf("%s: %w", e.Path, err)
				}
			}
		}
		return tw.Close()
	})
}

// writeContent writes a file's chunks to w, its runs of zeros as zeros.
func (s *Store) writeContent(ctx context.Context, w io.Writer, area string, e *Entry, buf []byte) error {
	off := int64(0)
	for _, sum := range e.Chunks {
		if err := ctx.Err(); err != nil {
			return err
		}
		if z, ok := parseZeroRun(sum); ok {
			// The checker bounded the run by the size, not z*ChunkSize by
			// an int64.
			end := e.Size
			if z <= (e.Size-off)/ChunkSize {
				end = off + z*ChunkSize
			}
			for off < end {
				n := min(end-off, ChunkSize)
				if _, err := w.Write(zeroChunk[:n]); err != nil {
					return err
				}
				off += n
			}
			continue
		}
		n, err := s.readChunk(ctx, area, sum, min(e.Size-off, ChunkSize), buf)
		if err != nil {
			return err
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
		off += int64(n)
	}
	return nil
}
