package app

import (
	"context"
	"log/slog"
	"time"

	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/webhook"
)

// EventsConfig configures lifecycle events and webhooks. Zero
// fields take the defaults given.
type EventsConfig struct {
	// Retention is how long events are kept: older ones are deleted,
	// hourly, by the replica that runs the reaper. Default 7 days.
	Retention time.Duration
	// Off records no events: the streams stay empty and no webhook is
	// sent anything. For measuring what events cost (bench), not for
	// serving.
	Off bool
	// Poll is how often an event stream looks in the store for events
	// other replicas recorded (default 500ms); the webhook deliverer
	// looks twice as seldom. This process's own events wake both at once.
	Poll time.Duration
	// WebhookAllowPrivate lets webhooks reach loopback, private,
	// link-local and reserved addresses, which they may not by default:
	// a tenant would otherwise have the server call its own ports, its
	// database or a cloud's metadata service.
	WebhookAllowPrivate bool
	// WebhookRetry is the schedule of a delivery's attempts (6, from 1s
	// doubling), WebhookTimeout the bound of each (10s).
	WebhookRetry   webhook.Retry
	WebhookTimeout time.Duration
	// MaxWebhooks caps each tenant's webhooks (default 20).
	MaxWebhooks int
}

// DefaultEventRetention is EventsConfig.Retention's default.
const DefaultEventRetention = 7 * 24 * time.Hour

// trimEvery is how often the leader deletes events past their retention.
const trimEvery = time.Hour

// openEvents makes the event log (nil when events are off) and the
// webhook service of cfg; the caller starts the deliverer once the rest
// is up.
func openEvents(cfg EventsConfig, st store.Store, shared bool, lead *leadership, log *slog.Logger) (*events.Log, *webhook.Service) {
	var evlog *events.Log
	if !cfg.Off {
		evlog = events.New(events.Options{Store: st, Log: log, Shared: shared})
	}
	poll := cfg.Poll
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	wh := webhook.New(webhook.Options{
		Store: st, Events: evlog, Log: log, Leader: lead.current,
		AllowPrivate: cfg.WebhookAllowPrivate, Retry: cfg.WebhookRetry, Timeout: cfg.WebhookTimeout,
		Poll: 2 * poll, MaxPerTenant: cfg.MaxWebhooks,
	})
	return evlog, wh
}

// trimEvents deletes the events past their retention, once every
// trimEvery, on the replica that runs the reaper (the caller checks).
func (a *App) trimEvents(ctx context.Context) {
	if time.Since(a.trimmed) < trimEvery {
		return
	}
	a.trimmed = time.Now()
	keep := a.retention
	if keep <= 0 {
		keep = DefaultEventRetention
	}
	n, err := a.Store.TrimEvents(ctx, time.Now().Add(-keep))
	if err != nil {
		a.log.Warn("deleting old events", "err", err)
		return
	}
	if n > 0 {
		a.log.Info("deleted events past their retention", "count", n, "retention", keep.String())
	}
}
