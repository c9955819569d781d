//go:build integration

package kube_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv/kubetest"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

func newRuntime(t testing.TB, c *kubetest.Cluster, signer *token.Signer) *kube.Runtime {
	t.Helper()
	rt, err := kube.New(kube.Config{Client: c.Client, Namespace: c.Namespace, Signer: signer, PullPolicy: "Never", ImageSuffix: kubetest.Suffix(t)})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func newSigner(t testing.TB) *token.Signer {
	t.Helper()
	_, key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := token.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestKubernetes runs the runtime contract against real Pods of the test
// cluster.
func TestKubernetes(t *testing.T) {
	c := kubetest.New(t)
	img := kubetest.Image(t, "python")
	signer := newSigner(t)
	rt := newRuntime(t, c, signer)
	blobs, err := blobfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	volumes := rt.Volumes(snapshot.New(blobs, "snapshots", snapshot.Limits{}), 0)
	var vols atomic.Int64
	runtimetest.Run(t, runtimetest.Harness{
		Runtime:    rt,
		Checkpoint: volumes.Checkpoint,
		// A Pod has eth0 (egress closed by the NetworkPolicy), shares one
		// PID namespace among its executions and holds Pod Security's
		// baseline capabilities (docs/SECURITY.md, "In a Pod").
		PodNetwork:      true,
		SharedProcesses: true,
		ExecutorCaps:    1 << 5, // KILL
		Reopen:          func(t *testing.T) runtime.Runtime { return newRuntime(t, c, signer) },
		Image:           img,
		NewVolume: func(t testing.TB) string {
			return workspace.SessionVolume("rtt", fmt.Sprintf("v%d-%d", os.Getpid(), vols.Add(1)))
		},
		MissingImage: template.ImageRef("python", strings.Repeat("0", 64)),
		ExecRoot: func(ctx context.Context, id string, argv ...string) ([]byte, error) {
			return c.Exec(ctx, kube.PodName(id), argv...)
		},
	})
}
