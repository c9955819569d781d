package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/internal/store"
)

// leaderLease is the lease in the store that the replica running the
// reaper and the collectors holds, for leaderTTL after its last renewal:
// when it dies, another takes over within that.
const (
	leaderLease = "reaper"
	leaderTTL   = 15 * time.Second
)

// leadership is this process's claim to run the background work of the
// replicas sharing a store. held renews the lease each time it is asked
// (the reaper asks every few seconds).
type leadership struct {
	store  store.Store
	holder string
	log    *slog.Logger

	mu      sync.Mutex
	token   int64     // of the current holding; 0 when not held
	renewed time.Time // when the store last said this process holds it
	asked   bool      // held was called once
}

// replicaName names this process among the replicas: host, pid and a
// random suffix (pids repeat across containers).
func replicaName() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

// held reports whether this process holds the lease now, taking or
// renewing it.
func (l *leadership) held(ctx context.Context) bool {
	token, held, err := l.store.TryLease(ctx, leaderLease, l.holder, leaderTTL)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		// Without the store nothing can be reaped anyway; the lease runs
		// out and another replica may take it.
		if ctx.Err() == nil {
			l.log.Warn("renewing the reaper's lease", "err", err)
		}
		held = false
	}
	switch {
	case held && token != l.token:
		l.log.Info("this replica runs the reaper and the collectors", "replica", l.holder, "token", token)
	case !held && l.token != 0:
		l.log.Info("another replica runs the reaper and the collectors now", "replica", l.holder)
	}
	if !held {
		token = 0
	} else {
		l.renewed = time.Now()
	}
	l.token, l.asked = token, true
	return held
}

// current says whether this process held the lease at its last renewal,
// recent enough (half the lease's time) that it holds it still, without
// asking the store: for work that looks often (the webhook deliverer)
// between the renewals of the reaper and the beat. It asks once, the
// first time, so that a new process does not wait for a beat.
func (l *leadership) current() bool {
	l.mu.Lock()
	asked := l.asked
	l.mu.Unlock()
	if !asked {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return l.held(ctx)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.token != 0 && time.Since(l.renewed) < leaderTTL/2
}

// release gives the lease up, so that another replica takes over at once.
// It asks the store whatever this process last saw: a renewal cut short
// by the shutdown (its context cancelled) leaves token 0 while the store
// still has this process as the holder. Releasing a lease another holds
// does nothing.
func (l *leadership) release() {
	l.mu.Lock()
	l.token = 0
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.store.ReleaseLease(ctx, leaderLease, l.holder); err != nil {
		l.log.Warn("giving up the reaper's lease; another replica takes over when it runs out", "err", err)
	}
}

// Every replica holds a liveness lease of its own, replica/NAME, renewed
// every beatEvery for replicaTTL: the executions it runs carry its name,
// and a replica whose lease has run out is gone, so its unfinished
// executions are failed (execution.Service.Recover) by whichever replica
// runs the reaper.
const (
	replicaTTL = 15 * time.Second
	beatEvery  = 5 * time.Second
)

func replicaLease(name string) string { return "replica/" + name }

// heartbeat takes or renews this replica's liveness lease.
func heartbeat(ctx context.Context, st store.Store, name string) error {
	_, held, err := st.TryLease(ctx, replicaLease(name), name, replicaTTL)
	if err == nil && !held {
		err = fmt.Errorf("the liveness lease of replica %s is another's", name)
	}
	return err
}

// alive says whether the replica named owner still holds its lease.
func alive(ctx context.Context, st store.Store, owner string) (bool, error) {
	holder, live, err := st.LeaseHolder(ctx, replicaLease(owner))
	return live && holder == owner, err
}

// beat keeps this replica alive in the store and, on the replica that
// runs the reaper, fails the executions of replicas that are gone.
func (a *App) beat() {
	defer a.wg.Done()
	t := time.NewTicker(beatEvery)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), beatEvery)
		if err := heartbeat(ctx, a.Store, a.replica); err != nil {
			a.log.Error("renewing this replica's liveness lease; others may take its executions for lost", "err", err)
		}
		if a.leader.held(ctx) {
			if err := a.Execs.Recover(ctx); err != nil {
				a.log.Warn("failing the executions of replicas that stopped", "err", err)
			}
			a.trimEvents(ctx)
		}
		cancel()
	}
}
