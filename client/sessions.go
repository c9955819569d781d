package client

import (
	"context"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/sbx-sandbox/sbx/api"
)

func sessionPath(id string, rest string) (string, error) {
	seg, err := segment("session id", id)
	if err != nil {
		return "", err
	}
	return api.Prefix + "/sessions/" + seg + rest, nil
}

// CreateSession creates a session, or returns the existing one of
// req.SessionID; created says which.
func (c *Client) CreateSession(ctx context.Context, req api.CreateSessionRequest) (s *api.Session, created bool, err error) {
	s = new(api.Session)
	status, err := c.call(ctx, http.MethodPost, api.Prefix+"/sessions", nil, req, s, http.StatusCreated, http.StatusOK)
	if err != nil {
		return nil, false, err
	}
	return s, status == http.StatusCreated, nil
}

// GetSession returns the session; IsNotFound(err) if there is none.
func (c *Client) GetSession(ctx context.Context, id string) (*api.Session, error) {
	return c.sessionCall(ctx, http.MethodGet, id, "", nil)
}

// ListSessionsOptions filter and page a listing. Zero fields do not
// filter.
type ListSessionsOptions struct {
	Status  string
	UserID  string
	AgentID string
	// Metadata selects sessions whose metadata has each key set to its
	// value.
	Metadata map[string]string
	// Limit is the page size, 1..1000 (0: the server's default, 100).
	Limit int
	// PageToken is the NextPageToken of the previous page.
	PageToken string
}

// ListSessions returns a page of sessions.
func (c *Client) ListSessions(ctx context.Context, opts ListSessionsOptions) (*api.SessionList, error) {
	q := url.Values{}
	set(q, "status", opts.Status)
	set(q, "user_id", opts.UserID)
	set(q, "agent_id", opts.AgentID)
	for _, k := range slices.Sorted(maps.Keys(opts.Metadata)) {
		q.Add("metadata", k+":"+opts.Metadata[k])
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	set(q, "page_token", opts.PageToken)
	var list api.SessionList
	if _, err := c.call(ctx, http.MethodGet, api.Prefix+"/sessions", q, nil, &list, http.StatusOK); err != nil {
		return nil, err
	}
	return &list, nil
}

// DeleteSession terminates the session and removes its workspace.
// Deleting a deleted session succeeds again.
func (c *Client) DeleteSession(ctx context.Context, id string) (*api.DeleteSessionResponse, error) {
	p, err := sessionPath(id, "")
	if err != nil {
		return nil, err
	}
	var out api.DeleteSessionResponse
	if _, err := c.call(ctx, http.MethodDelete, p, nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// PauseSession freezes the session's sandbox.
func (c *Client) PauseSession(ctx context.Context, id string) (*api.Session, error) {
	return c.sessionCall(ctx, http.MethodPost, id, "/pause", nil)
}

// ResumeSession resumes a paused or hibernated session.
func (c *Client) ResumeSession(ctx context.Context, id string) (*api.Session, error) {
	return c.sessionCall(ctx, http.MethodPost, id, "/resume", nil)
}

// Keepalive makes the session expire timeoutSeconds from now (0: its
// TTL from now).
func (c *Client) Keepalive(ctx context.Context, id string, timeoutSeconds int64) (*api.Session, error) {
	var body any
	if timeoutSeconds > 0 {
		body = api.KeepaliveRequest{Timeout: timeoutSeconds}
	}
	return c.sessionCall(ctx, http.MethodPost, id, "/keepalive", body)
}

func (c *Client) sessionCall(ctx context.Context, method, id, rest string, body any) (*api.Session, error) {
	p, err := sessionPath(id, rest)
	if err != nil {
		return nil, err
	}
	var s api.Session
	if _, err := c.call(ctx, method, p, nil, body, &s, http.StatusOK); err != nil {
		return nil, err
	}
	return &s, nil
}

func set(q url.Values, key, v string) {
	if v != "" {
		q.Set(key, v)
	}
}

// HibernateSession saves the session's workspace to the blob store and
// destroys its sandbox; the next call restores it.
func (c *Client) HibernateSession(ctx context.Context, id string) (*api.Session, error) {
	return c.sessionCall(ctx, http.MethodPost, id, "/hibernate", nil)
}

// CreateSnapshot snapshots the session's workspace.
func (c *Client) CreateSnapshot(ctx context.Context, id string) (*api.Snapshot, error) {
	p, err := sessionPath(id, "/snapshots")
	if err != nil {
		return nil, err
	}
	var s api.Snapshot
	if _, err := c.call(ctx, http.MethodPost, p, nil, nil, &s, http.StatusCreated); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListSnapshots lists the session's snapshots, oldest first.
func (c *Client) ListSnapshots(ctx context.Context, id string) ([]api.Snapshot, error) {
	p, err := sessionPath(id, "/snapshots")
	if err != nil {
		return nil, err
	}
	var l api.SnapshotList
	if _, err := c.call(ctx, http.MethodGet, p, nil, nil, &l, http.StatusOK); err != nil {
		return nil, err
	}
	return l.Snapshots, nil
}

// snapshotPath is the path of one of a session's snapshots.
func snapshotPath(id, snapshotID, rest string) (string, error) {
	sid, err := segment("snapshot", snapshotID)
	if err != nil {
		return "", err
	}
	return sessionPath(id, "/snapshots/"+sid+rest)
}

// GetSnapshot describes one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id, snapshotID string) (*api.Snapshot, error) {
	p, err := snapshotPath(id, snapshotID, "")
	if err != nil {
		return nil, err
	}
	var s api.Snapshot
	if _, err := c.call(ctx, http.MethodGet, p, nil, nil, &s, http.StatusOK); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSnapshot deletes one snapshot.
func (c *Client) DeleteSnapshot(ctx context.Context, id, snapshotID string) error {
	p, err := snapshotPath(id, snapshotID, "")
	if err != nil {
		return err
	}
	_, err = c.call(ctx, http.MethodDelete, p, nil, nil, nil, http.StatusNoContent)
	return err
}

// RestoreSnapshot replaces the session's workspace with the snapshot's.
func (c *Client) RestoreSnapshot(ctx context.Context, id, snapshotID string) (*api.Session, error) {
	p, err := snapshotPath(id, snapshotID, "/restore")
	if err != nil {
		return nil, err
	}
	var s api.Session
	if _, err := c.call(ctx, http.MethodPost, p, nil, nil, &s, http.StatusOK); err != nil {
		return nil, err
	}
	return &s, nil
}
