// Package blobtest is the conformance suite every blob.Store passes.
package blobtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

// Run runs the suite against stores made by open (a fresh, empty one per
// call). Subtests are not parallel: open may set the environment.
func Run(t *testing.T, open func(t *testing.T) blob.Store) {
	ctx := context.Background()
	t.Run("PutOpenReplace", func(t *testing.T) {
		s := open(t)
		for _, data := range []string{"first", "second, longer", ""} {
			n, err := s.Put(ctx, "a/b.txt", strings.NewReader(data))
			if err != nil || n != int64(len(data)) {
				t.Fatalf("Put = %d, %v", n, err)
			}
			r, err := s.Open(ctx, "a/b.txt")
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(r)
			r.Close()
			if string(got) != data || r.Info().Size != int64(len(data)) {
				t.Errorf("Open = %q (size %d), want %q", got, r.Info().Size, data)
			}
			if info, err := s.Stat(ctx, "a/b.txt"); err != nil || info.Size != int64(len(data)) || info.Key != "a/b.txt" || info.ModTime.IsZero() {
				t.Errorf("Stat = %+v, %v", info, err)
			}
		}
	})
	t.Run("Move", func(t *testing.T) {
		s := open(t)
		mv, ok := s.(blob.Mover)
		if !ok {
			t.Skip("the store is not a blob.Mover")
		}
		s.Put(ctx, "tmp/x", strings.NewReader("new"))
		s.Put(ctx, "final/x", strings.NewReader("old"))
		if err := mv.Move(ctx, "tmp/x", "final/x"); err != nil {
			t.Fatal(err)
		}
		r, err := s.Open(ctx, "final/x")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r)
		r.Close()
		if string(got) != "new" {
			t.Errorf("after Move: %q", got)
		}
		if _, err := s.Stat(ctx, "tmp/x"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("the source after Move: %v, want ErrNotFound", err)
		}
		if err := mv.Move(ctx, "tmp/x", "final/y"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Move of nothing: %v, want ErrNotFound", err)
		}
	})
	t.Run("Seek", func(t *testing.T) {
		s := open(t)
		s.Put(ctx, "k", bytes.NewReader([]byte("0123456789")))
		r, err := s.Open(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		r.Seek(4, io.SeekStart)
		b := make([]byte, 3)
		io.ReadFull(r, b)
		if string(b) != "456" {
			t.Errorf("after Seek(4) read %q", b)
		}
	})
	t.Run("RangedReads", func(t *testing.T) { testRangedReads(t, open(t)) })
	t.Run("NotFound", func(t *testing.T) {
		s := open(t)
		if _, err := s.Open(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Open = %v, want ErrNotFound", err)
		}
		if _, err := s.Stat(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Stat = %v, want ErrNotFound", err)
		}
		if err := s.Delete(ctx, "nope"); err != nil {
			t.Errorf("Delete of an absent blob = %v", err)
		}
	})
	t.Run("BadKeys", func(t *testing.T) {
		s := open(t)
		for _, k := range []string{"", "../x", "a/../../x", "/abs", "a//b", ".hidden", "a\x00b", "a/"} {
			if _, err := s.Put(ctx, k, strings.NewReader("x")); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Put(%q) = %v, want ErrInvalidArgument", k, err)
			}
		}
	})
	t.Run("ListDelete", func(t *testing.T) {
		s := open(t)
		for _, k := range []string{"p/1", "p/2", "q/1"} {
			s.Put(ctx, k, strings.NewReader(k))
		}
		got, err := List(ctx, s, "p/")
		if err != nil || len(got) != 2 {
			t.Fatalf("List(p/) = %v, %v", got, err)
		}
		s.Delete(ctx, "p/1")
		if got, _ := List(ctx, s, "p/"); len(got) != 1 || got[0].Key != "p/2" || got[0].Size != 3 {
			t.Errorf("after Delete, List = %v", got)
		}
	})
	t.Run("ListOrder", func(t *testing.T) { testListOrder(t, open(t)) })
	t.Run("ListMany", func(t *testing.T) { testListMany(t, open(t)) })
	t.Run("FailedPutKeepsOld", func(t *testing.T) {
		s := open(t)
		s.Put(ctx, "k", strings.NewReader("old"))
		if _, err := s.Put(ctx, "k", io.MultiReader(strings.NewReader("new"), errReader{})); err == nil {
			t.Fatal("Put from a failing reader succeeded")
		}
		r, err := s.Open(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if b, _ := io.ReadAll(r); string(b) != "old" {
			t.Errorf("after a failed Put, blob = %q", b)
		}
		if l, _ := List(ctx, s, ""); len(l) != 1 {
			t.Errorf("a failed Put left %v", l)
		}
	})
	t.Run("ConcurrentPuts", func(t *testing.T) { testConcurrentPuts(t, open(t)) })
	t.Run("Large", func(t *testing.T) { testLarge(t, open(t)) })
}

// List collects a listing: for tests, whose listings are small.
func List(ctx context.Context, s blob.Store, prefix string) ([]blob.Info, error) {
	var out []blob.Info
	err := s.List(ctx, prefix, func(info blob.Info) error {
		out = append(out, info)
		return nil
	})
	return out, err
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("broken") }
