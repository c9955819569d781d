package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

// Reads after seeks to anywhere, backwards and forwards, to the end and
// past it, return the blob's bytes there (an S3 store serves them with
// ranged GETs).
func testRangedReads(t *testing.T, s blob.Store) {
	ctx := context.Background()
	const size = 3<<20 + 17
	want := make([]byte, size)
	newPattern(7, size).at(0, want)
	if _, err := s.Put(ctx, "r", bytes.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	r, err := s.Open(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Info().Size != size {
		t.Errorf("Info().Size = %d, want %d", r.Info().Size, size)
	}
	var cur int64
	for i, step := range []struct {
		off    int64
		whence int
		n      int
	}{
		{0, io.SeekCurrent, 100},
		{1<<20 - 1, io.SeekStart, 4096}, // across a MiB
		{-50, io.SeekCurrent, 100},      // back a little
		{10, io.SeekCurrent, 10},        // forward a little
		{2 << 20, io.SeekStart, 1 << 20},
		{-10, io.SeekEnd, 100}, // 10, then the end
		{0, io.SeekEnd, 10},    // nothing
		{size + 5, io.SeekStart, 10},
		{5, io.SeekStart, 1},
		{0, io.SeekStart, size}, // all of it
		{-size, io.SeekEnd, 7},
		{size - 1, io.SeekStart, 1},
	} {
		pos, err := r.Seek(step.off, step.whence)
		wantPos := step.off + map[int]int64{io.SeekStart: 0, io.SeekCurrent: cur, io.SeekEnd: size}[step.whence]
		if err != nil || pos != wantPos {
			t.Fatalf("step %d: Seek(%d, %d) = %d, %v; want %d", i, step.off, step.whence, pos, err, wantPos)
		}
		buf := make([]byte, step.n)
		k, err := io.ReadFull(r, buf)
		wantK := int(max(0, min(int64(step.n), size-pos)))
		switch {
		case k != wantK:
			t.Errorf("step %d: read %d bytes at %d, want %d (%v)", i, k, pos, wantK, err)
		case k < step.n && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF):
			t.Errorf("step %d: a read past the end: %v", i, err)
		case k == step.n && err != nil:
			t.Errorf("step %d: %v", i, err)
		case !bytes.Equal(buf[:k], want[min(pos, size):min(pos, size)+int64(k)]):
			t.Errorf("step %d: the %d bytes at %d differ", i, k, pos)
		}
		cur = pos + int64(k)
	}
	if _, err := r.Seek(-1, io.SeekStart); err == nil {
		t.Error("Seek(-1) succeeded")
	}
}

// Writers replace one key at once while readers read it: every read is of
// one writer's whole content. Two of the writers' blobs are larger than
// one part of an S3 multipart upload.
func testConcurrentPuts(t *testing.T, s blob.Store) {
	ctx := context.Background()
	sizes := []int64{1<<10 + 1, 300<<10 + 2, 20<<20 + 3, 20<<20 + 4}
	sums := map[[sha256.Size]byte]int64{}
	for i, size := range sizes {
		h := sha256.New()
		io.Copy(h, newPattern(uint64(i), size))
		sums[[sha256.Size]byte(h.Sum(nil))] = size
	}
	// read reads the blob whole: nil if it is one writer's, or absent.
	read := func() error {
		r, err := s.Open(ctx, "k")
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		defer r.Close()
		h := sha256.New()
		n, err := io.Copy(h, r)
		if err != nil {
			return err
		}
		if size, ok := sums[[sha256.Size]byte(h.Sum(nil))]; !ok || size != n || r.Info().Size != n {
			return fmt.Errorf("read %d bytes (Info says %d) that are no writer's", n, r.Info().Size)
		}
		return nil
	}
	var writers, readers sync.WaitGroup
	var done atomic.Bool
	errs := make(chan error, 16)
	for i, size := range sizes {
		writers.Go(func() {
			for range 2 {
				if n, err := s.Put(ctx, "k", newPattern(uint64(i), size)); err != nil || n != size {
					errs <- fmt.Errorf("writer %d: Put = %d, %v", i, n, err)
					return
				}
			}
		})
	}
	reads := make([]int, 2)
	for i := range reads {
		readers.Go(func() {
			for !done.Load() {
				if err := read(); err != nil {
					errs <- fmt.Errorf("reader %d: %w", i, err)
					return
				}
				reads[i]++
			}
		})
	}
	writers.Wait()
	done.Store(true)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, err := s.Stat(ctx, "k"); err != nil {
		t.Errorf("after the writers: %v", err)
	} else if err := read(); err != nil {
		t.Errorf("after the writers: %v", err)
	}
	t.Logf("reads during the writes: %v", reads)
}
