package snapshot

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"path"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

// Collected says what a Collect did.
type Collected struct {
	Chunks int   // chunks deleted
	Bytes  int64 // their size
	// Unreadable are the keys of manifests that could not be read (corrupt,
	// or past the limits): they were skipped, and the chunks only they
	// use are collected, since nothing can restore from them.
	Unreadable []string
}

// Collect deletes chunks that no manifest references and that are older
// than grace. A manifest that is not a valid one is skipped and reported
// in Unreadable; it does not stop the collection of everyone else's
// garbage. An error reading the blob store stops it: deleting what an
// unread manifest might use would be worse than keeping garbage. Each
// chunk area (a tenant's, or the one of version 1 manifests) is collected
// in turn: the set of chunks in use is one area's.
func (s *Store) Collect(ctx context.Context, grace time.Duration) (Collected, error) {
	var out Collected
	s.gc.Lock()
	defer s.gc.Unlock()
	manifests, err := s.List(ctx, "")
	if err != nil {
		return out, err
	}
	areas := map[string][]string{} // chunk area: its manifests
	for _, info := range manifests {
		m, err := s.Load(ctx, info.Key)
		switch {
		case err == nil:
			area := s.chunkArea(info.Key, m.Version)
			areas[area] = append(areas[area], info.Key)
		case errors.Is(err, errdefs.ErrNotFound):
		case errors.Is(err, errdefs.ErrInvalidArgument):
			out.Unreadable = append(out.Unreadable, info.Key)
		default:
			return out, fmt.Errorf("collect: %w", err)
		}
	}
	// Every chunk, by area: areas no manifest uses any more are collected
	// too.
	chunks := map[string][]blob.Info{}
	for _, dir := range []string{s.prefix + "/chunks/", s.prefix + "/tenants/"} {
		infos, err := s.blobs.List(ctx, dir)
		if err != nil {
			return out, err
		}
		for _, c := range infos {
			area := s.prefix + "/chunks/"
			if dir != area {
				ns, _, _ := strings.Cut(strings.TrimPrefix(c.Key, dir), "/")
				area = dir + ns + "/chunks/"
			}
			chunks[area] = append(chunks[area], c)
		}
	}
	for area, infos := range chunks {
		if err := s.collectArea(ctx, area, areas[area], infos, grace, &out); err != nil {
			return out, err
		}
	}
	return out, nil
}

// unlimited are the limits of Collect's reads: a manifest written under
// higher limits than today's is still one whose chunks must be kept.
var unlimited = Limits{MaxDepth: math.MaxInt, MaxPath: math.MaxInt, MaxEntries: math.MaxInt}

// collectArea collects the chunks of one area that none of its manifests
// (keys) uses. A chunk outside the area is left alone.
func (s *Store) collectArea(ctx context.Context, area string, keys []string, chunks []blob.Info, grace time.Duration, out *Collected) error {
	// Chunks are named by their SHA-256; keeping the 32 bytes, not the 64
	// hex digits, halves the set.
	used := map[[32]byte]struct{}{}
	for _, key := range keys {
		err := s.entries(ctx, key, unlimited, func(e *Entry) error {
			for _, c := range e.Chunks {
				var sum [32]byte
				if len(c) == 64 { // not a run of zeros
					hex.Decode(sum[:], []byte(c))
					used[sum] = struct{}{}
				}
			}
			return nil
		})
		switch {
		case err == nil, errors.Is(err, errdefs.ErrNotFound):
		case errors.Is(err, errdefs.ErrInvalidArgument):
			out.Unreadable = append(out.Unreadable, key)
		default:
			return fmt.Errorf("collect: %w", err)
		}
	}
	cutoff := time.Now().Add(-grace)
	for _, c := range chunks {
		var sum [32]byte
		name := path.Base(c.Key)
		if len(name) != 64 || !strings.HasPrefix(c.Key, area) {
			continue
		}
		if _, err := hex.Decode(sum[:], []byte(name)); err != nil {
			continue
		}
		if _, ok := used[sum]; ok || c.ModTime.After(cutoff) {
			continue
		}
		if err := s.blobs.Delete(ctx, c.Key); err != nil {
			return err
		}
		out.Chunks++
		out.Bytes += c.Size
	}
	return nil
}
