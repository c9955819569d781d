package client

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
)

func webhookPath(id, rest string) (string, error) {
	seg, err := segment("webhook", id)
	if err != nil {
		return "", err
	}
	return api.Prefix + "/webhooks/" + seg + rest, nil
}

// CreateWebhook registers a webhook. The answer holds its secret,
// which is never shown again.
func (c *Client) CreateWebhook(ctx context.Context, req api.WebhookRequest) (*api.Webhook, error) {
	var out api.Webhook
	if _, err := c.call(ctx, http.MethodPost, api.Prefix+"/webhooks", nil, req, &out, http.StatusCreated); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListWebhooks returns the tenant's webhooks, without their secrets.
func (c *Client) ListWebhooks(ctx context.Context) ([]api.Webhook, error) {
	var out api.WebhookList
	if _, err := c.call(ctx, http.MethodGet, api.Prefix+"/webhooks", nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Webhooks, nil
}

// GetWebhook returns one webhook, without its secret.
func (c *Client) GetWebhook(ctx context.Context, id string) (*api.Webhook, error) {
	p, err := webhookPath(id, "")
	if err != nil {
		return nil, err
	}
	var out api.Webhook
	if _, err := c.call(ctx, http.MethodGet, p, nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteWebhook deletes a webhook.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	p, err := webhookPath(id, "")
	if err != nil {
		return err
	}
	_, err = c.call(ctx, http.MethodDelete, p, nil, nil, nil, http.StatusNoContent)
	return err
}

// WebhookDeliveries returns a webhook's delivery log: its latest
// attempts, newest first.
func (c *Client) WebhookDeliveries(ctx context.Context, id string) (*api.WebhookDeliveryList, error) {
	p, err := webhookPath(id, "/deliveries")
	if err != nil {
		return nil, err
	}
	var out api.WebhookDeliveryList
	if _, err := c.call(ctx, http.MethodGet, p, nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// ErrWebhookSignature is what VerifyWebhook says of a delivery it does
// not take.
var ErrWebhookSignature = errors.New("webhook delivery not verified")

// DefaultWebhookTolerance is how old (or how far ahead) a delivery's
// timestamp may be: receivers refuse older ones, so that a delivery seen
// on the way cannot be sent to them again later.
const DefaultWebhookTolerance = 5 * time.Minute

// VerifyWebhook checks a delivery a webhook received: its X-Sbx-Signature
// must be the HMAC-SHA256 under secret of X-Sbx-Timestamp, ".", and the
// body as received (the raw bytes: not decoded and encoded again), and
// its timestamp within tolerance of now (0: DefaultWebhookTolerance). A
// receiver should also take each X-Sbx-Delivery once: an event is sent
// again when its answer was lost.
//
//	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
//	if err := client.VerifyWebhook(secret, r.Header, body, 0); err != nil {
//		http.Error(w, "bad signature", http.StatusUnauthorized)
//		return
//	}
//	var ev api.Event
//	json.Unmarshal(body, &ev)
func VerifyWebhook(secret string, h http.Header, body []byte, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = DefaultWebhookTolerance
	}
	ts := h.Get(api.HeaderWebhookTimestamp)
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s %q is not a unix time", ErrWebhookSignature, api.HeaderWebhookTimestamp, ts)
	}
	if d := time.Since(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: its timestamp is %v away from now, more than %v", ErrWebhookSignature, d.Round(time.Second), tolerance)
	}
	got, ok := strings.CutPrefix(h.Get(api.HeaderWebhookSignature), "sha256=")
	sig, err := hex.DecodeString(got)
	if !ok || err != nil {
		return fmt.Errorf("%w: no sha256= signature in %s", ErrWebhookSignature, api.HeaderWebhookSignature)
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	if !hmac.Equal(sig, mac.Sum(nil)) {
		return fmt.Errorf("%w: the signature does not match", ErrWebhookSignature)
	}
	return nil
}
