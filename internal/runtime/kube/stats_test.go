package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sbx-sandbox/sbx/errdefs"
	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// statsExecutor is a sandbox's executor as Stats meets it: a token
// listener on loopback (the Pod's IP here) serving handler, counting the
// connections that got through.
type statsExecutor struct {
	rt      *Runtime
	client  *fake.Clientset
	conns   atomic.Int64
	handler atomic.Value // http.HandlerFunc
}

// newStatsExecutor makes a runtime whose sandbox id's Pod runs at
// 127.0.0.1 with res, and its executor serving h.
func newStatsExecutor(t *testing.T, id string, res runtime.Resources, h http.HandlerFunc) *statsExecutor {
	t.Helper()
	_, key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	v, err := token.NewVerifier(signer.PublicKey(), id)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := token.NewListener(inner, v, token.ListenerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	x := &statsExecutor{client: fake.NewClientset()}
	x.handler.Store(h)
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { x.handler.Load().(http.HandlerFunc)(w, r) }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				x.conns.Add(1)
			}
		},
	}
	done := make(chan struct{})
	go func() { defer close(done); hs.Serve(l) }()
	port := inner.Addr().(*net.TCPAddr).Port
	x.rt, err = New(Config{Client: x.client, Namespace: testNS, Signer: signer, Port: port,
		StatsTimeout: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		x.rt.Close()
		hs.Close()
		<-done
	})
	spec := runtime.Spec{ID: id, Image: "sbx/python:" + buildA, Volume: workspace.SessionVolume("t", id), Resources: res}
	pod, err := x.rt.podSpec(spec, spec.Image, res.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
		ContainerStatuses: []corev1.ContainerStatus{{Name: containerName, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
	if _, err := x.client.CoreV1().Pods(testNS).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return x
}

// gets counts the Pod reads the runtime asked of the API server.
func (x *statsExecutor) gets() int {
	n := 0
	for _, a := range x.client.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

func statsJSON(format string, args ...any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stats" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, format, args...)
	}
}

// TestStats: a Pod's figures are its executor's, with the limits of its
// Pod; the sampler's every-few-seconds reads cost one request on one
// kept-alive connection, and the API server is asked once.
func TestStats(t *testing.T) {
	res := runtime.Resources{CPU: 0.5, MemoryMB: 256, PIDs: 64}
	x := newStatsExecutor(t, "s1", res, statsJSON(`{"cgroup_version":1,"memory_usage_bytes":%d,"memory_peak_bytes":%d,"memory_cache_bytes":%d,"cpu_usage_ns":%d,"pids_current":7,"oom_kill_count":2}`,
		50<<20, 60<<20, 10<<20, 123456789))
	if !runtime.CapabilitiesOf(x.rt).Stats {
		t.Fatal("the kubernetes runtime does not declare Stats")
	}
	want := runtime.Stats{MemoryBytes: 50 << 20, MemoryPeakBytes: 60 << 20, MemoryCacheBytes: 10 << 20, CPUNanos: 123456789,
		PIDs: 7, OOMKills: 2, Limits: res.WithDefaults()}
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		st, err := x.rt.Stats(ctx, "s1")
		if err != nil || *st != want {
			t.Fatalf("stats %d: %+v, %v\nwant %+v", i, st, err, want)
		}
	}
	if n := x.conns.Load(); n != 1 {
		t.Errorf("20 readings took %d connections, want 1 kept alive", n)
	}
	if n := x.gets(); n != 1 {
		t.Errorf("20 readings asked the API server for the Pod %d times, want 1", n)
	}
	for _, id := range []string{"nope", "../s1", strings.Repeat("a", 65), ""} {
		if _, err := x.rt.Stats(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("stats of %q: %v, want ErrNotFound", id, err)
		}
	}
}

// TestStatsHostileExecutor: the figures come from an executor in a Pod
// whose code may have taken it over or starved it. Whatever it does, a
// reading ends within the runtime's StatsTimeout (with ErrUnavailable), the
// control plane reads no more of it than the client's bound, and no
// figure it sends overflows the usage arithmetic or goes back.
func TestStatsHostileExecutor(t *testing.T) {
	ctx := context.Background()
	release := make(chan struct{})
	defer close(release)
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
	}{
		{"never answers", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}},
		{"answers headers, then nothing", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"memory_usage_bytes":`))
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}},
		{"trickles", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"x":"`))
			for {
				if _, err := w.Write([]byte("x")); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-release:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}},
		{"endless", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"x":"`))
			chunk := []byte(strings.Repeat("x", 64<<10))
			for sent := 0; sent < 1<<30; sent += len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}},
		{"not JSON", statsJSON("<html>")},
		{"an error", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusInternalServerError) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newStatsExecutor(t, "s1", runtime.Resources{}, tc.h)
			done := make(chan error, 1)
			go func() {
				_, err := x.rt.Stats(ctx, "s1")
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, errdefs.ErrUnavailable) {
					t.Errorf("stats: %v, want ErrUnavailable", err)
				}
				if tc.name == "endless" && !errors.Is(err, execclient.ErrBadResponse) {
					t.Errorf("stats: %v, want the client's bound (ErrBadResponse)", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("a hostile executor held Stats for a minute (its StatsTimeout is 200ms)")
			}
		})
	}

	t.Run("absurd figures", func(t *testing.T) {
		x := newStatsExecutor(t, "s1", runtime.Resources{}, statsJSON(`{"memory_usage_bytes":%d,"memory_peak_bytes":%d,"memory_cache_bytes":%d,"cpu_usage_ns":%d,"pids_current":%d,"oom_kill_count":%d}`,
			uint64(math.MaxUint64), uint64(5), uint64(math.MaxUint64), uint64(math.MaxUint64), uint64(math.MaxUint64), uint64(math.MaxUint64)))
		st, err := x.rt.Stats(ctx, "s1")
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]uint64{"memory": st.MemoryBytes, "peak": st.MemoryPeakBytes, "cache": st.MemoryCacheBytes,
			"cpu": st.CPUNanos, "pids": st.PIDs, "oom kills": st.OOMKills} {
			if v > math.MaxInt64 {
				t.Errorf("%s: %d does not fit the usage figures' int64", name, v)
			}
		}
		if st.MemoryCacheBytes > st.MemoryBytes || st.MemoryPeakBytes < st.MemoryBytes {
			t.Errorf("cache %d and peak %d against memory %d", st.MemoryCacheBytes, st.MemoryPeakBytes, st.MemoryBytes)
		}
	})

	t.Run("figures going back", func(t *testing.T) {
		x := newStatsExecutor(t, "s1", runtime.Resources{}, statsJSON(`{"cpu_usage_ns":1000,"oom_kill_count":3}`))
		if _, err := x.rt.Stats(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		x.handler.Store(statsJSON(`{"cpu_usage_ns":10,"oom_kill_count":0}`))
		if st, err := x.rt.Stats(ctx, "s1"); err != nil || st.CPUNanos != 1000 || st.OOMKills != 3 {
			t.Errorf("after a reading of 1000 ns and 3 OOM kills, one of less: %+v, %v", st, err)
		}
	})
}

