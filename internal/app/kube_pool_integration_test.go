//go:build integration

package app_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/testenv"
	"github.com/sbx-sandbox/sbx/internal/testenv/kubetest"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// TestKubernetesPoolServesFirstExecution: sbx on the Kubernetes runtime
// with a warm pool of one: a new session's first execution runs in the
// pool's Pod, claimed (state claimed, holding the session's volume), not
// in a Pod started for it.
func TestKubernetesPoolServesFirstExecution(t *testing.T) {
	c := kubetest.New(t)
	kubetest.Image(t, "python")
	env := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, err := app.Open(ctx, app.Config{
		DataDir: t.TempDir(), StateDir: t.TempDir(), TemplateDir: testenv.TemplateDir(), ExecutorPath: env.Executor,
		Kubernetes: &app.Kubernetes{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace},
		Pools:      map[string]int{"python": 1},
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Serve(sctx, ln) }()
	defer func() { stop(); <-done; a.Close() }()
	cl := client.New("http://" + ln.Addr().String())

	pods := c.Client.CoreV1().Pods(c.Namespace)
	var pooled string
	for pooled == "" {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "sbx.dev/pool-state=ready"})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) > 0 {
			pooled = list.Items[0].Name
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the pool never had a ready Pod")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for a.Sessions.PoolSizes()["python"] < 1 { // this replica's watch has it too
		if ctx.Err() != nil {
			t.Fatal("the pool's ready Pod never showed in the watch")
		}
		time.Sleep(20 * time.Millisecond)
	}

	if _, _, err := cl.CreateSession(ctx, api.CreateSessionRequest{SessionID: "pooled", TemplateID: "python"}); err != nil {
		t.Fatal(err)
	}
	res, err := cl.Execute(ctx, "pooled", api.ExecuteRequest{Code: "print(6*7)"})
	if err != nil || res.Status != api.ExecCompleted || res.Stdout != "42\n" {
		t.Fatalf("execute: %+v %v", res, err)
	}
	pod, err := pods.Get(ctx, pooled, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pooled Pod: %v", err)
	}
	vol := pod.Annotations["sbx.dev/claimed-by"]
	if pod.Labels["sbx.dev/pool-state"] != "claimed" || vol == "" || vol != pod.Annotations["sbx.dev/volume"] {
		t.Fatalf("the pool's Pod was not claimed for the session: labels %v annotations %v", pod.Labels, pod.Annotations)
	}
	if err := workspace.CheckVolume(vol); err != nil {
		t.Fatal(err)
	}
	if pod.Generation != 1 {
		t.Errorf("the claim changed the Pod's spec (generation %d)", pod.Generation)
	}
	if _, err := cl.DeleteSession(ctx, "pooled"); err != nil {
		t.Fatal(err)
	}
}
