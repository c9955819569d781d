package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

const testNS = "pools"

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// casClientset is client-go's fake clientset made to do what the API
// server does and the fake does not: every write of a Pod gives it a new
// resourceVersion, and a patch or delete naming a resourceVersion that is
// not the Pod's current one is a 409 Conflict.
func casClientset(t *testing.T) (*fake.Clientset, *casStats) {
	c := fake.NewClientset()
	st := &casStats{}
	var mu sync.Mutex
	var rv int64 = 100
	tr := c.Tracker()
	c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
		rv++
		pod.ResourceVersion = strconv.FormatInt(rv, 10)
		pod.Generation = 1
		pod.CreationTimestamp = metav1.Now()
		return true, pod, tr.Create(podsGVR, pod, pod.Namespace)
	})
	c.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		pa := a.(k8stesting.PatchAction)
		obj, err := tr.Get(podsGVR, pa.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		cur := obj.(*corev1.Pod)
		var pre struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &pre); err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		if pre.Metadata.ResourceVersion != "" && pre.Metadata.ResourceVersion != cur.ResourceVersion {
			st.conflicts.Add(1)
			return true, nil, apierrors.NewConflict(podsGVR.GroupResource(), cur.Name, errors.New("the object has been modified"))
		}
		old, _ := json.Marshal(cur)
		patched, err := strategicpatch.StrategicMergePatch(old, pa.GetPatch(), corev1.Pod{})
		if err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		var next corev1.Pod
		if err := json.Unmarshal(patched, &next); err != nil {
			return true, nil, err
		}
		if !equalSpec(cur, &next) {
			next.Generation++
		}
		rv++
		next.ResourceVersion = strconv.FormatInt(rv, 10)
		if err := tr.Update(podsGVR, &next, next.Namespace); err != nil {
			return true, nil, err
		}
		if strings.Contains(string(pa.GetPatch()), `"claimed"`) {
			st.claims.Add(1)
		}
		return true, &next, nil
	})
	c.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		da := a.(k8stesting.DeleteAction)
		obj, err := tr.Get(podsGVR, da.GetNamespace(), da.GetName())
		if err != nil {
			return true, nil, err
		}
		if p := da.GetDeleteOptions().Preconditions; p != nil && p.ResourceVersion != nil && *p.ResourceVersion != obj.(*corev1.Pod).ResourceVersion {
			return true, nil, apierrors.NewConflict(podsGVR.GroupResource(), da.GetName(), errors.New("precondition failed"))
		}
		return true, nil, tr.Delete(podsGVR, da.GetNamespace(), da.GetName())
	})
	return c, st
}

type casStats struct{ conflicts, claims atomicInt }

type atomicInt struct {
	mu sync.Mutex
	n  int
}

func (a *atomicInt) Add(d int) { a.mu.Lock(); a.n += d; a.mu.Unlock() }
func (a *atomicInt) Load() int { a.mu.Lock(); defer a.mu.Unlock(); return a.n }

func equalSpec(a, b *corev1.Pod) bool {
	x, _ := json.Marshal(a.Spec)
	y, _ := json.Marshal(b.Spec)
	return string(x) == string(y)
}