// TestStatsOfStoppedAndGone: a stopped sandbox runs no process and says
// so (no memory, no processes) with its limits and what only grows (CPU
// time, OOM kills, its executor's own OOM kill counted); a sandbox whose
// Pod is gone is ErrNotFound, and Stats forgets it.
func TestStatsOfStoppedAndGone(t *testing.T) {
	ctx := context.Background()
	res := runtime.Resources{MemoryMB: 128}
	x := newStatsExecutor(t, "s1", res, statsJSON(`{"memory_usage_bytes":1000,"cpu_usage_ns":5000,"pids_current":4}`))
	if _, err := x.rt.Stats(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	// The executor ends (the OOM killer took it), its Pod stays: the
	// kept-alive connection fails and the API server tells.
	x.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hj, _ := w.(http.Hijacker)
		c, _, _ := hj.Hijack()
		c.Close()
	}))
	pods := x.client.CoreV1().Pods(testNS)
	pod, err := pods.Get(ctx, podName("s1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}
	if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := runtime.Stats{CPUNanos: 5000, OOMKills: 1, Limits: res.WithDefaults()}
	for i := 0; i < 2; i++ {
		if st, err := x.rt.Stats(ctx, "s1"); err != nil || *st != want {
			t.Errorf("stats of a stopped sandbox (%d): %+v, %v\nwant %+v", i, st, err, want)
		}
	}
	// Stopped by the runtime, and gone.
	if err := x.rt.Stop(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if st, err := x.rt.Stats(ctx, "s1"); err != nil || *st != want {
		t.Errorf("stats of a sandbox stopped by Stop: %+v, %v\nwant %+v", st, err, want)
	}
	if err := pods.Delete(ctx, podName("s1"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := x.rt.Stats(ctx, "s1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("stats of a sandbox whose Pod is gone: %v, want ErrNotFound", err)
	}
	x.rt.mu.Lock()
	left := len(x.rt.stats)
	x.rt.mu.Unlock()
	if left != 0 {
		t.Errorf("Stats keeps %d entries of sandboxes that are gone", left)
	}
}

// TestStatsConcurrent: the sampler and requests read one sandbox at once
// (go test -race).
func TestStatsConcurrent(t *testing.T) {
	var n atomic.Int64
	x := newStatsExecutor(t, "s1", runtime.Resources{}, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"cpu_usage_ns":`+strconv.FormatInt(n.Add(1), 10)+`}`)
	})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				if _, err := x.rt.Stats(context.Background(), "s1"); err != nil {
					t.Error(err)
					return
				}
				if j == 10 {
					x.rt.forget("s1")
				}
			}
		}()
	}
	wg.Wait()
}
