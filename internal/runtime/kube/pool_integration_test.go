//go:build integration

package kube_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	"github.com/sbx-sandbox/sbx/errdefs"
	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv/kubetest"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// TestKubernetesSharedPool: two runtimes in one process are two replicas
// over one namespace. One (the leader) keeps a pool of 3 ready; 20
// claims race from both. Every claim gets a Pod no other claim got, the
// pool is refilled, a claimed Pod's spec is the one it started with, and
// a claimed Pod's executor answers.
func TestKubernetesSharedPool(t *testing.T) {
	c := kubetest.New(t)
	img := kubetest.Image(t, "python")
	build, err := template.ParseImageRef(img)
	if err != nil {
		t.Fatal(err)
	}
	signer := newSigner(t)
	leader, other := newRuntime(t, c, signer), newRuntime(t, c, signer)
	t.Cleanup(leader.Close)
	t.Cleanup(other.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	const size, claims = 3, 20
	var mu sync.Mutex
	var seq int
	starting := 0
	fill := func() {
		ready, st, err := leader.PoolCounts(ctx, "python", build)
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		missing := size - ready - max(st, starting)
		starting += max(missing, 0)
		mu.Unlock()
		for range missing {
			mu.Lock()
			seq++
			id := fmt.Sprintf("pool-%d", seq)
			mu.Unlock()
			go func() {
				defer func() { mu.Lock(); starting--; mu.Unlock() }()
				err := leader.StartPooled(ctx, "python", build, runtime.Spec{ID: id, Image: img, Volume: workspace.PoolVolume(id), Labels: map[string]string{"sbx.pool": "python"}})
				if err != nil && ctx.Err() == nil {
					t.Errorf("start %s: %v", id, err)
				}
			}()
		}
	}
	// The leader fills, as sandbox.Service's filler does.
	fillCtx, stopFill := context.WithCancel(ctx)
	fillDone := make(chan struct{})
	go func() {
		defer close(fillDone)
		for fillCtx.Err() == nil {
			fill()
			select {
			case <-fillCtx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	defer func() { stopFill(); <-fillDone }()

	specs := map[string]string{} // pod name -> its spec when it became ready
	waitReady := func(rt *kube.Runtime, n int) {
		for {
			ready, _, err := rt.PoolCounts(ctx, "python", build)
			if err != nil {
				t.Fatal(err)
			}
			if ready >= n {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("the pool never had %d ready", n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitReady(other, size)

	var cmu sync.Mutex
	got := map[string]string{} // sandbox id -> the volume that claimed it
	var wg sync.WaitGroup
	for i := range claims {
		rt := leader
		if i%2 == 1 {
			rt = other
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			vol := workspace.SessionVolume("t", fmt.Sprintf("s%d", i))
			for ctx.Err() == nil {
				id, gotBuild, err := rt.ClaimPooled(ctx, "python", build, vol, map[string]string{"sbx.session": fmt.Sprint(i)})
				if errors.Is(err, errdefs.ErrNotFound) {
					time.Sleep(50 * time.Millisecond) // empty: wait for the refill
					continue
				}
				if err != nil {
					t.Errorf("claim %d: %v", i, err)
					return
				}
				if gotBuild != build {
					t.Errorf("claim %d: build %s, want %s", i, gotBuild, build)
				}
				cmu.Lock()
				if prev, dup := got[id]; dup {
					t.Errorf("sandbox %s claimed twice: by %s and %s", id, prev, vol)
				}
				got[id] = vol
				cmu.Unlock()
				return
			}
		}()
	}
	wg.Wait()
	if len(got) != claims {
		t.Fatalf("%d distinct claims, want %d", len(got), claims)
	}
	// Refilled by the leader after all that.
	waitReady(other, size)

	pods := c.Client.CoreV1().Pods(c.Namespace)
	ids := make([]string, 0, len(got))
	for id := range got {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		pod, err := pods.Get(ctx, kube.PodName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s := pod.Labels["sbx.dev/pool-state"]; s != "claimed" {
			t.Errorf("%s: state %q, want claimed", pod.Name, s)
		}
		if v := pod.Annotations["sbx.dev/volume"]; v != got[id] {
			t.Errorf("%s: holds %q, want %q", pod.Name, v, got[id])
		}
		// The spec is what the Pod was made with: the generation counts
		// every change of it.
		if pod.Generation != 1 {
			t.Errorf("%s: generation %d: its spec changed", pod.Name, pod.Generation)
		}
		specs[id] = pod.Spec.Containers[0].Image
	}
	// Each claimed sandbox's executor answers, through either replica.
	for i, id := range ids[:4] {
		rt := leader
		if i%2 == 1 {
			rt = other
		}
		cl := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
		res, err := cl.Run(ctx, wire.RunRequest{Language: wire.LanguagePython, Code: "print(6*7)", TimeoutMs: 60000}, nil)
		cl.Close()
		if err != nil || strings.TrimSpace(res.Stdout) != "42" {
			t.Errorf("%s: run: %v %+v", id, err, res)
		}
		info, err := rt.Inspect(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if info.Volume != got[id] || info.Labels["sbx.pool"] != "python" || info.Labels["sbx.session"] == "" {
			t.Errorf("%s: inspect: %+v", id, info)
		}
	}
	for _, id := range ids {
		pod, err := pods.Get(ctx, kube.PodName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Generation != 1 || !reflect.DeepEqual(pod.Spec.Containers[0].Image, specs[id]) {
			t.Errorf("%s: spec changed after use", pod.Name)
		}
	}

	// A build no longer wanted is collected; claimed Pods are not.
	stopFill()
	<-fillDone
	waitNoneStarting(t, ctx, leader, build)
	n, err := leader.CollectPools(ctx, map[string]string{"python": strings.Repeat("0", 64)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if n < size {
		t.Errorf("collected %d, want at least %d ready pods of an unwanted build", n, size)
	}
	for _, id := range ids {
		if _, err := leader.Inspect(ctx, id); err != nil {
			t.Errorf("claimed %s: %v", id, err)
		}
	}
	for _, id := range ids {
		if err := leader.Destroy(ctx, id); err != nil {
			t.Error(err)
		}
	}
}

func waitNoneStarting(t *testing.T, ctx context.Context, rt *kube.Runtime, build string) {
	t.Helper()
	for {
		_, st, err := rt.PoolCounts(ctx, "python", build)
		if err != nil {
			t.Fatal(err)
		}
		if st == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("pool pods still starting")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// BenchmarkKubernetesPoolClaim measures a pooled claim until its first
// result (claim, then a Python print through the claimed Pod's executor),
// with the pool filled beforehand, one claim at a time and 20 at once.
// It reports the p50 and p90; it asserts nothing about them.
//
//	go test -tags integration -run '^$' -bench KubernetesPoolClaim -benchtime 1x ./internal/runtime/kube/
func BenchmarkKubernetesPoolClaim(b *testing.B) {
	c := kubetest.New(b)
	img := kubetest.Image(b, "python")
	build, err := template.ParseImageRef(img)
	if err != nil {
		b.Fatal(err)
	}
	rt := newRuntime(b, c, newSigner(b))
	b.Cleanup(rt.Close)
	ctx := context.Background()
	seq := 0
	for _, par := range []int{1, 20} {
		b.Run(fmt.Sprintf("parallel-%d", par), func(b *testing.B) {
			rounds := 2
			if par == 1 {
				rounds = 10
			}
			var took []time.Duration
			for range b.N * rounds {
				var wg sync.WaitGroup
				for range par { // fill: par ready Pods
					seq++
					id := fmt.Sprintf("bench-%d", seq)
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := rt.StartPooled(ctx, "python", build, runtime.Spec{ID: id, Image: img, Volume: workspace.PoolVolume(id)}); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
				for {
					ready, _, err := rt.PoolCounts(ctx, "python", build)
					if err != nil {
						b.Fatal(err)
					}
					if ready >= par {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				var mu sync.Mutex
				var ids []string
				for i := range par {
					wg.Add(1)
					go func() {
						defer wg.Done()
						start := time.Now()
						id, _, err := rt.ClaimPooled(ctx, "python", build, workspace.SessionVolume("bench", fmt.Sprintf("s%d-%d", seq, i)), nil)
						if err != nil {
							b.Error(err)
							return
						}
						cl := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
						res, err := cl.Run(ctx, wire.RunRequest{Language: wire.LanguagePython, Code: "print(1)", TimeoutMs: 60000}, nil)
						d := time.Since(start)
						cl.Close()
						if err != nil || strings.TrimSpace(res.Stdout) != "1" {
							b.Errorf("run: %v %+v", err, res)
						}
						mu.Lock()
						took = append(took, d)
						ids = append(ids, id)
						mu.Unlock()
					}()
				}
				wg.Wait()
				for _, id := range ids {
					rt.Destroy(ctx, id)
				}
			}
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			if len(took) > 0 {
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(took[len(took)*9/10].Microseconds())/1000, "p90-ms")
				b.Logf("claim -> first result, %d claims: %v", len(took), took)
			}
		})
	}
}

// TestKubernetesPoolClaimKeepsCheckpoint: a session with a saved
// workspace (its checkpoint) claims a pooled Pod: its files are imported
// into the Pod through the executor, and the checkpoint stays (it was
// deleted before).
func TestKubernetesPoolClaimKeepsCheckpoint(t *testing.T) {
	c := kubetest.New(t)
	img := kubetest.Image(t, "python")
	build, err := template.ParseImageRef(img)
	if err != nil {
		t.Fatal(err)
	}
	rt := newRuntime(t, c, newSigner(t))
	t.Cleanup(rt.Close)
	blobs, err := blobfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	vols := rt.Volumes(snapshot.New(blobs, "snapshots", snapshot.Limits{}), 1<<30)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	vol := workspace.SessionVolume("t", "saved")

	// The session's workspace, saved, then its Pod gone.
	if _, err := rt.Create(ctx, runtime.Spec{ID: "first", Image: img, Volume: vol}); err != nil {
		t.Fatal(err)
	}
	ws, err := vols.Open(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Save(ctx, "notes.txt", strings.NewReader("kept"), 1<<20); err != nil {
		t.Fatal(err)
	}
	ws.Close()
	if err := vols.Checkpoint(ctx, vol, "first"); err != nil {
		t.Fatal(err)
	}
	if err := rt.Destroy(ctx, "first"); err != nil {
		t.Fatal(err)
	}

	if err := rt.StartPooled(ctx, "python", build, runtime.Spec{ID: "pooled", Image: img, Volume: workspace.PoolVolume("pooled")}); err != nil {
		t.Fatal(err)
	}
	var id string
	for {
		id, _, err = rt.ClaimPooled(ctx, "python", build, vol, nil)
		if !errors.Is(err, errdefs.ErrNotFound) || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // the watch has not seen it ready yet
	}
	if err != nil || id != "pooled" {
		t.Fatalf("claim: %q %v", id, err)
	}
	defer rt.Destroy(ctx, id)
	if err := vols.Claim(ctx, workspace.PoolVolume(id), vol); err != nil {
		t.Fatalf("volumes claim: %v", err)
	}
	ws, err = vols.Open(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	f, err := ws.Open(ctx, "notes.txt")
	if err != nil {
		t.Fatalf("the saved file in the claimed Pod: %v", err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "kept" {
		t.Fatalf("notes.txt: %q", b)
	}
	// The checkpoint is still the session's: with the Pod gone, the
	// workspace still exists.
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ok, err := vols.Exists(ctx, vol); err != nil || !ok {
		t.Fatalf("the session's checkpoint after the claim: exists %v, %v", ok, err)
	}
}
