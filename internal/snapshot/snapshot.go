// Package snapshot is sbx's one content-addressed store in the blob
// store, with one collector (Collect). It saves a workspace directory and
// restores it: the format behind snapshots and hibernation;
// and it keeps objects, single files named by their hash and kept until a
// time (object.go): the content of session resources and the
// copies behind presigned URLs.
//
// A snapshot is a manifest plus chunks. Files are cut into 4 MiB chunks
// kept under PREFIX/tenants/NS/chunks/XX/SHA256, NS being the first
// segment of the manifest's key (the tenant), so content is stored once
// however many of a tenant's files, sessions and snapshots have it, and an
// appended or partly changed large file adds only its changed chunks.
// A hole or a chunk of zeros is not stored at all: the manifest counts
// it in a run ("zN"), and a restore leaves it a hole, so sparse files stay
// sparse. Tenants never share a chunk: whether one was there already would tell a
// tenant what another has. (Version 1 manifests have theirs in the shared
// PREFIX/chunks/; they are read and collected, never written.) The manifest, gzipped
// JSON under PREFIX/manifests/KEY (see manifest.go), lists every entry
// (path, type, mode, owner, mtime, a file's chunks, a link's target),
// parents before children. Saving with the previous manifest skips
// reading files whose size, mtime, ctime and inode have not changed.
//
// A workspace belongs to hostile code, which can shape it as it likes:
// saving never follows a symbolic link (it is saved as its target text),
// opens files without blocking and checks that what it opened is the
// regular file it listed, and skips FIFOs, sockets and devices. Its work
// is bounded (Limits): how deep, how long a path, how many entries, how
// many bytes and how long; past a bound the save fails with
// errdefs.ErrResourceExhausted and nothing else changes. Manifests are
// written and read as streams, so memory does not grow with the tree. A
// manifest is checked as it is read, before any entry is acted on;
// restoring builds the tree in a fresh sibling directory and renames it
// into place, and checks every chunk against its hash.
package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

// ChunkSize is the size of every chunk but a file's last.
const ChunkSize = 4 << 20

// Limits bound the work of one Save or Restore. A workspace past one
// cannot be snapshotted or hibernated (the call says which limit, and the
// session goes on as it was); the defaults are far above what a real
// project needs and far below what would hurt the server.
type Limits struct {
	// MaxDepth is how deeply directories may nest below the root.
	// Default 256.
	MaxDepth int
	// MaxPath is the longest path, in bytes, relative to the root. Default
	// 4096 (PATH_MAX).
	MaxPath int
	// MaxEntries is how many files, directories and links a tree may
	// have. Default 1,000,000.
	MaxEntries int
	// MaxBytes is how many bytes of file content one Save may read.
	// Default 64 GiB.
	MaxBytes int64
	// Timeout bounds one Save or Restore. Default 30 minutes.
	Timeout time.Duration
	// TempDir is where a Save spools its manifest as it walks (an unlinked
	// file). Default os.TempDir(); put it on disk, not tmpfs.
	TempDir string
}

// The defaults of Limits.
const (
	DefaultMaxDepth   = 256
	DefaultMaxPath    = 4096
	DefaultMaxEntries = 1_000_000
	DefaultMaxBytes   = 64 << 30
	DefaultTimeout    = 30 * time.Minute
)

