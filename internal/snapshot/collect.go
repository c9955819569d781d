package snapshot

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

// collectWait is how long Collect waits for the saves, restores and
// object puts in flight (in every process that shares the fence).
const collectWait = time.Minute

// Collected says what a Collect did.
type Collected struct {
	Objects int   // objects past their time, whose manifests were deleted
	Chunks  int   // chunks deleted
	Bytes   int64 // their size
	// Unreadable are the keys of manifests that could not be read (corrupt,
	// or past the limits): they were skipped, and the chunks only they
	// use are collected, since nothing can restore from them.
	Unreadable []string
}

// Collect deletes the objects past their time (object.go), then the
// chunks that no manifest references and that are older than grace. An
// object's chunks go in the same pass, unless a snapshot or another
// object still uses them. A manifest that is not a valid one is skipped and reported
// in Unreadable; it does not stop the collection of everyone else's
// garbage. An error reading the blob store stops it: deleting what an
// unread manifest might use would be worse than keeping garbage. Each
// chunk area (a tenant's, or the one of version 1 manifests) is collected
// in turn: the set of chunks in use is one area's, read from its
// manifests when the walk of the chunks comes to the area. Neither the
// manifests nor the chunks are ever one list in memory; only the keys of
// version 1 manifests, which are no longer written, are kept.
func (s *Store) Collect(ctx context.Context, grace time.Duration) (Collected, error) {
	var out Collected
	// Saves hold Collect off, and Collect, once it waits, holds new ones
	// off: it waits a while, then lets them go and tries another time.
	lctx, cancel := context.WithTimeout(ctx, collectWait)
	err := s.gc.Lock(lctx)
	cancel()
	if err != nil {
		return out, fmt.Errorf("collect: saves and restores still running after %v; try later: %w", collectWait, err)
	}
	defer s.gc.Unlock()
	// Every manifest is read once here, so that one that cannot be is
	// reported whether or not its area has chunks left.
	var legacy []string
	now := time.Now()
	err = s.List(ctx, "", func(info blob.Info) error {
		m, err := s.Load(ctx, info.Key)
		switch {
		case err == nil && !m.KeepUntil.IsZero() && now.After(m.KeepUntil):
			if err := s.blobs.Delete(ctx, s.manifestKey(info.Key)); err != nil {
				return fmt.Errorf("collect: %w", err)
			}
			out.Objects++
		case err == nil:
			if s.chunkArea(info.Key, m.Version) == s.prefix+"/chunks/" {
				legacy = append(legacy, info.Key)
			}
		case errors.Is(err, errdefs.ErrNotFound):
		case errors.Is(err, errdefs.ErrInvalidArgument):
			out.unreadable(info.Key)
		default:
			return fmt.Errorf("collect: %w", err)
		}
		return nil
	})
	if err != nil {
		return out, err
	}
	c := collector{s: s, grace: grace, out: &out}
	// The shared area of version 1 manifests.
	err = s.blobs.List(ctx, s.prefix+"/chunks/", func(chunk blob.Info) error {
		return c.chunk(ctx, s.prefix+"/chunks/", chunk, func(fn func(key string) error) error {
			for _, key := range legacy {
				if err := fn(key); err != nil {
					return err
				}
			}
			return nil
		})
	})
	if err != nil {
		return out, err
	}
	// The tenants' areas, PREFIX/tenants/NS/chunks/, each a run of the
	// walk: the keys of one area share a prefix. Areas no manifest uses
	// any more are collected too.
	tenants := s.prefix + "/tenants/"
	err = s.blobs.List(ctx, tenants, func(chunk blob.Info) error {
		ns, _, _ := strings.Cut(strings.TrimPrefix(chunk.Key, tenants), "/")
		return c.chunk(ctx, tenants+ns+"/chunks/", chunk, func(fn func(key string) error) error {
			return s.List(ctx, ns, func(info blob.Info) error {
				if info.Key != ns && !strings.HasPrefix(info.Key, ns+"/") {
					return nil // another tenant's, whose name starts with ns
				}
				return fn(info.Key)
			})
		})
	})
	return out, err
}

// unlimited are the limits of Collect's reads: a manifest written under
// higher limits than today's is still one whose chunks must be kept.
var unlimited = Limits{MaxDepth: math.MaxInt, MaxPath: math.MaxInt, MaxEntries: math.MaxInt}

// unreadable reports the manifest at key as unreadable, once.
func (c *Collected) unreadable(key string) {
	if !slices.Contains(c.Unreadable, key) {
		c.Unreadable = append(c.Unreadable, key)
	}
}

// collector collects one chunk area after another.
type collector struct {
	s     *Store
	grace time.Duration
	out   *Collected
	// The area being collected, the chunks its manifests use, and the
	// time before which a chunk no manifest uses is garbage.
	area   string
	used   map[[32]byte]struct{}
	cutoff time.Time
}

// chunk deletes chunk, of area, if none of the manifests that manifests
// walks uses it and it is older than the grace period. The first chunk
// of an area reads its manifests. A chunk outside the area is left alone.
func (c *collector) chunk(ctx context.Context, area string, chunk blob.Info, manifests func(fn func(key string) error) error) error {
	var sum [32]byte
	name := path.Base(chunk.Key)
	if len(name) != 64 || !strings.HasPrefix(chunk.Key, area) {
		return nil
	}
	if _, err := hex.Decode(sum[:], []byte(name)); err != nil {
		return nil
	}
	if area != c.area {
		c.area, c.used = area, map[[32]byte]struct{}{}
		if err := manifests(func(key string) error { return c.use(ctx, key) }); err != nil {
			return err
		}
		c.cutoff = time.Now().Add(-c.grace)
	}
	if _, ok := c.used[sum]; ok || chunk.ModTime.After(c.cutoff) {
		return nil
	}
	if err := c.s.blobs.Delete(ctx, chunk.Key); err != nil {
		return err
	}
	c.out.Chunks++
	c.out.Bytes += chunk.Size
	return nil
}

// use adds the chunks of the manifest at key to the area's set in use, if
// its chunks are in the area.
func (c *collector) use(ctx context.Context, key string) error {
	// Chunks are named by their SHA-256; keeping the 32 bytes, not the 64
	// hex digits, halves the set.
	o, err := c.s.open(ctx, key)
	switch {
	case err == nil:
	case errors.Is(err, errdefs.ErrNotFound):
		return nil // deleted meanwhile
	case errors.Is(err, errdefs.ErrInvalidArgument):
		c.out.unreadable(key)
		return nil
	default:
		return fmt.Errorf("collect: %w", err)
	}
	defer o.Close()
	if o.area != c.area {
		return nil
	}
	o.check.lim = unlimited
	var e Entry
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := o.next(&e)
		switch {
		case err == io.EOF, errors.Is(err, errdefs.ErrNotFound):
			return nil
		case errors.Is(err, errdefs.ErrInvalidArgument):
			c.out.unreadable(key)
			return nil
		case err != nil:
			return fmt.Errorf("collect: snapshot %q: %w", key, err)
		}
		for _, ch := range e.Chunks {
			var sum [32]byte
			if len(ch) == 64 { // not a run of zeros
				hex.Decode(sum[:], []byte(ch))
				c.used[sum] = struct{}{}
			}
		}
	}
}
