package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/sbx-sandbox/sbx/api"
)

// SessionMetrics returns the usage of the session's sandbox: a
// reading taken for this call (Current, nil without a running or paused
// sandbox) and the samples the server took, oldest first, at or after
// since (all it has for a zero since).
func (c *Client) SessionMetrics(ctx context.Context, id string, since time.Time) (*api.SessionMetrics, error) {
	p, err := sessionPath(id, "/metrics")
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if !since.IsZero() {
		q.Set("since", since.UTC().Format(time.RFC3339Nano))
	}
	var out api.SessionMetrics
	if _, err := c.call(ctx, http.MethodGet, p, q, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}
