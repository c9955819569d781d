//go:build integration

package kube_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv/kubetest"
	"github.com/sbx-sandbox/sbx/internal/workspace"
	"github.com/sbx-sandbox/sbx/internal/workspace/workspacetest"
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
		SandboxWidePids: true,
		ExecutorCaps:    1 << 5, // KILL
		ZygoteCaps:      1 << 6, // SETGID
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

// TestKubernetesFiles runs the workspace conformance suite against
// workspaces in Pods, through the workspace store the control plane uses
// (Volumes: the executor of the Pod that holds the volume).
func TestKubernetesFiles(t *testing.T) {
	c := kubetest.New(t)
	img := kubetest.Image(t, "python")
	rt := newRuntime(t, c, newSigner(t))
	blobs, err := blobfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	volumes := rt.Volumes(snapshot.New(blobs, "snapshots", snapshot.Limits{}), 1<<30)
	var n atomic.Int64
	workspacetest.Run(t, func(t *testing.T) workspacetest.Subject {
		ctx := context.Background()
		id := fmt.Sprintf("files-%d-%d", os.Getpid(), n.Add(1))
		vol := workspace.SessionVolume("t", id)
		if err := volumes.Create(ctx, vol, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Create(ctx, runtime.Spec{ID: id, Image: img, Volume: vol}); err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Cleanup(func() {
			if err := rt.Destroy(ctx, id); err != nil {
				t.Errorf("destroy %s: %v", id, err)
			}
		})
		ws, err := volumes.Open(ctx, vol)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.Close() })
		client := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
		t.Cleanup(func() { client.Close() })
		in := func(ctx context.Context, cid, script string) (string, error) {
			res, err := client.Run(ctx, wire.RunRequest{Language: wire.LanguageBash, Code: script, ConversationID: cid,
				TimeoutMs: int64(time.Minute / time.Millisecond)}, nil)
			if err != nil {
				return "", err
			}
			out := res.Stdout + res.Stderr
			if res.Status != wire.StatusCompleted {
				return out, fmt.Errorf("%s: %v", res.Status, res.Error)
			}
			return out, nil
		}
		return workspacetest.Subject{
			W:              ws,
			Sandbox:        func(ctx context.Context, script string) (string, error) { return in(ctx, "", script) },
			InConversation: in,
		}
	})
}

// TestKubernetesConversationViews: a real sandbox Pod's conversation views
// (the executor's unprivileged mode, internal/executor/podviews.go): each
// conversation reads its own uploads at uploads/temparea and nothing of
// the others', before and after its Pod is replaced from the checkpoint.
func TestKubernetesConversationViews(t *testing.T) {
	c := kubetest.New(t)
	img := kubetest.Image(t, "python")
	rt := newRuntime(t, c, newSigner(t))
	blobs, err := blobfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	volumes := rt.Volumes(snapshot.New(blobs, "snapshots", snapshot.Limits{}), 1<<30)
	ctx := context.Background()
	vol := workspace.SessionVolume("t", fmt.Sprintf("views-%d", os.Getpid()))
	if err := volumes.Create(ctx, vol, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = volumes.Remove(ctx, vol) })
	start := func(id string) *execclient.Client {
		t.Helper()
		if _, err := rt.Create(ctx, runtime.Spec{ID: id, Image: img, Volume: vol}); err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Cleanup(func() { _ = rt.Destroy(ctx, id) })
		cl := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	// Each conversation's code prints its view and what it can reach of
	// the other's.
	const code = `import os
own = open('/workspace/uploads/temparea/notes.txt').read()
other = 'c2' if own == 'of c1' else 'c1'
reach = []
for p in ('/workspace/uploads/%s/temparea/notes.txt' % other, '/workspace/uploads/temparea/../../%s/temparea/notes.txt' % other):
    try:
        open(p).read()
        reach.append(p)
    except OSError:
        pass
print(own, reach)`
	check := func(cl *execclient.Client, when string) {
		t.Helper()
		for _, conv := range []string{"c1", "c2", ""} {
			res, err := cl.Run(ctx, wire.RunRequest{Language: wire.LanguagePython, Code: code, ConversationID: conv, TimeoutMs: 60_000}, nil)
			if err != nil {
				t.Fatalf("%s: run in %q: %v", when, conv, err)
			}
			want := fmt.Sprintf("of %s []\n", conv)
			if conv == "" {
				// No conversation: no uploads of any.
				if res.Status == wire.StatusCompleted || res.Error == nil || res.Error.Type != "PermissionError" {
					t.Errorf("%s: a run of no conversation: %s %+v %q", when, res.Status, res.Error, res.Stdout)
				}
				continue
			}
			if res.Status != wire.StatusCompleted || res.Stdout != want {
				t.Errorf("%s: conversation %s: %s %+v stdout %q stderr %q", when, conv, res.Status, res.Error, res.Stdout, res.Stderr)
			}
		}
	}
	id1 := fmt.Sprintf("views-%d-a", os.Getpid())
	cl := start(id1)
	ws, err := volumes.OpenIn(ctx, vol, id1)
	if err != nil {
		t.Fatal(err)
	}
	for _, conv := range []string{"c1", "c2"} {
		if _, err := ws.SaveUpload(ctx, conv, "notes.txt", strings.NewReader("of "+conv), 1<<20); err != nil {
			t.Fatalf("upload to %s: %v", conv, err)
		}
	}
	ws.Close()
	check(cl, "first Pod")
	if err := volumes.Checkpoint(ctx, vol, id1); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if err := rt.Destroy(ctx, id1); err != nil {
		t.Fatal(err)
	}
	// A new Pod, from the checkpoint: its executor gives the
	// conversations groups of its own.
	check(start(fmt.Sprintf("views-%d-b", os.Getpid())), "second Pod")
}

// BenchmarkKubernetesStats is one reading of a sandbox Pod's usage, as
// the usage sampler takes it of every sandbox every few seconds: one
// request on a kept-alive connection to its executor.
func BenchmarkKubernetesStats(b *testing.B) {
	c := kubetest.New(b)
	img := kubetest.Image(b, "python")
	rt := newRuntime(b, c, newSigner(b))
	defer rt.Close()
	ctx := context.Background()
	id := fmt.Sprintf("stats-%d", os.Getpid())
	if _, err := rt.Create(ctx, runtime.Spec{ID: id, Image: img, Volume: workspace.SessionVolume("t", id)}); err != nil {
		b.Fatal(err)
	}
	defer rt.Destroy(ctx, id)
	if _, err := rt.Stats(ctx, id); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := rt.Stats(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}