func (l Limits) withDefaults() Limits {
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	if l.MaxPath <= 0 {
		l.MaxPath = DefaultMaxPath
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.Timeout <= 0 {
		l.Timeout = DefaultTimeout
	}
	if l.TempDir == "" {
		l.TempDir = os.TempDir()
	}
	return l
}

// Store keeps snapshots in a blob store under a prefix.
type Store struct {
	blobs  blob.Store
	prefix string
	lim    Limits
	// gc keeps Collect from deleting a chunk that a Save, a Restore or a
	// PutObject relies on: one it found present and so did not write, or
	// one its manifest names while the manifest goes.
	gc Fence
	// ids are the host ids of the sandbox's root and user, to translate
	// the owners of a manifest of one kind for a tree of the other;
	// nil until MapIDs.
	ids *IDs
}

// ID is a host uid and gid.
type ID struct{ UID, GID int }

// IDs are the host ids of the two users inside a sandbox (what
// workspace.Owners holds). A manifest saved from a host directory (Save)
// has host ids, one saved from a workspace archive (SaveArchive) the
// sandbox's (0 for its root, 1000 for its user); Restore, RestoreInto and
// WriteArchive translate between the two with them. An id that is
// neither of the two is the user's: that is who the sandbox runs code as.
type IDs struct {
	Root ID // root inside the sandbox (100000, say)
	User ID // the user code runs as (101000, say)
}

// MapIDs gives the Store the host ids of the sandbox's root and user.
// Without them, restoring an archive-saved manifest onto the host and
// writing a directory-saved one as an archive fail with
// errdefs.ErrFailedPrecondition rather than guess. Call it before any
// other method.
func (s *Store) MapIDs(ids IDs) { s.ids = &ids }

// The sandbox's ids, which archives and version 3 manifests carry.
const (
	sandboxRootID = 0
	sandboxUserID = 1000
)

// hostID is the host owner of an entry of a version 3 manifest.
func (ids *IDs) hostID(uid int) ID {
	if uid == sandboxRootID {
		return ids.Root
	}
	return ids.User
}

// sandboxID is the sandbox's id of a host owner (as workspace.Export
// gives it).
func (ids *IDs) sandboxID(uid int) int {
	if uid == ids.Root.UID && ids.Root != ids.User {
		return sandboxRootID
	}
	return sandboxUserID
}

// noIDs is the error of a translation the Store has no ids for.
func noIDs(what string) error {
	return fmt.Errorf("%s: the store has no sandbox ids to map owners with: %w", what, errdefs.ErrFailedPrecondition)
}

// Fence keeps Collect (Lock) apart from the Saves, Restores and object
// puts (RLock) that rely on chunks Collect could delete. Collect's grace
// period does not cover it: a chunk no manifest names, older than the
// grace, that a Save finds present is not written again, and a Collect
// that read the manifests before the Save wrote its own deletes it. The
// default is a sync.RWMutex, for a process alone with its blob store;
// processes sharing one need a Fence between them (store.RWLock).
type Fence interface {
	RLock(ctx context.Context) error
	RUnlock()
	Lock(ctx context.Context) error
	Unlock()
}

// localFence is the Fence of a process alone with its blob store.
type localFence struct{ sync.RWMutex }

func (f *localFence) RLock(context.Context) error { f.RWMutex.RLock(); return nil }
func (f *localFence) Lock(context.Context) error  { f.RWMutex.Lock(); return nil }

// New returns the store of snapshots under prefix in b, with lim's bounds
// (zero fields take the defaults).
func New(b blob.Store, prefix string, lim Limits) *Store {
	return &Store{blobs: b, prefix: prefix, lim: lim.withDefaults(), gc: &localFence{}}
}

// ShareWith replaces the Store's fence with f, shared with the other
// processes that use the same blob store. Call it before any other
// method.
func (s *Store) ShareWith(f Fence) { s.gc = f }

// Stats says what a Save did.
type Stats struct {
	Files     int
	Bytes     int64 // of regular files: their sizes
	Data      int64 // of regular files less their holes and zero chunks
	NewChunks int   // chunks written, not found in the store
	NewBytes  int64
	Skipped   int   // FIFOs, sockets, devices: not saved
	Reread    int   // files read (not taken from the previous manifest)
	Manifest  int64 // the manifest's size
}

// chunkArea is where the chunks of the manifest at key are: a directory
// of its namespace (the key's first segment, the tenant) for this
// version, the one shared directory for version 1 manifests. Content is
// deduplicated within a namespace only: across tenants, whether a chunk
// was already there (a snapshot's new_bytes) would tell one tenant what
// files another has.
func (s *Store) chunkArea(key string, version int) string {
	if version < 2 {
		return s.prefix + "/chunks/"
	}
	ns, _, _ := strings.Cut(key, "/")
	return s.prefix + "/tenants/" + ns + "/chunks/"
}

// Prefixes are where the blobs of namespace ns are: its manifests and its
// chunks (not those of version 1 manifests, which share one area).
func (s *Store) Prefixes(ns string) []string {
	return []string{s.manifestKey(ns) + "/", s.prefix + "/tenants/" + ns + "/"}
}

// Blobs is the blob store the snapshots are in.
func (s *Store) Blobs() blob.Store { return s.blobs }

func chunkKey(area, sum string) string { return area + sum[:2] + "/" + sum }
func (s *Store) manifestKey(key string) string {
	return s.prefix + "/manifests/" + key
}

// exhausted is the error of a Save past one of its limits.
func exhausted(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrResourceExhausted)...)
}

