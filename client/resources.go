package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/sbx-sandbox/sbx/api"
)

// ResourceSyncResult is what SyncResources did: the server's answer to
// the last manifest it was sent, and the content this call uploaded.
type ResourceSyncResult struct {
	*api.ResourceSync
	// Uploaded names the resources whose content went over the wire.
	Uploaded []string `json:"uploaded"`
	// Requests counts the HTTP requests the sync took: 1 when nothing
	// changed, 3 or more when content had to be sent.
	Requests int `json:"requests"`
}

// SyncResources makes the session's resources exactly resources,
// names to contents: only content the server does not have is uploaded,
// resources not named are removed, and an unchanged set costs one small
// request. The sandbox sees them read-only under the answer's Path
// (/workspace/.resources).
func (c *Client) SyncResources(ctx context.Context, sessionID string, resources map[string][]byte) (*ResourceSyncResult, error) {
	id, err := segment("session id", sessionID)
	if err != nil {
		return nil, err
	}
	man := api.ResourceManifest{Resources: make([]api.NamedResource, 0, len(resources))}
	sums := make(map[string][]byte, len(resources))
	for name, content := range resources {
		sum := sha256.Sum256(content)
		h := hex.EncodeToString(sum[:])
		sums[h] = content
		man.Resources = append(man.Resources, api.NamedResource{Name: name, SHA256: h, Size: int64(len(content))})
	}
	slices.SortFunc(man.Resources, func(a, b api.NamedResource) int { return strings.Compare(a.Name, b.Name) })
	res := &ResourceSyncResult{}
	path := "/api/v1/sessions/" + id + "/resources"
	// Content can go missing between the answer and the upload (collected,
	// or another sync): a second round settles that.
	for round := 0; round < 3; round++ {
		var out api.ResourceSync
		if _, err := c.call(ctx, http.MethodPut, path, nil, man, &out, http.StatusOK); err != nil {
			return nil, err
		}
		res.Requests++
		if res.ResourceSync == nil {
			res.ResourceSync = &out
		} else {
			// Report the whole sync: what the first answer already did
			// and what the later ones added.
			first := res.ResourceSync
			out.Added = append(first.Added, out.Added...)
			out.Changed = append(first.Changed, out.Changed...)
			out.Removed = append(first.Removed, out.Removed...)
			out.Unchanged = first.Unchanged
			res.ResourceSync = &out
		}
		if out.Complete {
			return res, nil
		}
		sent := map[string]bool{}
		for _, n := range out.Needed {
			if sent[n.SHA256] {
				continue
			}
			sent[n.SHA256] = true
			if err := c.PutContent(ctx, sums[n.SHA256]); err != nil {
				return nil, fmt.Errorf("uploading resource %s: %w", n.Name, err)
			}
			res.Requests++
			res.Uploaded = append(res.Uploaded, n.Name)
		}
	}
	return res, fmt.Errorf("resources of session %s: the server still needs %d after three rounds", sessionID, len(res.Needed))
}

// PutContent uploads resource content; the server stores it under its
// SHA-256 for the tenant, once.
func (c *Client) PutContent(ctx context.Context, content []byte) error {
	sum := sha256.Sum256(content)
	req, err := c.request(ctx, http.MethodPut, "/api/v1/resources/"+hex.EncodeToString(sum[:]), nil, bytes.NewReader(content))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.do(req, http.StatusOK, http.StatusCreated)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// ListResources returns the session's resources in place.
func (c *Client) ListResources(ctx context.Context, sessionID string) (*api.ResourceList, error) {
	id, err := segment("session id", sessionID)
	if err != nil {
		return nil, err
	}
	var out api.ResourceList
	if _, err := c.call(ctx, http.MethodGet, "/api/v1/sessions/"+id+"/resources", nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}
