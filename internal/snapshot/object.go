package snapshot

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

// Objects are single files kept in a namespace's chunk area by the
// SHA-256 of their content: the content of session resources and
// the copies behind presigned URLs. They are cut into chunks like
// a snapshot's files (zero chunks are not stored, and a chunk a
// namespace has already is not stored again), so the one collector keeps
// and frees them with everything else. Each has a manifest at
// NS/_objects/SHA256, a version 2 manifest of a root directory and one
// file (objectEntry) with two more header fields: the content's hash
// and the time until which the object is kept. Collect deletes the
// manifest once that time has passed, and the chunks only it used go
// with the same pass. ("_objects" cannot be a session's id, which starts
// with a letter or digit, so no snapshot key is ever one.)

// objectDir is the segment under a namespace where its objects are.
const objectDir = "_objects"

// objectEntry is the name of an object's one file in its manifest.
const objectEntry = "content"

// Object describes a stored object.
type Object struct {
	SHA256    string
	Size      int64
	KeepUntil time.Time
	// Created says that PutObject stored content the namespace did not
	// have as an object (its chunks may have been there already).
	Created bool
	// NewBytes is what PutObject added to the blob store: new chunks and
	// a manifest written. A put that fails may have added chunks too (for
	// Collect to remove): its Object says how many bytes.
	NewBytes int64
}

func objectKey(ns, sum string) string { return ns + "/" + objectDir + "/" + sum }

// validNamespace says whether ns is one segment of a blob key: a
// namespace is the first segment of its keys, and names their chunk area.
func validNamespace(ns string) bool {
	return !strings.Contains(ns, "/") && blob.ValidKey(ns)
}

// ValidSum says whether sum is a SHA-256 in lower-case hex.
func ValidSum(sum string) bool { return validChunkName(sum) }

// PutObject stores what r gives, at most max bytes, as an object of
// namespace ns (a tenant's, which no other tenant shares chunks with),
// named by its SHA-256, and keeps it at least until keepUntil. If want
// is not empty the content must hash to it. Putting content that is
// there already refreshes it: it is kept until the later of its time and
// keepUntil, and its manifest is rewritten only if that moves. A wrong
// hash is errdefs.ErrInvalidArgument, more than max bytes
// errdefs.ErrResourceExhausted; the chunks stored by then are garbage
// for Collect.
func (s *Store) PutObject(ctx context.Context, ns, want string, r io.Reader, max int64, keepUntil time.Time) (obj Object, err error) {
	if want != "" && !ValidSum(want) {
		return obj, fmt.Errorf("content hash %q: want 64 lower-case hex digits: %w", want, errdefs.ErrInvalidArgument)
	}
	if !validNamespace(ns) {
		return obj, fmt.Errorf("object namespace %q: %w", ns, errdefs.ErrInvalidArgument)
	}
	// The content is read without holding off Collect: it comes from a
	// client, as slowly as the edge lets it, and a Collect waiting for
	// its lock would hold up every Save and Restore behind it. The
	// chunks are checked once the lock is held instead (below).
	w := &saver{s: s, ctx: ctx, st: &Stats{}, buf: make([]byte, ChunkSize), area: s.chunkArea(ns+"/"+objectDir, manifestVersion)}
	var manifestBytes int64
	defer func() { obj.NewBytes = w.st.NewBytes + manifestBytes }()
	h := sha256.New()
	e := Entry{Path: objectEntry, Type: "file", Mode: 0o444}
	var zeros int64
	for {
		if err := ctx.Err(); err != nil {
			return obj, err
		}
		n, err := io.ReadFull(r, w.buf)
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			return obj, err
		}
		if e.Size += int64(n); e.Size > max {
			return obj, fmt.Errorf("content larger than the limit of %d bytes: %w", max, errdefs.ErrResourceExhausted)
		}
		h.Write(w.buf[:n])
		switch {
		case n == 0:
		case bytes.Equal(w.buf[:n], zeroChunk[:n]):
			zeros++
		default:
			if zeros > 0 {
				e.Chunks, zeros = append(e.Chunks, zeroRun(zeros)), 0
			}
			sum, err := w.put(w.buf[:n])
			if err != nil {
				return obj, err
			}
			e.Chunks = append(e.Chunks, sum)
			e.Data += int64(n)
		}
		if n < ChunkSize {
			break
		}
	}
	if zeros > 0 {
		e.Chunks = append(e.Chunks, zeroRun(zeros))
	}
	obj.SHA256, obj.Size = hex.EncodeToString(h.Sum(nil)), e.Size
	if want != "" && obj.SHA256 != want {
		return obj, fmt.Errorf("content of %d bytes has SHA-256 %s, not %s: %w", e.Size, obj.SHA256, want, errdefs.ErrInvalidArgument)
	}
	// A chunk found present and not written (or written longer ago than
	// Collect's grace) may have been collected since: under the fence,
	// no Collect runs until the manifest names them.
	if err := s.gc.RLock(ctx); err != nil {
		return obj, err
	}
	defer s.gc.RUnlock()
	checked := make(map[string]bool, len(e.Chunks))
	for _, c := range e.Chunks {
		if checked[c] || !ValidSum(c) {
			continue
		}
		checked[c] = true
		if _, err := s.blobs.Stat(ctx, chunkKey(w.area, c)); errors.Is(err, errdefs.ErrNotFound) {
			return obj, fmt.Errorf("object %s: chunk %s was collected while the content was read; send it again", obj.SHA256, c)
		} else if err != nil {
			return obj, err
		}
	}
	key := objectKey(ns, obj.SHA256)
	var have Manifest
	created := time.Now().UTC()
	o, err := s.openManifest(ctx, key, &have)
	switch {
	case err == nil:
		o.Close()
		if !have.KeepUntil.Before(keepUntil) {
			obj.KeepUntil = have.KeepUntil
			return obj, nil // kept long enough already
		}
		created = have.CreatedAt // kept longer: the same content still
	case errors.Is(err, errdefs.ErrNotFound):
		obj.Created = true
	case errors.Is(err, errdefs.ErrInvalidArgument):
		obj.Created = true // unreadable: written anew
	default:
		return obj, err
	}
	obj.KeepUntil = keepUntil.UTC()
	m := Manifest{
		Version: manifestVersion, Key: key, CreatedAt: created, Files: 1, Dirs: 1,
		Size: e.Size, Data: e.Data, SHA256: obj.SHA256, KeepUntil: obj.KeepUntil,
	}
	b, err := objectManifest(&m, e)
	if err != nil {
		return obj, err
	}
	n, err := s.blobs.Put(ctx, s.manifestKey(key), bytes.NewReader(b))
	if err != nil {
		return obj, err
	}
	if obj.Created {
		manifestBytes = n
	}
	return obj, nil
}

