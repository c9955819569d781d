package server

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/chat"
)

// A tenant's chat turns spend the operator's model tokens. --limits
// chat_tokens=N bounds them to about N an hour, as a leaky bucket: each
// tenant's use fills a bucket of N that drains N an hour, and a turn
// starts, and each model call of a turn goes on, only while the bucket
// is not full. What a call uses is counted when it ends (the endpoint's
// usage, which the loop asks for with stream_options.include_usage, or
// an estimate of bytes / 4 when it gives none), so a turn passes the
// budget by its last call at most, and each turn at once by one call.
// The buckets are this process's, kept in memory: with replicas each
// bounds what it serves, and a restart empties them.

// chatBudgets are the tenants' token buckets.
type chatBudgets struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	now     func() time.Time
}

// bucket is one tenant's: level tokens at at.
type bucket struct {
	level float64
	at    time.Time
}

// drained is the bucket's level at now, with limit tokens an hour gone.
func (b *bucket) drained(now time.Time, limit int64) float64 {
	rate := float64(limit) / float64(time.Hour)
	return math.Max(0, b.level-rate*float64(now.Sub(b.at)))
}

// allow refuses a tenant whose bucket is full, saying when it will not
// be (as Retry-After).
func (c *chatBudgets) allow(tenant string, limit int64) error {
	if limit <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.buckets[tenant]
	if b == nil {
		return nil
	}
	now := c.now()
	level := b.drained(now, limit)
	if level < float64(limit) {
		return nil
	}
	wait := time.Duration((level - float64(limit) + 1) / float64(limit) * float64(time.Hour))
	err := fmt.Errorf("tenant %q: model tokens of chat turns (limit chat_tokens): %d used of %d an hour; try again in %s: %w",
		tenant, int64(level), limit, wait.Round(time.Second), errdefs.ErrResourceExhausted)
	return retryAfter(err, wait)
}

// use adds tokens to the tenant's bucket.
func (c *chatBudgets) use(tenant string, limit, tokens int64) {
	if limit <= 0 || tokens <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	b := c.buckets[tenant]
	if b == nil {
		b = &bucket{at: now}
		c.buckets[tenant] = b
	}
	b.level, b.at = b.drained(now, limit)+float64(tokens), now
}

// chatMeter is the meter of a turn of tenant's, nil without a budget.
func (s *Server) chatMeter(tenant string, limit int64) chat.Meter {
	if limit <= 0 {
		return nil
	}
	return chatMeter{b: &s.budgets, tenant: tenant, limit: limit}
}

// chatMeter is a turn's chat.Meter: its tenant's bucket.
type chatMeter struct {
	b      *chatBudgets
	tenant string
	limit  int64
}

func (m chatMeter) Allow() error     { return m.b.allow(m.tenant, m.limit) }
func (m chatMeter) Use(tokens int64) { m.b.use(m.tenant, m.limit, tokens) }
