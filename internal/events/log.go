package events

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// Options configure a Log.
type Options struct {
	Store store.Store
	Log   *slog.Logger
	// Shared says other processes append to the store too (replicas):
	// Record then waits for its event to be in.
	Shared bool
	// MaxQueue bounds the events waiting for the store (default 10000):
	// past it, while the store does not answer, new events are dropped
	// (and logged) rather than held without bound.
	MaxQueue int
	// RecordWait bounds how long Record waits (default 2s): a store that
	// does not answer delays a change that long, and no longer.
	RecordWait time.Duration
	// Linger is how long the queue waits after an event comes before it
	// appends it with those that come meanwhile (default 20ms; negative:
	// not at all). An execution's start and end are then written after
	// its answer is on its way, not beside it: on a busy machine the
	// appends' CPU and the store's one writer (SQLite) slowed the round
	// trip by about 5% when written at once. An event Record waits for
	// goes at once.
	Linger time.Duration
}

// Log appends one process's events to the store, in the order they are
// emitted, from one goroutine that Close stops. It is safe for
// concurrent use.
type Log struct {
	opt     Options
	log     *slog.Logger
	kick    chan struct{} // the queue has something (capacity 1)
	urgent  chan struct{} // a Record waits on it (capacity 1)
	closing chan struct{} // Close was called: append what is queued, then stop
	done    chan struct{} // the goroutine has stopped

	mu      sync.Mutex
	queue   []*item
	pending int // queued or being appended
	dropped int
	closed  bool
	last    map[string]int64 // each tenant's last number this process appended
	changed chan struct{}    // closed and replaced after every append
}

type item struct {
	ev   store.Event
	done chan struct{} // closed when appended or dropped; nil for Emit
	// flush marks Flush's place in the queue: nothing to append.
	flush bool
}

// New returns a log and starts its goroutine.
func New(opt Options) *Log {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.MaxQueue <= 0 {
		opt.MaxQueue = 10000
	}
	if opt.RecordWait <= 0 {
		opt.RecordWait = 2 * time.Second
	}
	if opt.Linger == 0 {
		opt.Linger = 20 * time.Millisecond
	}
	l := &Log{
		opt: opt, log: opt.Log, kick: make(chan struct{}, 1), urgent: make(chan struct{}, 1),
		closing: make(chan struct{}), done: make(chan struct{}),
		last: map[string]int64{}, changed: make(chan struct{}),
	}
	go l.run()
	return l
}

// Emit queues e for the store and returns at once.
func (l *Log) Emit(e Event) { l.enqueue(e, false) }

// Record queues e and, when the store is shared with other processes,
// waits until it is appended (or dropped), at most Options.RecordWait or
// until ctx ends. A process alone with its store needs no wait: its
// events are numbered in the order they are emitted.
func (l *Log) Record(ctx context.Context, e Event) {
	it := l.enqueue(e, l.opt.Shared)
	if it == nil || it.done == nil {
		return
	}
	t := time.NewTimer(l.opt.RecordWait)
	defer t.Stop()
	select {
	case <-it.done:
	case <-t.C:
	case <-ctx.Done():
	}
}

func (l *Log) enqueue(e Event, wait bool) *item {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	data, err := json.Marshal(e.Data)
	if err != nil {
		l.log.Error("event data", "type", e.Type, "err", err)
		return nil
	}
	it := &item{ev: store.Event{
		Tenant: e.Tenant, SessionID: e.SessionID, Type: e.Type, Data: data,
		CreatedAt: e.Time.UTC().Truncate(time.Microsecond),
	}}
	if wait {
		it.done = make(chan struct{})
	}
	l.mu.Lock()
	if l.closed || len(l.queue) >= l.opt.MaxQueue {
		l.dropped++
		l.mu.Unlock()
		return nil
	}
	l.queue = append(l.queue, it)
	l.pending++
	l.mu.Unlock()
	signal(l.kick)
	if wait {
		signal(l.urgent)
	}
	return it
}

