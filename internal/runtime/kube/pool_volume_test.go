package kube

import (
	"testing"

	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
)

// TestPoolVolumeCreate: a warm pool's workspace is made without a
// checkpoint (its key would be outside every tenant's namespace, which
// the blob store refuses: every pool start failed so once).
func TestPoolVolumeCreate(t *testing.T) {
	r := newTestRuntime(t)
	blobs, err := blobfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v := r.Volumes(snapshot.New(blobs, "snapshots", snapshot.Limits{}), 0)
	if err := v.Create(t.Context(), ".pool/abc", 0); err != nil {
		t.Fatal(err)
	}
	if err := v.Remove(t.Context(), ".pool/abc"); err != nil {
		t.Fatal(err)
	}
}
