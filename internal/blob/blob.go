// Package blob defines where sbx keeps bytes that outlive a sandbox and
// are addressed by key rather than by workspace path: the chunks and
// manifests of snapshots, hibernated workspaces, resource content and
// presigned copies (all through internal/snapshot). Backends: fs (local files, the
// default) and s3 (any S3 API: AWS S3, MinIO), for servers that share
// their blobs. Every backend passes blobtest.Run.
package blob

import (
	"context"
	"io"
	"strings"
	"time"
)

// Store keeps blobs by key. Keys are slash-separated paths of
// [A-Za-z0-9._-] segments (see ValidKey).
type Store interface {
	// Put stores r under key, replacing any blob there. Readers see the old
	// blob or the whole new one, never a part.
	Put(ctx context.Context, key string, r io.Reader) (size int64, err error)
	// Open returns the blob for reading with random access (downloads
	// serve Range requests from it); errdefs.ErrNotFound if absent.
	Open(ctx context.Context, key string) (Reader, error)
	// Stat reports a blob; errdefs.ErrNotFound if absent.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes the blob; deleting an absent one is not an error.
	Delete(ctx context.Context, key string) error
	// List calls fn with each blob whose key starts with prefix, in
	// lexical (byte-wise) order of keys, as it walks them: a store of
	// millions of blobs is never one slice in memory. When fn returns an
	// error the walk stops and List returns that error. fn may Delete the
	// blob it is given; a blob Put or deleted elsewhere during the walk
	// may or may not be reported.
	List(ctx context.Context, prefix string, fn func(Info) error) error
}

// Mover is a Store that can rename a blob in one step (the fs backend:
// a rename). Callers fall back to a copy without it.
type Mover interface {
	// Move puts the blob at from under to, replacing any blob there;
	// readers of to see the old blob or the whole new one.
	Move(ctx context.Context, from, to string) error
}

// Reader is an open blob.
type Reader interface {
	io.ReadSeekCloser
	Info() Info
}

// Info describes a blob.
type Info struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// validSegment is one segment of a key: 1-255 of [A-Za-z0-9._-], not
// starting with a dot. (Not a regular expression: compiling one with a
// bounded repeat costs every binary that links this package most of a
// millisecond at start, the sandbox's executor among them.)
func validSegment(s string) bool {
	if len(s) == 0 || len(s) > 255 || s[0] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// ValidKey reports whether key can name a blob: one to sixteen segments of
// [A-Za-z0-9._-] that do not start with a dot.
func ValidKey(key string) bool {
	segs := strings.Split(key, "/")
	if len(segs) > 16 {
		return false
	}
	for _, s := range segs {
		if !validSegment(s) {
			return false
		}
	}
	return true
}

// ValidPrefix reports whether some valid key starts with prefix: a List
// of any other prefix reports nothing.
func ValidPrefix(prefix string) bool {
	segs := strings.Split(prefix, "/")
	if len(segs) > 16 {
		return false
	}
	for _, s := range segs[:len(segs)-1] {
		if !validSegment(s) {
			return false
		}
	}
	last := segs[len(segs)-1]
	return last == "" || validSegment(last)
}
