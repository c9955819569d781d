package session

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/internal/store"
)

// locker holds the sessions' locks (lock, tryLock): an in-process mutex
// per session and, between replicas (replica set), a lease in the store.
// It knows nothing else of sessions.
type locker struct {
	store   store.Store
	replica string // "" for a process alone with its store
	kind    string // what the lock serialises: its leases' prefix
	log     *slog.Logger

	mu    sync.Mutex
	locks map[key]*keyLock
}

func newLocker(st store.Store, replica, kind string, log *slog.Logger) *locker {
	return &locker{store: st, replica: replica, kind: kind, log: log, locks: map[key]*keyLock{}}
}

// keyLock serializes the lifecycle changes of one session.
type keyLock struct {
	sync.Mutex
	refs int
}

func (lk *locker) keyLock(k key) (*keyLock, func()) {
	lk.mu.Lock()
	l := lk.locks[k]
	if l == nil {
		l = &keyLock{}
		lk.locks[k] = l
	}
	l.refs++
	lk.mu.Unlock()
	return l, func() {
		lk.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(lk.locks, k)
		}
		lk.mu.Unlock()
	}
}

// lock takes the session's lock and returns its release. Between
// replicas (Options.Replica) the lock is also a lease in the store,
// taken after the in-process mutex, so that processes queue on the store
// and threads of one process in memory.
func (lk *locker) lock(ctx context.Context, k key) (func(), error) {
	l, release := lk.keyLock(k)
	l.Lock()
	held, err := lk.lease(ctx, k, true)
	if err != nil {
		l.Unlock()
		release()
		return nil, err
	}
	return func() { held.release(); l.Unlock(); release() }, nil
}

// tryLock takes the session's lock if no one holds it.
func (lk *locker) tryLock(ctx context.Context, k key) (func(), bool) {
	l, release := lk.keyLock(k)
	if !l.TryLock() {
		release()
		return nil, false
	}
	held, err := lk.lease(ctx, k, false)
	if err != nil || held == nil {
		l.Unlock()
		release()
		return nil, false
	}
	return func() { held.release(); l.Unlock(); release() }, true
}

// The lease of a session's lock lasts sessionLeaseTTL from its last
// renewal; the holder renews it every sessionLeaseRenew while it holds it
// (a hibernation can take minutes). A replica that dies holding it blocks
// the session's changes until it runs out.
const (
	sessionLeaseTTL   = 10 * time.Second
	sessionLeaseRenew = 3 * time.Second
)

// leaseName is the name of a session's lease of kind. Lease names are
// global; the tenant's length keeps any tenant name from reaching
// another's.
func leaseName(kind string, k key) string {
	return fmt.Sprintf("%s/%d/%s/%s", kind, len(k.tenant), k.tenant, k.id)
}

// heldLease is a session's lease while this process holds it. The zero
// value, for a process alone with its store, holds nothing.
type heldLease struct {
	lk    *locker
	name  string
	mu    sync.Mutex
	timer *time.Timer
	done  bool
}

// lease takes the session's lease in the store: with wait, until it has
// it or ctx ends; without, once (nil if another replica holds it).
func (lk *locker) lease(ctx context.Context, k key, wait bool) (*heldLease, error) {
	if lk.replica == "" {
		return &heldLease{}, nil
	}
	name := leaseName(lk.kind, k)
	delay := time.Millisecond
	for {
		_, held, err := lk.store.TryLease(ctx, name, lk.replica, sessionLeaseTTL)
		if err != nil {
			return nil, fmt.Errorf("session %q: taking its lock: %w", k.id, err)
		}
		if held {
			h := &heldLease{lk: lk, name: name}
			h.mu.Lock()
			h.timer = time.AfterFunc(sessionLeaseRenew, h.renew)
			h.mu.Unlock()
			return h, nil
		}
		if !wait {
			return nil, nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("session %q: waiting for another replica to finish changing it: %w", k.id, context.Cause(ctx))
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}

func (h *heldLease) renew() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sessionLeaseRenew)
	_, held, err := h.lk.store.TryLease(ctx, h.name, h.lk.replica, sessionLeaseTTL)
	cancel()
	if err != nil || !held {
		// What this process writes from now on is fenced by the record's
		// revision: a replica that took the lease meanwhile and wrote
		// makes those writes fail.
		h.lk.log.Error("renewing a session's lock failed; another replica may take it", "lease", h.name, "held", held, "err", err)
	}
	h.timer.Reset(sessionLeaseRenew)
}

func (h *heldLease) release() {
	if h.lk == nil {
		return
	}
	h.mu.Lock()
	h.done = true
	h.timer.Stop()
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.lk.store.ReleaseLease(ctx, h.name, h.lk.replica); err != nil {
		h.lk.log.Warn("releasing a session's lock; others wait until it runs out", "lease", h.name, "err", err)
	}
}