// objectManifest is the gzipped manifest of an object: small enough (a
// line per 4 MiB) to be made in memory.
func objectManifest(m *Manifest, e Entry) ([]byte, error) {
	doc := struct {
		*Manifest
		Entries []Entry
	}{m, []Entry{{Path: ".", Type: "dir", Mode: 0o755}, e}}
	j, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(j)
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// OpenObject opens the object of namespace ns whose content hashes to
// sum: errdefs.ErrNotFound if there is none, or if it is past the time it
// was kept until (the collector may be taking its chunks). Reading it
// fetches only the chunks read, each checked against its hash.
func (s *Store) OpenObject(ctx context.Context, ns, sum string) (*ObjectReader, error) {
	if !ValidSum(sum) || !validNamespace(ns) {
		return nil, fmt.Errorf("object %q: %w", sum, errdefs.ErrNotFound)
	}
	key := objectKey(ns, sum)
	var m Manifest
	o, err := s.openManifest(ctx, key, &m)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	if m.SHA256 != sum || m.KeepUntil.IsZero() {
		return nil, fmt.Errorf("object %s: %w", sum, errdefs.ErrNotFound)
	}
	if time.Now().After(m.KeepUntil) {
		return nil, fmt.Errorf("object %s: expired at %s: %w", sum, m.KeepUntil.Format(time.RFC3339), errdefs.ErrNotFound)
	}
	var e, file Entry
	found := false
	for {
		err := o.next(&e)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("object %s: %w", sum, err)
		}
		if e.Path == objectEntry && e.Type == "file" {
			file, found = e, true
		}
	}
	if !found {
		return nil, fmt.Errorf("object %s: manifest without content: %w", sum, errdefs.ErrNotFound)
	}
	r := &ObjectReader{s: s, ctx: ctx, area: o.area, size: file.Size, modTime: m.CreatedAt, keep: m.KeepUntil, sum: sum, cur: -1}
	// Where each chunk starts, runs of zeros expanded to one span each.
	var off int64
	for _, c := range file.Chunks {
		if z, ok := parseZeroRun(c); ok {
			r.spans = append(r.spans, span{off: off, n: z * ChunkSize})
			off += z * ChunkSize
			continue
		}
		r.spans = append(r.spans, span{off: off, n: ChunkSize, sum: c})
		off += ChunkSize
	}
	return r, nil
}

