//go:build integration

package kube_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbx-sandbox/sbx/errdefs"
	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/testenv/kubetest"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// classRuntime is a runtime of the test cluster with cfg's RuntimeClasses
// and user namespaces, and a start timeout long enough that a Create
// which waited it out cannot pass for one the node refused.
func classRuntime(t *testing.T, c *kubetest.Cluster, classes map[string]string, userNS bool) *kube.Runtime {
	t.Helper()
	rt, err := kube.New(kube.Config{Client: c.Client, Namespace: c.Namespace, Signer: newSigner(t), PullPolicy: "Never",
		ImageSuffix: kubetest.Suffix(t), RuntimeClasses: classes, UserNamespaces: userNS, StartTimeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	return rt
}

// TestKubernetesUserNamespaces: with user namespaces asked for, a sandbox
// Pod either runs in one (its root is not the host's: uid_map is no
// identity map) or, on a node that cannot (containerd 1.6 and runc 1.1,
// this test cluster), its Create fails at once with the kubelet's words,
// never after the start timeout.
func TestKubernetesUserNamespaces(t *testing.T) {
	c := kubetest.New(t)
	img := kubetest.Image(t, "python")
	rt := classRuntime(t, c, nil, true)
	ctx := context.Background()
	id := fmt.Sprintf("userns-%d", os.Getpid())
	_, err := rt.Create(ctx, runtime.Spec{ID: id, Image: img, Volume: workspace.SessionVolume("t", id)})
	if err != nil {
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "user namespaces") {
			t.Fatalf("create with user namespaces: %v; want it to run, or ErrFailedPrecondition with the node's words", err)
		}
		t.Logf("the node has no user namespaces: %v", err)
		if _, err := rt.Inspect(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("the refused sandbox's Pod is still there: %v", err)
		}
		return
	}
	defer rt.Destroy(ctx, id)
	res := runIn(t, rt, id, "print(open('/proc/self/uid_map').read().split())")
	if strings.Contains(res, "'0', '0', '4294967295'") {
		t.Errorf("a sandbox Pod with user namespaces has the host's uid map: %s", res)
	}
}

// TestKubernetesRuntimeClassRefused: a template runtime mapped to a
// RuntimeClass the cluster lacks, or to one whose handler the node's
// runtime lacks, fails the Create at once (ErrFailedPrecondition) and
// leaves no Pod behind.
func TestKubernetesRuntimeClassRefused(t *testing.T) {
	c := kubetest.New(t)
	img := kubetest.Image(t, "python")
	ctx := context.Background()
	handlerless := fmt.Sprintf("sbx-test-nohandler-%d", os.Getpid())
	_, err := c.Client.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: handlerless, Labels: map[string]string{"app.kubernetes.io/managed-by": "sbx-tests"}},
		Handler:    "sbxtestnohandler",
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Client.NodeV1().RuntimeClasses().Delete(context.Background(), handlerless, metav1.DeleteOptions{})
	})
	for i, class := range []string{fmt.Sprintf("sbx-test-absent-%d", os.Getpid()), handlerless} {
		rt := classRuntime(t, c, map[string]string{"runsc": class}, false)
		id := fmt.Sprintf("class-%d-%d", os.Getpid(), i)
		_, err := rt.Create(ctx, runtime.Spec{ID: id, Image: img, Runtime: "runsc", Volume: workspace.SessionVolume("t", id)})
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			rt.Destroy(ctx, id)
			t.Errorf("a template of runsc under RuntimeClass %s: %v, want ErrFailedPrecondition", class, err)
			continue
		}
		t.Logf("RuntimeClass %s: %v", class, err)
		if _, err := rt.Inspect(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("the refused sandbox's Pod is still there: %v", err)
		}
	}
}

// runIn runs python code in sandbox id and returns its stdout.
func runIn(t *testing.T, rt *kube.Runtime, id, code string) string {
	t.Helper()
	c := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.Run(ctx, wire.RunRequest{Language: wire.LanguagePython, Code: code, TimeoutMs: 60000}, nil)
	if err != nil || res.Status != wire.StatusCompleted {
		t.Fatalf("run %q: %+v, %v", code, res, err)
	}
	return res.Stdout
}