func testRuntime(t *testing.T, c *fake.Clientset) *Runtime {
	t.Helper()
	_, key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := New(Config{Client: c, Namespace: testNS, Signer: signer, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	return rt
}

var (
	buildA = strings.Repeat("a", 64)
	buildB = strings.Repeat("b", 64)
)

// addPoolPod makes a pool Pod as StartPooled would, in state.
func addPoolPod(t *testing.T, rt *Runtime, id, build, state string) {
	t.Helper()
	spec := runtime.Spec{ID: id, Image: "sbx/python:" + build, Volume: workspace.PoolVolume(id), Labels: map[string]string{"sbx.pool": "python", "sbx.replica": "filler"}}
	pod, err := rt.podSpec(spec, spec.Image, spec.Resources.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	(&poolMeta{name: "python", build: build}).apply(pod)
	pod.Labels[labelPoolState] = state
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1"}
	if _, err := rt.pods().Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitCounts waits until rt's watch shows ready and starting.
func waitCounts(t *testing.T, rt *Runtime, build string, ready, starting int) {
	t.Helper()
	for i := 0; ; i++ {
		r, s, err := rt.PoolCounts(context.Background(), "python", build)
		if err != nil {
			t.Fatal(err)
		}
		if r == ready && s == starting {
			return
		}
		if i > 2000 {
			t.Fatalf("watch shows %d ready, %d starting; want %d, %d", r, s, ready, starting)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClaimPooledUnique: 40 claims race from two replicas for 3 ready
// Pods; exactly 3 win, each a different Pod, each claim one write that
// makes the Pod the session volume's holder and records the session;
// the others find the pool empty. Pods starting or of another build are
// never claimed.
func TestClaimPooledUnique(t *testing.T) {
	c, st := casClientset(t)
	a, b := testRuntime(t, c), testRuntime(t, c)
	for i := range 3 {
		addPoolPod(t, a, fmt.Sprintf("ready-%d", i), buildA, poolReady)
	}
	addPoolPod(t, a, "starting-0", buildA, poolStarting)
	addPoolPod(t, a, "other-build", buildB, poolReady)
	waitCounts(t, a, buildA, 3, 1)
	waitCounts(t, b, buildA, 3, 1)

	var mu sync.Mutex
	won := map[string]string{}
	var wg sync.WaitGroup
	for i := range 40 {
		rt := a
		if i%2 == 1 {
			rt = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			vol := workspace.SessionVolume("t", fmt.Sprintf("s%d", i))
			id, build, err := rt.ClaimPooled(context.Background(), "python", buildA, vol, map[string]string{"sbx.session": fmt.Sprint(i), "sbx.replica": "claimer"})
			if errors.Is(err, errdefs.ErrNotFound) {
				return
			}
			if err != nil {
				t.Errorf("claim %d: %v", i, err)
				return
			}
			if build != buildA {
				t.Errorf("claim %d: build %s", i, build)
			}
			mu.Lock()
			defer mu.Unlock()
			if prev, dup := won[id]; dup {
				t.Errorf("%s claimed by %s and %s", id, prev, vol)
			}
			won[id] = vol
		}()
	}
	wg.Wait()
	if len(won) != 3 {
		t.Fatalf("claims won: %v, want the 3 ready Pods", won)
	}
	if n := st.claims.Load(); n != 3 {
		t.Errorf("%d claim writes succeeded, want 3 (one per claim)", n)
	}
	for id, vol := range won {
		if !strings.HasPrefix(id, "ready-") {
			t.Errorf("claimed %s, not a ready Pod of the build", id)
		}
		pod, err := c.CoreV1().Pods(testNS).Get(context.Background(), podName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Labels[labelPoolState] != poolClaimed || pod.Labels[labelVolume] != volumeLabel(vol) || pod.Annotations[annotationVolume] != vol || pod.Annotations[annotationClaimedBy] != vol {
			t.Errorf("%s after its claim: labels %v annotations %v", id, pod.Labels, pod.Annotations)
		}
		if pod.Generation != 1 {
			t.Errorf("%s: the claim changed its spec", id)
		}
		info, ok := a.info(pod)
		if !ok || info.ID != id || info.Labels["sbx.pool"] != "python" || info.Labels["sbx.session"] == "" || info.Labels["sbx.replica"] != "claimer" {
			t.Errorf("%s: info %+v", id, info)
		}
	}
}

// TestClaimPooledStaleWatch: a replica whose watch is behind tries a Pod
// another replica claimed; its patch, conditional on the version it saw,
// is refused, and it takes the next Pod. A Pod whose version moved for
// another reason (still ready) is claimed on a fresh read.
func TestClaimPooledStaleWatch(t *testing.T) {
	c, st := casClientset(t)
	a := testRuntime(t, c)
	addPoolPod(t, a, "p1", buildA, poolReady)
	addPoolPod(t, a, "p2", buildA, poolReady)
	waitCounts(t, a, buildA, 2, 0)
	stale, _ := c.CoreV1().Pods(testNS).Get(context.Background(), podName("p1"), metav1.GetOptions{})

	// Another replica claims p1 behind a's back.
	b := testRuntime(t, c)
	if _, err := b.claim(context.Background(), stale, workspace.SessionVolume("t", "other"), nil); err != nil {
		t.Fatal(err)
	}
	// a tries p1 at the version it saw: lost.
	if _, err := a.claim(context.Background(), stale, workspace.SessionVolume("t", "mine"), nil); !errors.Is(err, errLost) {
		t.Fatalf("claim of a Pod another replica claimed: %v, want errLost", err)
	}
	if st.conflicts.Load() == 0 {
		t.Fatal("no conflict: the claim was not conditional")
	}
	pod, _ := c.CoreV1().Pods(testNS).Get(context.Background(), podName("p1"), metav1.GetOptions{})
	if pod.Annotations[annotationVolume] != workspace.SessionVolume("t", "other") {
		t.Fatalf("p1 holds %s: the loser overwrote the winner", pod.Annotations[annotationVolume])
	}

	// p2 changes (an annotation) but stays ready: a's stale claim wins.
	p2, _ := c.CoreV1().Pods(testNS).Get(context.Background(), podName("p2"), metav1.GetOptions{})
	if _, err := c.CoreV1().Pods(testNS).Patch(context.Background(), podName("p2"), "application/merge-patch+json", []byte(`{"metadata":{"annotations":{"x":"y"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	id, err := a.claim(context.Background(), p2, workspace.SessionVolume("t", "mine"), nil)
	if err != nil || id != "p2" {
		t.Fatalf("claim of a ready Pod at an old version: %q %v", id, err)
	}
}

// TestCollectPools: the leader's collection deletes ready Pods of a
// build or pool not wanted, Pods stuck starting and stopped ones, and
// never a claimed Pod or a ready one of the wanted build.
func TestCollectPools(t *testing.T) {
	c, _ := casClientset(t)
	rt := testRuntime(t, c)
	addPoolPod(t, rt, "keep-ready", buildA, poolReady)
	addPoolPod(t, rt, "keep-claimed", buildB, poolClaimed)
	addPoolPod(t, rt, "keep-starting", buildA, poolStarting)
	addPoolPod(t, rt, "old-build", buildB, poolReady)
	waitCounts(t, rt, buildA, 1, 1)
	waitCounts(t, rt, buildB, 1, 0)

	n, err := rt.CollectPools(context.Background(), map[string]string{"python": buildA}, time.Hour)
	if err != nil || n != 1 {
		t.Fatalf("collect: %d %v, want the old build's one", n, err)
	}
	// Starting for longer than stuck: collected.
	if n, err = rt.CollectPools(context.Background(), map[string]string{"python": buildA}, -time.Second); err != nil || n < 1 {
		t.Fatalf("collect stuck: %d %v", n, err)
	}
	// No pool wanted: the ready one goes; the claimed one never.
	waitCounts(t, rt, buildA, 1, 0)
	if _, err = rt.CollectPools(context.Background(), map[string]string{}, time.Hour); err != nil {
		t.Fatal(err)
	}
	list, err := c.CoreV1().Pods(testNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, p := range list.Items {
		left = append(left, p.Annotations[annotationID])
	}
	if len(left) != 1 || left[0] != "keep-claimed" {
		t.Fatalf("left %v, want only the claimed Pod", left)
	}
}

// TestClaimPooledBounds: a claim's names are checked before anything is
// asked of the cluster.
func TestClaimPooledBounds(t *testing.T) {
	c, _ := casClientset(t)
	rt := testRuntime(t, c)
	ctx := context.Background()
	for _, tc := range []struct{ name, build, vol string }{
		{strings.Repeat("p", maxPoolName+1), "", workspace.SessionVolume("t", "s")},
		{"", "", workspace.SessionVolume("t", "s")},
		{"python", "../../x", workspace.SessionVolume("t", "s")},
		{"python", "", "../escape"},
		{"python", "", ""},
	} {
		if _, _, err := rt.ClaimPooled(ctx, tc.name, tc.build, tc.vol, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("claim %.20q %.20q %.20q: %v, want ErrInvalidArgument", tc.name, tc.build, tc.vol, err)
		}
	}
	if err := rt.StartPooled(ctx, "python", "", runtime.Spec{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("start without a build: %v", err)
	}
}
