package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/store"
)

// testRWLock: store.RWLock between two processes (two holders on one
// store): readers of both share it, a writer has it alone, and each
// waits for the other.
func testRWLock(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	a, b := store.NewRWLock(s, "gc", "a"), store.NewRWLock(s, "gc", "b")
	ctx := t.Context()
	// short bounds the waits that must not end: the lock is held.
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	if err := a.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.RLock(ctx); err != nil {
		t.Fatalf("two processes' readers: %v", err)
	}
	b.RUnlock()
	if err := b.Lock(short()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a writer while another process reads: %v, want it to wait", err)
	}
	// The writer that gave up left nothing behind: b reads again.
	if err := b.RLock(ctx); err != nil {
		t.Fatalf("a reader after a writer gave up: %v", err)
	}
	b.RUnlock()
	a.RUnlock()
	if err := b.Lock(ctx); err != nil {
		t.Fatalf("a writer with no readers: %v", err)
	}
	if err := a.RLock(short()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a reader while another process writes: %v, want it to wait", err)
	}
	if err := a.Lock(short()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second writer: %v, want it to wait", err)
	}
	b.Unlock()
	if err := a.RLock(ctx); err != nil {
		t.Fatalf("a reader after the writer: %v", err)
	}
	a.RUnlock()

	// Under load: readers and writers of both processes at once; a writer
	// never sees a reader or another writer.
	var readers, writers atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i, l := range []*store.RWLock{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 10 {
				if (i+j)%4 == 0 {
					if err := l.Lock(ctx); err != nil {
						errs <- err
						return
					}
					if w, r := writers.Add(1), readers.Load(); w != 1 || r != 0 {
						errs <- fmt.Errorf("a writer with %d writers and %d readers", w, r)
					}
					time.Sleep(time.Millisecond)
					writers.Add(-1)
					l.Unlock()
					continue
				}
				if err := l.RLock(ctx); err != nil {
					errs <- err
					return
				}
				readers.Add(1)
				if w := writers.Load(); w != 0 {
					errs <- fmt.Errorf("a reader with %d writers", w)
				}
				time.Sleep(time.Millisecond)
				readers.Add(-1)
				l.RUnlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