// Save snapshots dir under key. prev, if not nil, is an earlier manifest
// of the same directory whose hashes are reused for unchanged files.
func (s *Store) Save(ctx context.Context, dir, key string, prev *Manifest) (*Manifest, Stats, error) {
	return s.saving(ctx, key, func(ctx context.Context, st *Stats) (*Manifest, error) {
		return s.save(ctx, dir, key, prev, st)
	})
}

// saving runs save under a Save's key check, time limit and fence.
func (s *Store) saving(ctx context.Context, key string, save func(context.Context, *Stats) (*Manifest, error)) (*Manifest, Stats, error) {
	var st Stats
	if !blob.ValidKey(s.manifestKey(key)) {
		return nil, st, fmt.Errorf("snapshot key %q: %w", key, errdefs.ErrInvalidArgument)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, s.lim.Timeout,
		exhausted("the snapshot took longer than its limit of %v", s.lim.Timeout))
	defer cancel()
	if err := s.gc.RLock(ctx); err != nil {
		return nil, st, err
	}
	defer s.gc.RUnlock()
	m, err := save(ctx, &st)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() == context.DeadlineExceeded {
			err = cause
		}
		return nil, st, fmt.Errorf("snapshot %s: %w", key, err) // not dir: the message reaches clients
	}
	return m, st, nil
}

func (s *Store) save(ctx context.Context, dir, key string, prev *Manifest, st *Stats) (*Manifest, error) {
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	mw, err := newManifestWriter(s.lim.TempDir)
	if err != nil {
		return nil, err
	}
	defer mw.close()
	w := &saver{s: s, ctx: ctx, st: st, mw: mw, buf: make([]byte, ChunkSize), area: s.chunkArea(key, manifestVersion)}
	// A previous manifest elsewhere has its chunks elsewhere.
	if prev != nil && prev.Version == manifestVersion && s.chunkArea(prev.Key, prev.Version) == w.area {
		if w.prev, err = s.open(ctx, prev.Key); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
		if w.prev != nil {
			defer w.prev.Close()
		}
	}
	m := &Manifest{Version: manifestVersion, Key: key, CreatedAt: time.Now().UTC()}
	w.m = m
	var fst unix.Stat_t
	if err := unix.Fstat(root, &fst); err != nil {
		return nil, err
	}
	if err := w.add(entryOf(".", "dir", &fst)); err != nil {
		return nil, err
	}
	m.Dirs++
	if err := w.walk(root, ".", 0); err != nil {
		return nil, err
	}
	return s.putManifest(ctx, mw, m, st)
}

// putManifest stores a saved tree's manifest under its key, with what it
// counted, and returns it.
func (s *Store) putManifest(ctx context.Context, mw *manifestWriter, m *Manifest, st *Stats) (*Manifest, error) {
	st.Files, st.Bytes, st.Data = m.Files, m.Size, m.Data
	r, err := mw.reader(m)
	if err != nil {
		return nil, err
	}
	if st.Manifest, err = s.blobs.Put(ctx, s.manifestKey(m.Key), r); err != nil {
		return nil, err
	}
	return m, nil
}

