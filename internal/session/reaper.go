package session

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// collectEvery is how often the reaper runs the one collector of the blob
// store (snapshot.Store.Collect): objects past their time (resource
// content, presigned copies), then the chunks nothing references any
// more; collectGrace is how old such a chunk must be, so that a snapshot
// or an object being written keeps what it found already there.
const (
	collectEvery = 10 * time.Minute
	collectGrace = time.Hour
)

// Reaper is the one background loop of R-62: every ReapInterval it takes
// the sessions that are due (from an index of the store, not a scan) and
// pauses, hibernates or terminates them, and it runs the blob store's
// collector. It takes only the locks of the sessions it works on, and only
// when no request holds them. Only the leader reaps.
type Reaper struct{ m *Manager }

// Reaper is the sessions' reaper.
func (m *Manager) Reaper() *Reaper { return &Reaper{m} }

// run is the loop.
func (r *Reaper) run() {
	m := r.m
	defer m.wg.Done()
	t := time.NewTicker(m.opt.ReapInterval)
	defer t.Stop()
	collected, swept := time.Now(), time.Now()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		if m.opt.Leader != nil && !r.leader() {
			continue // another replica reaps and collects
		}
		r.Pass(m.ctx, time.Now())
		if m.shared() && m.opt.Alive != nil && time.Since(swept) > sweepEvery {
			swept = time.Now()
			m.replicas.sweep(m.ctx)
		}
		if m.opt.Snapshots != nil && time.Since(collected) > collectEvery {
			collected = time.Now()
			c, err := m.opt.Snapshots.Collect(m.ctx, collectGrace)
			m.Stored().Collected()
			for _, key := range c.Unreadable {
				m.log.Error("a snapshot manifest cannot be read; its snapshot cannot be restored", "manifest", key)
			}
			if err != nil {
				m.log.Warn("collecting the blob store", "err", err)
			} else if c.Objects+c.Chunks > 0 {
				m.log.Info("collected the blob store: expired objects, and chunks nothing uses",
					"objects", c.Objects, "chunks", c.Chunks, "bytes", c.Bytes)
			}
		}
	}
}

// leader asks Options.Leader, with a context Close does not cancel: a
// renewal of the leader's lease cut short could still land in the store
// after the lease was given up at shutdown, holding it for nobody until
// it ran out.
func (r *Reaper) leader() bool {
	m := r.m
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), 10*time.Second)
	defer cancel()
	return m.opt.Leader(ctx)
}

// reapWorkers is how many sessions a pass works on at once: a pause takes
// milliseconds, a hibernation as long as its workspace takes to save.
const reapWorkers = 2

// Pass does one pass of the reaper over the sessions due by now, at most
// ReapBatch of them, and returns how many it acted on.
func (r *Reaper) Pass(ctx context.Context, now time.Time) int {
	m := r.m
	start := time.Now()
	due, err := m.opt.Store.ListDueSessions(ctx, now, m.opt.ReapBatch)
	if err != nil {
		m.log.Warn("reaper: listing due sessions", "err", err)
		return 0
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		acted int
		work  = make(chan *store.Session)
	)
	for range min(reapWorkers, len(due)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rec := range work {
				if r.reapOne(ctx, rec, now) {
					mu.Lock()
					acted++
					mu.Unlock()
				}
			}
		}()
	}
	for _, rec := range due {
		work <- rec
	}
	close(work)
	wg.Wait()
	m.opt.Reaped(time.Since(start), acted)
	return acted
}

// reapOne does what a due session needs and reports whether it did
// anything. A session whose lock a request holds is left for the next
// pass; one that cannot be acted on (an execution running, a start in
// flight, an error) is looked at again a little later.
func (r *Reaper) reapOne(ctx context.Context, due *store.Session, now time.Time) bool {
	m := r.m
	k := key{due.Tenant, due.ID}
	unlock, ok := m.locks.tryLock(ctx, k)
	if !ok {
		return false
	}
	defer unlock()
	rec, err := m.opt.Store.GetSession(ctx, k.tenant, k.id)
	if err != nil || rec.Status == api.StatusTerminated || rec.DueAt.IsZero() || rec.DueAt.After(now) {
		return false // gone, or rescheduled since the list was read
	}
	if err := m.replicas.sync(ctx, rec); err != nil {
		m.log.Warn("reaper", "tenant", k.tenant, "session", k.id, "err", err)
		return false
	}
	var action string
	switch {
	case !rec.ExpiresAt.IsZero() && !now.Before(rec.ExpiresAt):
		action = "expire"
		var ended *store.Session
		if ended, err = m.terminate(ctx, rec, "expired: the session's time to live ran out"); err == nil {
			m.emit(ctx, api.EventSessionExpired, ended, api.EventData{Reason: "ttl"})
		}
	case rec.Status == api.StatusHibernated:
		// Due only for its TTL; activity moved that on. Reschedule.
		err = m.save(ctx, rec)
	case rec.Status == api.StatusPaused || rec.SandboxID == "" ||
		// A sandbox that cannot be frozen (runtime.Pauser) would hold
		// its memory paused as much as running: it hibernates at once.
		m.opt.Snapshots != nil && !m.pauses.canPause(ctx, rec):
		if m.opt.Snapshots == nil {
			return r.postpone(ctx, rec, rec.ExpiresAt)
		}
		action = "hibernate"
		_, err = m.hibernation.hibernateAs(ctx, rec, true)
	default:
		action = "pause"
		_, err = m.pauses.freeze(ctx, rec, true)
	}
	if err != nil {
		if !errors.As(err, new(*TransitionError)) {
			m.log.Warn("reaper", "action", action, "tenant", k.tenant, "session", k.id, "err", err)
		}
		// A workspace past the snapshot limits stays so for a while:
		// each try walks up to a limit and freezes the sandbox, so the
		// next waits a hibernation timeout (the TTL still ends it).
		if errors.Is(err, errdefs.ErrResourceExhausted) {
			if s, derr := m.decode(rec); derr == nil && s.Config.HibernateTimeout > 0 {
				return r.postpone(ctx, rec, now.Add(time.Duration(s.Config.HibernateTimeout)*time.Second))
			}
		}
		// Busy or failing: look again when the idle timeout has passed
		// once more, at most a minute from now.
		var cfg Config
		r.postpone(ctx, rec, now.Add(min(time.Minute, r.idleTimeout(rec, &cfg))))
		return false
	}
	if action == "expire" {
		m.opt.Events("expire")
	}
	return action != ""
}

// idleTimeout is the session's pause timeout.
func (r *Reaper) idleTimeout(rec *store.Session, cfg *Config) time.Duration {
	m := r.m
	if s, err := m.decode(rec); err == nil && s.Config.IdleTimeout > 0 {
		return time.Duration(s.Config.IdleTimeout) * time.Second
	}
	return m.opt.Defaults.IdleTimeout
}

// postpone writes a later due time than the schedule would, for a session
// the reaper cannot act on now. It re-reads the record: the failed action
// may have changed it.
func (r *Reaper) postpone(ctx context.Context, rec *store.Session, until time.Time) bool {
	m := r.m
	cur, err := m.opt.Store.GetSession(ctx, rec.Tenant, rec.ID)
	if err != nil || cur.Status == api.StatusTerminated {
		return false
	}
	if until.IsZero() || (!cur.ExpiresAt.IsZero() && cur.ExpiresAt.Before(until)) {
		until = cur.ExpiresAt
	}
	cur.DueAt = until
	if err := m.opt.Store.UpdateSession(ctx, cur); err != nil {
		m.log.Warn("reaper: rescheduling", "session", rec.ID, "err", err)
	}
	return false
}
