// Package webhook sends a tenant's lifecycle events to the URLs it
// registers: each webhook gets the events of its types, in order, one at
// a time, signed with its secret, retried with backoff, and every attempt
// is kept in its delivery log.
//
// Everything is in the store, as documents, so that every replica sees
// it and a delivery resumes where it was after a restart or a failover:
//
//	webhooks/TENANT/all          the tenant's webhooks, in one document,
//	                             so that the cap holds under concurrent
//	                             creates (one compare-and-swap)
//	webhook-tenants/_sbx/TENANT  the tenants that have had webhooks: what
//	                             the deliverer looks through (documents
//	                             are per tenant; "_sbx" is no tenant's
//	                             name)
//	webhook-state/TENANT/ID      a webhook's cursor (the last event it is
//	                             done with) and its latest attempts
//
// One process delivers at a time: the one Options.Leader names (the
// replica that runs the reaper). Its cursor writes compare revisions, so
// a process that lost the lead and writes late stops at its next write;
// an event may then be sent twice (at least once, never lost), which the
// receiver sees by its X-Sbx-Delivery.
package webhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// Document kinds and keys (see the package comment).
const (
	kindWebhooks = "webhooks"
	keyAll       = "all"
	kindTenants  = "webhook-tenants"
	indexTenant  = "_sbx"
	kindState    = "webhook-state"
)

// Options configure a Service. Zero fields take the defaults given.
type Options struct {
	Store store.Store
	// Events wakes the deliverer up when this process records an event;
	// without it the deliverer only polls.
	Events *events.Log
	Log    *slog.Logger
	// Leader says whether this process delivers now; nil: always.
	Leader func() bool
	// AllowPrivate lets webhooks reach loopback, private and link-local
	// addresses (dial.go): for tests and private deployments.
	AllowPrivate bool
	// Retry is the schedule of attempts for one event.
	Retry Retry
	// Timeout bounds one attempt (default 10s).
	Timeout time.Duration
	// Poll is how often the deliverer looks in the store for webhooks and
	// for events other processes recorded (default 1s).
	Poll time.Duration
	// MaxPerTenant caps a tenant's webhooks (default 20).
	MaxPerTenant int
	// KeepDeliveries is how many attempts each webhook's log keeps
	// (default 50).
	KeepDeliveries int
}

// Service keeps the tenants' webhooks and, once started, delivers to
// them.
type Service struct {
	opt    Options
	log    *slog.Logger
	client *http.Client

	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu      sync.Mutex
	workers map[workerKey]*worker
}

// New returns a service; Start starts delivering, Close stops.
func New(opt Options) *Service {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 10 * time.Second
	}
	if opt.Poll <= 0 {
		opt.Poll = time.Second
	}
	if opt.MaxPerTenant <= 0 {
		opt.MaxPerTenant = 20
	}
	if opt.KeepDeliveries <= 0 {
		opt.KeepDeliveries = 50
	}
	opt.Retry = opt.Retry.withDefaults()
	ctx, stop := context.WithCancel(context.Background())
	return &Service{
		opt: opt, log: opt.Log, client: newClient(opt.AllowPrivate, opt.Timeout),
		ctx: ctx, stop: stop, workers: map[workerKey]*worker{},
	}
}

// stored is a webhook as its tenant's document keeps it.
type stored struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	Secret    string    `json:"secret"`
	CreatedAt time.Time `json:"created_at"`
	// After is the number of its webhook.created event: it is sent the
	// events after it.
	After int64 `json:"after"`
}

type tenantDoc struct {
	Webhooks []stored `json:"webhooks"`
}

func (h *stored) toAPI() api.Webhook {
	evs := h.Events
	if len(evs) == 0 {
		evs = []string{"*"}
	}
	return api.Webhook{WebhookID: h.ID, URL: h.URL, Events: slices.Clone(evs), CreatedAt: h.CreatedAt}
}

