package store

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// RWLock is a readers-writer lock between the processes that share a
// Store, and within each of them, made of leases: a writer's,
// NAME/writer, and one per process that has readers, NAME/readers/HOLDER.
// A reader takes its process's lease and then looks for the writer's; a
// writer takes its lease and then waits until no process's reader lease
// is live. Each does its write before its read, so of a reader and a
// writer that come together at least one sees the other: the reader
// backs off until the writer is done, or the writer waits for it.
//
// Leases are renewed while held. A process that dies holding one holds
// it until it runs out (RWLockTTL); one cut off from the store for longer
// than that loses it without knowing, which is what a lease is.
type RWLock struct {
	st     Store
	name   string
	holder string

	local sync.RWMutex // this process's readers and writer

	mu      sync.Mutex
	readers int         // this process's, under the reader lease
	renew   *time.Timer // of the lease this process holds, if any
}

// RWLockTTL is how long an RWLock's lease lasts from its last renewal;
// it is renewed every third of that while held.
const RWLockTTL = 30 * time.Second

// rwPoll bounds how long a waiter sleeps between two looks at the leases.
const rwPoll = 250 * time.Millisecond

// NewRWLock returns the lock name in st for the process holder (its
// replica name: one per process).
func NewRWLock(st Store, name, holder string) *RWLock {
	return &RWLock{st: st, name: name, holder: holder}
}

func (l *RWLock) writerLease() string   { return l.name + "/writer" }
func (l *RWLock) readersPrefix() string { return l.name + "/readers/" }
func (l *RWLock) readerLease() string   { return l.readersPrefix() + l.holder }

// RLock takes the lock for reading, waiting while a writer (in any
// process) has it or waits for it.
func (l *RWLock) RLock(ctx context.Context) error {
	delay := 10 * time.Millisecond
	for {
		l.local.RLock()
		ok, err := l.rlockShared(ctx)
		if ok {
			return nil
		}
		l.local.RUnlock()
		if err != nil {
			return err
		}
		if err := sleep(ctx, delay); err != nil {
			return fmt.Errorf("lock %s: waiting for its writer: %w", l.name, err)
		}
		delay = min(2*delay, rwPoll)
	}
}

// rlockShared counts a reader of this process, taking the process's
// reader lease for the first; it reports false if a writer is live.
func (l *RWLock) rlockShared(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.readers > 0 {
		// The lease is live: a writer that came later waits for it.
		l.readers++
		return true, nil
	}
	if _, _, err := l.st.TryLease(ctx, l.readerLease(), l.holder, RWLockTTL); err != nil {
		return false, fmt.Errorf("lock %s: %w", l.name, err)
	}
	_, live, err := l.st.LeaseHolder(ctx, l.writerLease())
	if err != nil || live {
		l.release(l.readerLease())
		if err != nil {
			return false, fmt.Errorf("lock %s: %w", l.name, err)
		}
		return false, nil
	}
	l.readers = 1
	l.keep(l.readerLease())
	return true, nil
}

// RUnlock gives up a read of RLock.
func (l *RWLock) RUnlock() {
	l.mu.Lock()
	if l.readers--; l.readers == 0 {
		l.renew.Stop()
		l.renew = nil
		l.release(l.readerLease())
	}
	l.mu.Unlock()
	l.local.RUnlock()
}

// Lock takes the lock for writing: it waits for this process's readers,
// then takes the writer's lease (one writer at a time, in all processes),
// then waits until no process has readers.
func (l *RWLock) Lock(ctx context.Context) error {
	l.local.Lock()
	if err := l.lockShared(ctx); err != nil {
		l.local.Unlock()
		return err
	}
	return nil
}

func (l *RWLock) lockShared(ctx context.Context) error {
	delay := 10 * time.Millisecond
	for {
		_, held, err := l.st.TryLease(ctx, l.writerLease(), l.holder, RWLockTTL)
		if err != nil {
			return fmt.Errorf("lock %s: %w", l.name, err)
		}
		if held {
			break
		}
		if err := sleep(ctx, delay); err != nil {
			return fmt.Errorf("lock %s: waiting for another writer: %w", l.name, err)
		}
		delay = min(2*delay, rwPoll)
	}
	l.mu.Lock()
	l.keep(l.writerLease())
	l.mu.Unlock()
	delay = 10 * time.Millisecond
	for {
		names, err := l.st.LiveLeases(ctx, l.readersPrefix())
		if err == nil && !slices.ContainsFunc(names, func(n string) bool { return n != l.readerLease() }) {
			return nil
		}
		if err == nil {
			err = sleep(ctx, delay)
			delay = min(2*delay, rwPoll)
		}
		if err != nil {
			l.unlockShared()
			return fmt.Errorf("lock %s: waiting for its readers: %w", l.name, err)
		}
	}
}

// Unlock gives up the lock Lock took.
func (l *RWLock) Unlock() {
	l.unlockShared()
	l.local.Unlock()
}

func (l *RWLock) unlockShared() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renew.Stop()
	l.renew = nil
	l.release(l.writerLease())
}

// keep renews the lease name while this process holds it (until
// renew is stopped). The caller holds l.mu.
func (l *RWLock) keep(name string) {
	var t *time.Timer
	t = time.AfterFunc(RWLockTTL/3, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.renew != t {
			return // given up meanwhile
		}
		ctx, cancel := context.WithTimeout(context.Background(), RWLockTTL/3)
		l.st.TryLease(ctx, name, l.holder, RWLockTTL) // a failure: the lease runs out
		cancel()
		t.Reset(RWLockTTL / 3)
	})
	l.renew = t
}

// release gives the lease up; one that cannot be runs out.
func (l *RWLock) release(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.st.ReleaseLease(ctx, name, l.holder)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