// span is a stored chunk or a run of zero chunks of an object.
type span struct {
	off, n int64
	sum    string // "" for zeros
}

// ObjectReader reads an object. It is an io.ReadSeeker and io.ReaderAt
// (for http.ServeContent); it is not safe for concurrent use.
type ObjectReader struct {
	s       *Store
	ctx     context.Context
	area    string
	sum     string
	size    int64
	modTime time.Time
	keep    time.Time
	spans   []span
	off     int64
	// The chunk last fetched.
	cur int
	buf []byte
}

// Size is the object's size in bytes.
func (r *ObjectReader) Size() int64 { return r.size }

// ModTime is when the object was first stored.
func (r *ObjectReader) ModTime() time.Time { return r.modTime }

// KeepUntil is when the object may be collected.
func (r *ObjectReader) KeepUntil() time.Time { return r.keep }

// SHA256 is the hash of the object's content.
func (r *ObjectReader) SHA256() string { return r.sum }

// Close releases the chunk it holds.
func (r *ObjectReader) Close() error {
	r.buf, r.cur = nil, -1
	return nil
}

func (r *ObjectReader) Read(p []byte) (int, error) {
	n, err := r.ReadAt(p, r.off)
	r.off += int64(n)
	return n, err
}

// Seek sets where Read reads next.
func (r *ObjectReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += r.size
	default:
		return r.off, fmt.Errorf("seek: whence %d: %w", whence, errdefs.ErrInvalidArgument)
	}
	if offset < 0 {
		return r.off, fmt.Errorf("seek to %d: %w", offset, errdefs.ErrInvalidArgument)
	}
	r.off = offset
	return offset, nil
}

// ReadAt reads from off, fetching the chunks it spans.
func (r *ObjectReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read at %d: %w", off, errdefs.ErrInvalidArgument)
	}
	n := 0
	for n < len(p) {
		if off >= r.size {
			return n, io.EOF
		}
		if err := r.ctx.Err(); err != nil {
			return n, err
		}
		i := r.spanAt(off)
		sp := r.spans[i]
		end := min(sp.off+sp.n, r.size)
		want := min(int64(len(p)-n), end-off)
		if sp.sum == "" {
			clear(p[n : n+int(want)])
		} else {
			if err := r.fetch(i); err != nil {
				return n, err
			}
			copy(p[n:n+int(want)], r.buf[off-sp.off:])
		}
		n += int(want)
		off += want
	}
	return n, nil
}

// spanAt finds the span holding byte off (< size).
func (r *ObjectReader) spanAt(off int64) int {
	lo, hi := 0, len(r.spans)
	for lo < hi {
		mid := (lo + hi) / 2
		if r.spans[mid].off+r.spans[mid].n <= off {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// fetch reads chunk i into buf, unless it is there, and checks it.
func (r *ObjectReader) fetch(i int) error {
	if r.cur == i {
		return nil
	}
	sp := r.spans[i]
	b, err := r.s.blobs.Open(r.ctx, chunkKey(r.area, sp.sum))
	if err != nil {
		return fmt.Errorf("object %s: chunk %s: %w", r.sum, sp.sum, err)
	}
	defer b.Close()
	// As large as this chunk, and one byte more to see a longer one: a
	// small object does not cost a whole chunk's buffer.
	want := min(r.size-sp.off, ChunkSize)
	if int64(cap(r.buf)) < want+1 {
		r.buf = make([]byte, want+1)
	}
	r.buf = r.buf[:want+1]
	r.cur = -1
	n, err := io.ReadFull(b, r.buf)
	if err != nil && err != io.ErrUnexpectedEOF {
		return fmt.Errorf("object %s: chunk %s: %w", r.sum, sp.sum, err)
	}
	if int64(n) != want {
		return fmt.Errorf("object %s: chunk %s has %d bytes or more, want %d", r.sum, sp.sum, n, want)
	}
	r.buf = r.buf[:n]
	if h := sha256.Sum256(r.buf); hex.EncodeToString(h[:]) != sp.sum {
		return fmt.Errorf("object %s: chunk %s is corrupt: its content hashes otherwise", r.sum, sp.sum)
	}
	r.cur = i
	return nil
}

var (
	_ io.ReadSeeker = (*ObjectReader)(nil)
	_ io.ReaderAt   = (*ObjectReader)(nil)
)