type saver struct {
	s       *Store
	ctx     context.Context
	st      *Stats
	m       *Manifest
	mw      *manifestWriter
	prev    *opened // the previous manifest, read alongside the walk
	prevE   Entry   // its current entry, if prevOK
	prevOK  bool
	entries int
	read    int64  // bytes of content read
	area    string // where its chunks go
	buf     []byte
}

func entryOf(p, typ string, st *unix.Stat_t) Entry {
	return Entry{
		Path: p, Type: typ, Mode: st.Mode & 0o7777, UID: int(st.Uid), GID: int(st.Gid),
		MTime: st.Mtim.Nano(), Ino: st.Ino, CTime: st.Ctim.Nano(),
	}
}

func (w *saver) add(e Entry) error { return w.mw.add(e) }

// count charges n more entries to the tree's limit.
func (w *saver) count(n int) error {
	w.entries += n
	if w.entries > w.s.lim.MaxEntries {
		return exhausted("the workspace has more than %d entries", w.s.lim.MaxEntries)
	}
	return nil
}

// walk saves the entries of the directory open at fd, whose path is rel
// and which is nested depth directories below the root, in name order.
func (w *saver) walk(fd int, rel string, depth int) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	names, err := w.readNames(fd)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		p := name
		if rel != "." {
			p = rel + "/" + name
		}
		if len(p) > w.s.lim.MaxPath {
			return exhausted("a path is longer than %d bytes (%.64q...)", w.s.lim.MaxPath, p)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed meanwhile
			}
			return fmt.Errorf("%s: %w", p, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if depth+1 > w.s.lim.MaxDepth {
				return exhausted("directories are nested deeper than %d (%.64q...)", w.s.lim.MaxDepth, p)
			}
			sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
					continue // swapped meanwhile
				}
				return fmt.Errorf("%s: %w", p, err)
			}
			err = w.add(entryOf(p, "dir", &st))
			if err == nil {
				w.m.Dirs++
				err = w.walk(sub, p, depth+1)
			}
			unix.Close(sub)
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := readlinkat(fd, name)
			if err != nil {
				if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
					continue
				}
				return fmt.Errorf("%s: %w", p, err)
			}
			e := entryOf(p, "symlink", &st)
			e.Target = target
			if err := w.add(e); err != nil {
				return err
			}
			w.m.Symlinks++
		case unix.S_IFREG:
			e, ok, err := w.file(fd, name, p, &st)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			if ok {
				if err := w.add(e); err != nil {
					return err
				}
				w.m.Files++
				w.m.Size += e.Size
				w.m.Data += e.Data
			}
		default:
			w.st.Skipped++
		}
	}
	return nil
}

// previous returns the previous manifest's entry at p, if it has one.
// Both the walk and the manifest go in comparePaths order, so this reads
// the manifest forward only.
func (w *saver) previous(p string) (*Entry, error) {
	if w.prev == nil {
		return nil, nil
	}
	for {
		if !w.prevOK {
			err := w.prev.next(&w.prevE)
			if err == io.EOF {
				w.prev.Close()
				w.prev = nil
				return nil, nil
			}
			if err != nil {
				return nil, err
			}
			w.prevOK = true
		}
		switch c := comparePaths(w.prevE.Path, p); {
		case c < 0:
			w.prevOK = false
		case c == 0:
			return &w.prevE, nil
		default:
			return nil, nil
		}
	}
}

