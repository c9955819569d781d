package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// Replicas that share a store need not share a data directory (each Pod
// of a Deployment has its own), yet they must agree on the deployment's
// instance id (the label of every sandbox it makes, by which a replica
// tells its deployment's sandboxes from others') and on the key that
// signs presigned URLs and E2B tokens (one replica's must check at
// another). Both live in the store then, as documents of kind
// deploymentKind: the first replica's own, from its data directory, so
// that a deployment that used to share one data directory keeps its
// names and its URLs.
const (
	deploymentKind   = "sbx.deployment"
	deploymentTenant = "_sbx" // no tenant's: tenants are [a-zA-Z0-9_-] names of API keys, never starting with _
)

// shared returns the deployment's value of key in st, making it mine if
// it has none yet. Two replicas starting at once agree: one create wins.
func shared(ctx context.Context, st store.Store, key string, mine []byte) ([]byte, error) {
	for range 3 {
		d, err := st.GetDocument(ctx, deploymentKind, deploymentTenant, key)
		if err == nil {
			var v []byte
			if err := json.Unmarshal(d.Value, &v); err != nil || len(v) == 0 {
				return nil, fmt.Errorf("store: the deployment's %s does not parse: %v", key, err)
			}
			return v, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("store: the deployment's %s: %w", key, err)
		}
		value, _ := json.Marshal(mine) // base64
		err = st.PutDocument(ctx, &store.Document{Kind: deploymentKind, Tenant: deploymentTenant, Key: key, Value: value})
		if err == nil {
			return mine, nil
		}
		if !errors.Is(err, errdefs.ErrAlreadyExists) {
			return nil, fmt.Errorf("store: the deployment's %s: %w", key, err)
		}
	}
	return nil, fmt.Errorf("store: the deployment's %s was made and gone again three times", key)
}
