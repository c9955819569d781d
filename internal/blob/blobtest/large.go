package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/blob"
)

// The size of the blob of testLarge: several GiB, more than an S3 store
// can keep in memory or put in one request. With -short it is smaller;
// CI runs the whole size.
const (
	largeSize      = 3 << 30
	largeSizeShort = 256 << 20
	// maxHeap is the most heap in use a Put or read of it may take.
	maxHeap = 256 << 20
)

// A blob of several GiB is stored and read back whole, and by ranges,
// with the Go heap bounded: Put and Open stream.
func testLarge(t *testing.T, s blob.Store) {
	ctx := context.Background()
	size := int64(largeSize)
	if testing.Short() {
		size = largeSizeShort
	}
	t.Cleanup(func() { s.Delete(context.Background(), "large") })
	src := newPattern(42, size)
	h := sha256.New()
	var n int64
	var err error
	start := time.Now()
	heap := watchHeap(func() { n, err = s.Put(ctx, "large", io.TeeReader(src, h)) })
	if err != nil || n != size {
		t.Fatalf("Put = %d, %v; want %d", n, err, size)
	}
	t.Logf("Put of %d MiB: %v, peak heap in use %.1f MiB", size>>20, time.Since(start).Round(time.Millisecond), float64(heap)/(1<<20))
	if heap > maxHeap {
		t.Errorf("Put of %d MiB: heap in use up to %d MiB, over %d", size>>20, heap>>20, maxHeap>>20)
	}
	want := h.Sum(nil)
	if info, err := s.Stat(ctx, "large"); err != nil || info.Size != size {
		t.Fatalf("Stat = %+v, %v", info, err)
	}

	r, err := s.Open(ctx, "large")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h.Reset()
	start = time.Now()
	heap = watchHeap(func() { n, err = io.Copy(h, r) })
	if err != nil || n != size || !bytes.Equal(h.Sum(nil), want) {
		t.Fatalf("read back %d bytes of %d (%v), same hash: %v", n, size, err, bytes.Equal(h.Sum(nil), want))
	}
	t.Logf("read of %d MiB: %v, peak heap in use %.1f MiB", size>>20, time.Since(start).Round(time.Millisecond), float64(heap)/(1<<20))
	if heap > maxHeap {
		t.Errorf("read of %d MiB: heap in use up to %d MiB, over %d", size>>20, heap>>20, maxHeap>>20)
	}

	// Ranges about where a store cuts its parts (every MiB of 4, 5, 8
	// and 16 MiB, and the end).
	got, exp := make([]byte, 300), make([]byte, 300)
	for _, off := range []int64{5<<20 - 7, 16<<20 - 150, 64<<20 - 1, 128<<20 + 3, size/2 + 11, size - 300, 0} {
		if _, err := r.Seek(off, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(r, got); err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		src.at(off, exp)
		if !bytes.Equal(got, exp) {
			t.Errorf("the 300 bytes at %d differ", off)
		}
	}
}

// watchHeap runs f and returns the most heap in use while it ran, as
// sampled every 10 ms.
func watchHeap(f func()) (peak uint64) {
	// Twice: buffers pooled by the stores of earlier tests (sync.Pool)
	// are freed at the second GC after they were last used.
	runtime.GC()
	runtime.GC()
	stop, done := make(chan struct{}), make(chan struct{})
	sample := func() {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapInuse)
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	f()
	close(stop)
	<-done
	sample()
	return peak
}