// file saves one regular file; ok is false if it vanished or turned into
// something else before it could be opened.
func (w *saver) file(dirfd int, name, p string, st *unix.Stat_t) (Entry, bool, error) {
	old, err := w.previous(p)
	if err != nil {
		// A previous manifest that cannot be read only costs the reuse.
		w.prev.Close()
		w.prev, old = nil, nil
	}
	if old != nil && old.Type == "file" && old.Ino == st.Ino && old.Size == st.Size &&
		old.MTime == st.Mtim.Nano() && old.CTime == st.Ctim.Nano() {
		e := entryOf(p, "file", st)
		e.Size, e.Data, e.Chunks = old.Size, old.Data, old.Chunks
		return e, true, nil
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENXIO) {
			return Entry{}, false, nil
		}
		return Entry{}, false, err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return Entry{}, false, err
	}
	if fst.Mode&unix.S_IFMT != unix.S_IFREG {
		w.st.Skipped++
		return Entry{}, false, nil
	}
	w.st.Reread++
	e := entryOf(p, "file", &fst)
	if err := w.content(f, fst.Size, &e); err != nil {
		return Entry{}, false, err
	}
	return e, true, nil
}

// content cuts the file into chunks, up to size (what fstat said; a file
// that shrinks meanwhile ends where it ends). Holes stay holes: the walk
// jumps to the next data (SEEK_DATA) and a chunk of zeros is not stored
// but counted in a run of zero chunks, so a 100 GB sparse file costs its
// data, not 100 GB, here and on restore.
func (w *saver) content(f *os.File, size int64, e *Entry) error {
	var zeros int64 // the zero chunks not yet added
	flush := func() {
		if zeros > 0 {
			e.Chunks = append(e.Chunks, zeroRun(zeros))
			zeros = 0
		}
	}
	off := int64(0) // always at a chunk's start
	for off < size {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		switch {
		case errors.Is(err, unix.ENXIO):
			data = size // nothing but a hole from off on
		case err != nil:
			data = off // no SEEK_DATA here: read it all
		}
		if at := min(data, size) / ChunkSize * ChunkSize; at > off {
			zeros += (at - off) / ChunkSize
			off = at
		}
		if off >= size {
			break
		}
		want := min(ChunkSize, size-off)
		n, err := f.ReadAt(w.buf[:want], off)
		if err != nil && err != io.EOF {
			return err
		}
		if w.read += int64(n); w.read > w.s.lim.MaxBytes {
			return exhausted("the workspace has more than %d bytes of files", w.s.lim.MaxBytes)
		}
		switch {
		case n == 0:
		case bytes.Equal(w.buf[:n], zeroChunk[:n]):
			zeros++
		default:
			flush()
			sum, err := w.put(w.buf[:n])
			if err != nil {
				return err
			}
			e.Chunks = append(e.Chunks, sum)
			e.Data += int64(n)
		}
		off += int64(n)
		if int64(n) < want {
			break // shrunk meanwhile
		}
	}
	flush()
	e.Size = off
	return nil
}

var zeroChunk [ChunkSize]byte // in BSS: nothing to allocate when a program starts

// put stores a chunk unless the store has it.
func (w *saver) put(b []byte) (string, error) {
	h := sha256.Sum256(b)
	sum := hex.EncodeToString(h[:])
	return sum, w.store(sum, b)
}