// Flush waits until the events this process emitted before it are
// appended (or dropped), at most Options.RecordWait or until ctx ends,
// without the queue's linger: a reader that asks after a change made
// through this process then sees its event. It returns at once when
// nothing is queued.
func (l *Log) Flush(ctx context.Context) {
	l.mu.Lock()
	if l.pending == 0 || l.closed {
		l.mu.Unlock()
		return
	}
	it := &item{flush: true, done: make(chan struct{})}
	l.queue = append(l.queue, it)
	l.pending++
	l.mu.Unlock()
	signal(l.kick)
	signal(l.urgent)
	t := time.NewTimer(l.opt.RecordWait)
	defer t.Stop()
	select {
	case <-it.done:
	case <-t.C:
	case <-ctx.Done():
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Last is the number of the tenant's last event this process appended,
// 0 if none: a reader that has read up to it has nothing new from this
// process (other processes' events it must look for in the store).
func (l *Log) Last(tenant string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last[tenant]
}

// Changed is closed at the next append of this process.
func (l *Log) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// Close appends what is queued (for at most 5 seconds if the store does
// not take it), then stops the goroutine. Events emitted after Close are
// dropped.
func (l *Log) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.done
		return
	}
	l.closed = true
	l.mu.Unlock()
	close(l.closing)
	<-l.done
}

// closeGrace is how long Close gives the store to take what is queued.
const closeGrace = 5 * time.Second

func (l *Log) run() {
	defer close(l.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Once closing, the queue has closeGrace to go in.
		select {
		case <-l.closing:
			t := time.NewTimer(closeGrace)
			defer t.Stop()
			select {
			case <-t.C:
				cancel()
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for {
		closing := false
		select {
		case <-l.kick:
		case <-l.closing:
			closing = true
		}
		if !closing && l.opt.Linger > 0 {
			linger.Reset(l.opt.Linger)
			select {
			case <-linger.C:
			case <-l.urgent:
				linger.Stop()
			case <-l.closing:
				linger.Stop()
				closing = true
			}
		}
		select {
		case <-l.urgent: // served by this round
		default:
		}
		for {
			l.mu.Lock()
			batch, dropped := l.queue, l.dropped
			l.queue, l.dropped = nil, 0
			l.mu.Unlock()
			if dropped > 0 {
				l.log.Error("events dropped: the store did not take them fast enough", "count", dropped)
			}
			if len(batch) == 0 {
				break
			}
			l.appendAll(ctx, batch)
		}
		if closing {
			return
		}
	}
}

// appendAll writes what the queue held: the events between Flush's
// marks in one store transaction each, so that an execution's start and
// end, which the linger brings together, cost one commit, not two (on
// SQLite, one turn of its one writer). A batch the store refuses is
// written one event at a time, so that only a bad event is given up.
func (l *Log) appendAll(ctx context.Context, batch []*item) {
	for len(batch) > 0 {
		n := 0
		for n < len(batch) && !batch[n].flush {
			n++
		}
		if n <= 1 {
			l.append(ctx, batch[0])
			batch = batch[1:]
			continue
		}
		run := batch[:n]
		batch = batch[n:]
		evs := make([]*store.Event, len(run))
		for i, it := range run {
			evs[i] = &it.ev
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := l.opt.Store.AppendEvents(actx, evs)
		cancel()
		if err != nil {
			for _, it := range run {
				l.append(ctx, it)
			}
			continue
		}
		for _, it := range run {
			l.appended(it)
		}
	}
}

// appended does what follows an event's append: its waiter and the
// streams hear of it.
func (l *Log) appended(it *item) {
	l.mu.Lock()
	l.pending--
	if it.ev.Seq > l.last[it.ev.Tenant] {
		l.last[it.ev.Tenant] = it.ev.Seq
	}
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	if it.done != nil {
		close(it.done)
	}
}

// append writes one event, trying again a few times over about a second
// (a store that is briefly away, a PostgreSQL failover), then gives up
// and logs it: the events after it must not wait for ever.
func (l *Log) append(ctx context.Context, it *item) {
	if it.done != nil {
		defer close(it.done)
	}
	defer func() {
		l.mu.Lock()
		l.pending--
		l.mu.Unlock()
	}()
	if it.flush {
		return
	}
	backoff := 50 * time.Millisecond
	for try := 1; ; try++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := l.opt.Store.AppendEvent(actx, &it.ev)
		cancel()
		if err == nil {
			break
		}
		if try == 5 || errors.Is(err, errdefs.ErrInvalidArgument) || ctx.Err() != nil {
			l.log.Error("recording an event", "tenant", it.ev.Tenant, "session", it.ev.SessionID, "type", it.ev.Type, "err", err)
			return
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		backoff *= 2
	}
	l.mu.Lock()
	if it.ev.Seq > l.last[it.ev.Tenant] {
		l.last[it.ev.Tenant] = it.ev.Seq
	}
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}
