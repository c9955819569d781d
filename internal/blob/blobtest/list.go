package blobtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/blob"
)

var errStop = errors.New("stop")

// Keys come in byte-wise order whatever the backend's own order: "a-x"
// and "a.x" before "a/x", which a directory walk would give first.
func testListOrder(t *testing.T, s blob.Store) {
	ctx := context.Background()
	keys := []string{"a/y/z", "b", "a0", "a/x", "a.x", "A", "a_", "a-x", "a/y-1"}
	for _, k := range keys {
		if _, err := s.Put(ctx, k, strings.NewReader(k)); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(keys)
	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{"", keys},
		{"a", []string{"a-x", "a.x", "a/x", "a/y-1", "a/y/z", "a0", "a_"}},
		{"a/", []string{"a/x", "a/y-1", "a/y/z"}},
		{"a/y", []string{"a/y-1", "a/y/z"}},
		{"a/y/", []string{"a/y/z"}},
		{"a/x", []string{"a/x"}},
		{"zzz", nil},
		{"a//", nil},
		{"../", nil},
	} {
		var got []string
		err := s.List(ctx, c.prefix, func(info blob.Info) error {
			if info.Size != int64(len(info.Key)) || info.ModTime.IsZero() {
				t.Errorf("List(%q): %+v", c.prefix, info)
			}
			got = append(got, info.Key)
			return nil
		})
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("List(%q) = %q, %v; want %q", c.prefix, got, err, c.want)
		}
	}
	// fn's error stops the walk and is List's.
	n := 0
	err := s.List(ctx, "", func(blob.Info) error {
		if n++; n == 3 {
			return fmt.Errorf("the third: %w", errStop)
		}
		return nil
	})
	if !errors.Is(err, errStop) || n != 3 {
		t.Errorf("a walk stopped at the third: %d calls, %v", n, err)
	}
	// fn may delete what it is given.
	n = 0
	err = s.List(ctx, "", func(info blob.Info) error {
		n++
		return s.Delete(ctx, info.Key)
	})
	if left, _ := List(ctx, s, ""); err != nil || n != len(keys) || len(left) != 0 {
		t.Errorf("deleting while walking: %d of %d, %v; left %v", n, len(keys), err, left)
	}
}

// A listing longer than a page of S3's ListObjectsV2 (1,000 keys) is
// walked whole and in order, with a prefix, and stopped past a page.
func testListMany(t *testing.T, s blob.Store) {
	ctx := context.Background()
	const n = 2500
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("many/%02d/%04d", i/100, i)
	}
	put(t, s, append(slices.Clone(want), "many-x", "many.x", "other"), 8)
	check := func(prefix string, from, to int) {
		t.Helper()
		i := from
		err := s.List(ctx, prefix, func(info blob.Info) error {
			if i >= to || info.Key != want[i] || info.Size != int64(len(want[i])) {
				return fmt.Errorf("key %d is %+v", i-from, info)
			}
			i++
			return nil
		})
		if err != nil || i != to {
			t.Errorf("List(%q): %d keys of %d, %v", prefix, i-from, to-from, err)
		}
	}
	check("many/", 0, n)
	check("many/1", 1000, 2000) // exactly one page
	check("many/2", 2000, n)
	check("many/24/", 2400, n)
	seen := 0
	err := s.List(ctx, "many/", func(blob.Info) error {
		if seen++; seen == 1500 {
			return errStop
		}
		return nil
	})
	if err != errStop || seen != 1500 {
		t.Errorf("a walk stopped at 1,500: %d calls, %v", seen, err)
	}
}

// put stores each key with its name as its content, by workers at once.
func put(t *testing.T, s blob.Store, keys []string, workers int) {
	t.Helper()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	next := make(chan string)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for k := range next {
				if _, err := s.Put(ctx, k, strings.NewReader(k)); err != nil {
					cancel(fmt.Errorf("put %s: %w", k, err))
				}
			}
		})
	}
	for _, k := range keys {
		if ctx.Err() != nil {
			break
		}
		next <- k
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		t.Fatal(err)
	}
}