// store stores the chunk b, whose hash is sum, unless the store has it.
func (w *saver) store(sum string, b []byte) error {
	key := chunkKey(w.area, sum)
	if _, err := w.s.blobs.Stat(w.ctx, key); err == nil {
		return nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if _, err := w.s.blobs.Put(w.ctx, key, bytes.NewReader(b)); err != nil {
		return err
	}
	w.st.NewChunks++
	w.st.NewBytes += int64(len(b))
	return nil
}

// readNames reads a directory's names, a batch at a time, charging them
// to the tree's entry limit as they come: a directory of ten million
// entries is refused before its names fill memory.
func (w *saver) readNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	var names []string
	for {
		batch, err := f.Readdirnames(4096)
		if cerr := w.count(len(batch)); cerr != nil {
			return nil, cerr
		}
		names = append(names, batch...)
		if err == io.EOF {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// opened is a manifest open for reading its entries.
type opened struct {
	blob.Reader
	*manifestReader
	check checker
	area  string // where its chunks are
	// sandbox is a version 3 manifest: its owners are the sandbox's ids.
	sandbox bool
}

// next reads and checks the next entry; io.EOF after the last.
func (o *opened) next(e *Entry) error {
	if err := o.manifestReader.next(e); err != nil {
		return err
	}
	return o.check.check(e)
}

// open opens the manifest at key, its header read into m.
func (s *Store) openManifest(ctx context.Context, key string, m *Manifest) (*opened, error) {
	if !blob.ValidKey(s.manifestKey(key)) {
		return nil, fmt.Errorf("snapshot %q: %w", key, errdefs.ErrNotFound)
	}
	r, err := s.blobs.Open(ctx, s.manifestKey(key))
	if err != nil {
		return nil, err
	}
	mr, err := readHeader(r, m)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("snapshot %q: %w", key, err)
	}
	return &opened{Reader: r, manifestReader: mr, check: checker{lim: s.lim, legacy: mr.legacy}, area: s.chunkArea(key, m.Version),
		sandbox: m.SandboxOwners()}, nil
}

func (s *Store) open(ctx context.Context, key string) (*opened, error) {
	var m Manifest
	return s.openManifest(ctx, key, &m)
}

// Load reads the header of the manifest at key; ErrNotFound if absent.
func (s *Store) Load(ctx context.Context, key string) (*Manifest, error) {
	var m Manifest
	o, err := s.openManifest(ctx, key, &m)
	if err != nil {
		return nil, err
	}
	o.Close()
	return &m, nil
}

// Entries calls fn with each entry of the manifest at key, checked, in
// order, until fn returns an error (which Entries returns).
func (s *Store) Entries(ctx context.Context, key string, fn func(*Entry) error) error {
	return s.entries(ctx, key, s.lim, fn)
}

// entries is Entries with the limits of lim.
func (s *Store) entries(ctx context.Context, key string, lim Limits, fn func(*Entry) error) error {
	o, err := s.open(ctx, key)
	if err != nil {
		return err
	}
	o.check.lim = lim
	defer o.Close()
	var e Entry
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := o.next(&e)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("snapshot %q: %w", key, err)
		}
		if err := fn(&e); err != nil {
			return err
		}
	}
}

// List calls fn with each manifest whose key starts with prefix, in
// order of keys, as blob.Store.List does; Info.Key is the manifest's key.
func (s *Store) List(ctx context.Context, prefix string, fn func(blob.Info) error) error {
	base := s.prefix + "/manifests/"
	return s.blobs.List(ctx, base+prefix, func(info blob.Info) error {
		info.Key = info.Key[len(base):]
		return fn(info)
	})
}

// Delete removes the manifest at key (its chunks go with Collect). Absent
// is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	if !blob.ValidKey(s.manifestKey(key)) {
		return nil
	}
	return s.blobs.Delete(ctx, s.manifestKey(key))
}

// Copy makes the manifest at to a copy of the one at from, which stays:
// both then name the same tree and share its chunks. The two keys must
// be in one namespace (their first element), whose chunk area they
// share. The copy's header keeps the key it was saved under.
func (s *Store) Copy(ctx context.Context, from, to string) error {
	nsFrom, _, _ := strings.Cut(from, "/")
	nsTo, _, _ := strings.Cut(to, "/")
	if nsFrom != nsTo || !blob.ValidKey(s.manifestKey(from)) || !blob.ValidKey(s.manifestKey(to)) {
		return fmt.Errorf("snapshot copy %q to %q: keys of one namespace: %w", from, to, errdefs.ErrInvalidArgument)
	}
	// A collection that ran between the read and the write could take
	// chunks only the copy names.
	if err := s.gc.RLock(ctx); err != nil {
		return err
	}
	defer s.gc.RUnlock()
	r, err := s.blobs.Open(ctx, s.manifestKey(from))
	if err != nil {
		return fmt.Errorf("snapshot %q: %w", from, err)
	}
	defer r.Close()
	_, err = s.blobs.Put(ctx, s.manifestKey(to), r)
	return err
}