// load reads the tenant's webhooks and the document's revision (0 when
// it has none).
func (s *Service) load(ctx context.Context, tenant string) (*tenantDoc, int64, error) {
	d, err := s.opt.Store.GetDocument(ctx, kindWebhooks, tenant, keyAll)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &tenantDoc{}, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var td tenantDoc
	if err := json.Unmarshal(d.Value, &td); err != nil {
		return nil, 0, fmt.Errorf("webhooks of tenant %q: %w", tenant, err)
	}
	return &td, d.Revision, nil
}

func (s *Service) save(ctx context.Context, tenant string, td *tenantDoc, rev int64) error {
	v, _ := json.Marshal(td)
	return s.opt.Store.PutDocument(ctx, &store.Document{Kind: kindWebhooks, Tenant: tenant, Key: keyAll, Value: v, Revision: rev})
}

// Secrets a tenant sets are 16..256 bytes.
const (
	minSecret = 16
	maxSecret = 256
)

// Create registers a webhook. Its secret (the request's, or one made) is
// in the answer and never shown again. Past the tenant's cap it is
// ErrResourceExhausted.
func (s *Service) Create(ctx context.Context, tenant string, req api.WebhookRequest) (*api.Webhook, error) {
	if err := checkURL(req.URL, s.opt.AllowPrivate); err != nil {
		return nil, err
	}
	types, err := events.ParseTypes(req.Events)
	if err != nil {
		return nil, err
	}
	secret := req.Secret
	switch {
	case secret == "":
		b := make([]byte, 32)
		rand.Read(b)
		secret = "whsec_" + hex.EncodeToString(b)
	case len(secret) < minSecret || len(secret) > maxSecret:
		return nil, fmt.Errorf("secret: want %d to %d bytes: %w", minSecret, maxSecret, errdefs.ErrInvalidArgument)
	}
	b := make([]byte, 8)
	rand.Read(b)
	h := stored{ID: "wh-" + hex.EncodeToString(b), URL: req.URL, Events: types, Secret: secret, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	capErr := func(n int) error {
		return fmt.Errorf("tenant %q has %d webhooks, the most it may have; delete one first: %w", tenant, n, errdefs.ErrResourceExhausted)
	}
	td, rev, err := s.load(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if len(td.Webhooks) >= s.opt.MaxPerTenant {
		return nil, capErr(len(td.Webhooks))
	}
	// Its own event says where in the tenant's events it starts: the
	// number of any event recorded later is larger.
	ev := &store.Event{Tenant: tenant, Type: api.EventWebhookCreated, CreatedAt: h.CreatedAt, Data: mustJSON(api.EventData{WebhookID: h.ID})}
	if err := s.opt.Store.AppendEvent(ctx, ev); err != nil {
		return nil, err
	}
	h.After = ev.Seq
	for try := 0; ; try++ {
		td.Webhooks = append(td.Webhooks, h)
		err = s.save(ctx, tenant, td, rev)
		if !errors.Is(err, errdefs.ErrConflict) && !errors.Is(err, errdefs.ErrAlreadyExists) || try == 20 {
			break
		}
		if td, rev, err = s.load(ctx, tenant); err != nil {
			break
		}
		if len(td.Webhooks) >= s.opt.MaxPerTenant {
			err = capErr(len(td.Webhooks))
			break
		}
	}
	if err != nil {
		s.deleted(ctx, tenant, h.ID) // its webhook.created stands alone otherwise
		return nil, err
	}
	if err := s.index(ctx, tenant); err != nil {
		s.log.Error("webhooks: recording a tenant with webhooks; its webhooks are not delivered to until this succeeds", "tenant", tenant, "err", err)
	}
	out := h.toAPI()
	out.Secret = secret
	return &out, nil
}

// index records that the tenant has webhooks, for the deliverer. An
// entry is never removed: it costs the deliverer one read a pass.
func (s *Service) index(ctx context.Context, tenant string) error {
	err := s.opt.Store.PutDocument(ctx, &store.Document{Kind: kindTenants, Tenant: indexTenant, Key: tenant, Value: json.RawMessage(`{}`)})
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		return nil
	}
	return err
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// List returns the tenant's webhooks, oldest first, without secrets.
func (s *Service) List(ctx context.Context, tenant string) ([]api.Webhook, error) {
	td, _, err := s.load(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]api.Webhook, 0, len(td.Webhooks))
	for i := range td.Webhooks {
		out = append(out, td.Webhooks[i].toAPI())
	}
	return out, nil
}

// find returns the tenant's webhook of that id; ErrNotFound if it has
// none (another tenant's is none of its).
func (s *Service) find(ctx context.Context, tenant, id string) (*stored, error) {
	td, _, err := s.load(ctx, tenant)
	if err != nil {
		return nil, err
	}
	for i := range td.Webhooks {
		if td.Webhooks[i].ID == id {
			return &td.Webhooks[i], nil
		}
	}
	return nil, fmt.Errorf("webhook %q: %w", id, errdefs.ErrNotFound)
}

// Get returns one webhook, without its secret.
func (s *Service) Get(ctx context.Context, tenant, id string) (*api.Webhook, error) {
	h, err := s.find(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	out := h.toAPI()
	return &out, nil
}

// Delete removes a webhook; an attempt in flight finishes, and nothing
// more is sent.
func (s *Service) Delete(ctx context.Context, tenant, id string) error {
	for try := 0; ; try++ {
		td, rev, err := s.load(ctx, tenant)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(td.Webhooks, func(h stored) bool { return h.ID == id })
		if i < 0 {
			return fmt.Errorf("webhook %q: %w", id, errdefs.ErrNotFound)
		}
		td.Webhooks = slices.Delete(td.Webhooks, i, i+1)
		err = s.save(ctx, tenant, td, rev)
		if err == nil {
			break
		}
		if !errors.Is(err, errdefs.ErrConflict) || try == 20 {
			return err
		}
	}
	s.deleted(ctx, tenant, id)
	return nil
}

// deleted removes what a webhook that is gone left: its state, and
// records its webhook.deleted.
func (s *Service) deleted(ctx context.Context, tenant, id string) {
	if err := s.opt.Store.DeleteDocument(ctx, kindState, tenant, id, 0); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Warn("webhooks: removing a deleted webhook's state", "tenant", tenant, "webhook", id, "err", err)
	}
	ev := &store.Event{Tenant: tenant, Type: api.EventWebhookDeleted, CreatedAt: time.Now().UTC(), Data: mustJSON(api.EventData{WebhookID: id})}
	if err := s.opt.Store.AppendEvent(ctx, ev); err != nil {
		s.log.Warn("webhooks: recording a webhook's deletion", "tenant", tenant, "webhook", id, "err", err)
	}
}

// Deliveries returns the webhook's latest attempts, newest first, and
// the last event it is done with.
func (s *Service) Deliveries(ctx context.Context, tenant, id string) (*api.WebhookDeliveryList, error) {
	h, err := s.find(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	st, _, err := s.loadState(ctx, tenant, h)
	if err != nil {
		return nil, err
	}
	out := &api.WebhookDeliveryList{Deliveries: make([]api.WebhookDelivery, 0, len(st.Deliveries)), After: st.After}
	for i := len(st.Deliveries) - 1; i >= 0; i-- {
		out.Deliveries = append(out.Deliveries, st.Deliveries[i])
	}
	return out, nil
}

// state is a webhook's progress, kept in its webhook-state document.
type state struct {
	// After is the last event the webhook is done with.
	After int64 `json:"after"`
	// Deliveries are its latest attempts, oldest first.
	Deliveries []api.WebhookDelivery `json:"deliveries"`
}

// loadState reads a webhook's state and its revision; one never written
// starts after the webhook's webhook.created (revision 0).
func (s *Service) loadState(ctx context.Context, tenant string, h *stored) (*state, int64, error) {
	d, err := s.opt.Store.GetDocument(ctx, kindState, tenant, h.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &state{After: h.After}, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var st state
	if err := json.Unmarshal(d.Value, &st); err != nil {
		return nil, 0, fmt.Errorf("webhook %q: state: %w", h.ID, err)
	}
	return &st, d.Revision, nil
}
