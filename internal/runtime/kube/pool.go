package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// A warm pool's Pods are labelled with their pool, build and state, so
// that every replica sees the same pool: the leader fills it, any replica
// claims from it. The labels select (the watch, kubectl); the
// annotations hold the values a label could not (a template name of any
// length, a full build hash).
//
// A Pod's state moves one way: starting (made, executor not yet
// answering), ready (its executor answered and its preload is done: a
// Running Pod is not yet a sandbox), claimed (a session's). A claim is
// one patch of the Pod's metadata with its resourceVersion as
// precondition, so of two replicas that claim one Pod, one wins and the
// other gets 409 Conflict and takes the next; the patch also makes the
// Pod the holder of the session's volume and records the session. Its
// spec never changes.
const (
	labelPool           = "sbx.dev/pool"
	labelPoolBuild      = "sbx.dev/pool-build"
	labelPoolState      = "sbx.dev/pool-state"
	annotationPool      = "sbx.dev/pool"
	annotationBuild     = "sbx.dev/build"
	annotationClaimedBy = "sbx.dev/claimed-by"

	poolStarting = "starting"
	poolReady    = "ready"
	poolClaimed  = "claimed"
)

// maxPoolName bounds a pool's name (a template name): it is an
// annotation and a log field.
const maxPoolName = 128

var _ runtime.Pools = (*Runtime)(nil)

// poolMeta is what a pool's Pod is made with.
type poolMeta struct{ name, build string }

func (m *poolMeta) apply(pod *corev1.Pod) {
	pod.Labels[labelPool] = poolLabel(m.name)
	pod.Labels[labelPoolBuild] = m.build[:40]
	pod.Labels[labelPoolState] = poolStarting
	pod.Annotations[annotationPool] = m.name
	pod.Annotations[annotationBuild] = m.build
}

// poolLabel is pool name as a label value: itself when it can be one,
// else a hash of it (the annotation has the name).
func poolLabel(name string) string {
	if len(validation.IsValidLabelValue(name)) == 0 && name != "" {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "h-" + hex.EncodeToString(sum[:20])
}

func checkPool(name, build string, anyBuild bool) error {
	if name == "" || len(name) > maxPoolName {
		return fmt.Errorf("pool %s: want 1 to %d bytes: %w", quote(name), maxPoolName, errdefs.ErrInvalidArgument)
	}
	if anyBuild && build == "" {
		return nil
	}
	if len(build) != 64 {
		return fmt.Errorf("pool %s: build %s is not a template hash: %w", quote(name), quote(build), errdefs.ErrInvalidArgument)
	}
	for i := 0; i < len(build); i++ {
		if c := build[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("pool %s: build %s is not a template hash: %w", quote(name), quote(build), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// poolIndex indexes the watched Pods by pool name.
const poolIndex = "pool"

// poolCache is the watch of every pool's Pods in the namespace, started
// on the first pool call and kept until Close: claims and counts are
// answered from it, never by listing.
func (r *Runtime) poolCache(ctx context.Context) (cache.SharedIndexInformer, error) {
	r.poolOnce.Do(func() {
		sel := labelManaged + "=" + labelManagedBy + "," + labelPool
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (k8sruntime.Object, error) {
				opts.LabelSelector = sel
				return r.pods().List(ctx, opts)
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				opts.LabelSelector = sel
				return r.pods().Watch(ctx, opts)
			},
		}
		// The client says whether it can stream a watch's initial list
		// (client-go's fake cannot).
		r.informer = cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, r.cfg.Client), &corev1.Pod{}, 0, cache.Indexers{
			poolIndex: func(obj any) ([]string, error) {
				if p, ok := obj.(*corev1.Pod); ok {
					return []string{p.Annotations[annotationPool]}, nil
				}
				return nil, nil
			},
		})
		ictx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		r.stopPools = func() { stop(); <-done }
		go func() {
			defer close(done)
			r.informer.RunWithContext(ictx)
		}()
	})
	if !cache.WaitForCacheSync(ctx.Done(), r.informer.HasSynced) {
		return nil, fmt.Errorf("watching the warm pools' pods: %w", errdefs.ErrUnavailable)
	}
	return r.informer, nil
}

// Close stops the pools' watch, if it was started, and waits for it; it
// closes the connections Stats keeps and the idle ones to the API server.
func (r *Runtime) Close() {
	r.poolOnce.Do(func() {}) // none from now on
	if r.stopPools != nil {
		r.stopPools()
	}
	r.closeStats()
	CloseIdle(r.cfg.Client)
}

// poolPods are the watched Pods of pool name.
func poolPods(inf cache.SharedIndexInformer, name string) []*corev1.Pod {
	objs, err := inf.GetIndexer().ByIndex(poolIndex, name)
	if err != nil {
		return nil
	}
	out := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			out = append(out, p)
		}
	}
	return out
}

// claimable says whether pod is a ready Pod of build ("" any) that runs.
func claimable(pod *corev1.Pod, build string) bool {
	return pod.Labels[labelPoolState] == poolReady && podState(pod) == runtime.StateRunning && pod.Status.PodIP != "" &&
		(build == "" || pod.Annotations[annotationBuild] == build)
}

// PoolCounts counts pool name's Pods of build as the watch has them.
func (r *Runtime) PoolCounts(ctx context.Context, name, build string) (ready, starting int, err error) {
	if err := checkPool(name, build, true); err != nil {
		return 0, 0, err
	}
	inf, err := r.poolCache(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, p := range poolPods(inf, name) {
		if build != "" && p.Annotations[annotationBuild] != build || podState(p) == runtime.StateStopped {
			continue
		}
		switch p.Labels[labelPoolState] {
		case poolStarting:
			starting++
		case poolReady:
			ready++
		}
	}
	return ready, starting, nil
}

// StartPooled makes a Pod for pool name, in state starting, and marks it
// ready once Create saw its executor answer with its preload done.
func (r *Runtime) StartPooled(ctx context.Context, name, build string, spec runtime.Spec) error {
	if err := checkPool(name, build, false); err != nil {
		return err
	}
	if _, err := r.create(ctx, spec, &poolMeta{name: name, build: build}); err != nil {
		return err
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, labelPoolState, poolReady)
	_, err := r.pods().Patch(ctx, podName(spec.ID), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		r.remove(context.WithoutCancel(ctx), spec.ID, podName(spec.ID))
		return fmt.Errorf("pool %s: sandbox %s: mark ready: %w", name, spec.ID, apiErr(err))
	}
	return nil
}

// errLost: another replica claimed (or removed) the Pod first.
var errLost = errors.New("another claim won")

// maxClaimTries bounds the candidates one claim tries: each loss means
// another replica took one, and the watch will say so soon.
const maxClaimTries = 32

// ClaimPooled claims a ready Pod of pool name from the watch: reserved
// in this process first, so that two of its claims never try one Pod,
// then taken with one patch conditional on the Pod's resourceVersion.
func (r *Runtime) ClaimPooled(ctx context.Context, name, build, volume string, labels map[string]string) (string, string, error) {
	if err := checkPool(name, build, true); err != nil {
		return "", "", err
	}
	if err := workspace.CheckVolume(volume); err != nil || volume == "" {
		return "", "", fmt.Errorf("pool %s: volume %s: %w", name, quote(volume), errdefs.ErrInvalidArgument)
	}
	inf, err := r.poolCache(ctx)
	if err != nil {
		return "", "", err
	}
	for range maxClaimTries {
		pod := r.reserve(inf, name, build)
		if pod == nil {
			break
		}
		id, err := r.claim(ctx, pod, volume, labels)
		switch {
		case err == nil:
			// Stays reserved until the watch shows it claimed.
			return id, pod.Annotations[annotationBuild], nil
		case errors.Is(err, errLost):
			continue // stays reserved: the watch will drop it
		}
		r.unreserve(pod.Name)
		return "", "", err
	}
	return "", "", fmt.Errorf("pool %s: no sandbox ready: %w", name, errdefs.ErrNotFound)
}

// reserve picks a claimable Pod of pool name no claim of this process
// holds, at random (two replicas claiming at once then rarely try the
// same Pod), and holds it.
func (r *Runtime) reserve(inf cache.SharedIndexInformer, name, build string) *corev1.Pod {
	pods := poolPods(inf, name)
	r.mu.Lock()
	defer r.mu.Unlock()
	// A reservation ends once the watch shows its Pod claimed or gone.
	for pn := range r.reserved {
		obj, ok, _ := inf.GetIndexer().GetByKey(r.cfg.Namespace + "/" + pn)
		if p, isPod := obj.(*corev1.Pod); !ok || !isPod || p.Labels[labelPoolState] != poolReady {
			delete(r.reserved, pn)
		}
	}
	var cands []*corev1.Pod
	for _, p := range pods {
		if claimable(p, build) && !r.reserved[p.Name] {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	p := cands[rand.IntN(len(cands))]
	r.reserved[p.Name] = true
	return p
}

func (r *Runtime) unreserve(name string) {
	r.mu.Lock()
	delete(r.reserved, name)
	r.mu.Unlock()
}

// claimPatch is the one write of a claim: state claimed, the holder of
// volume, claimed by it, its labels; on pod's resourceVersion.
func claimPatch(pod *corev1.Pod, volume string, labels map[string]string) ([]byte, error) {
	all := map[string]string{}
	if s := pod.Annotations[annotationLabels]; s != "" && s != "null" {
		if err := json.Unmarshal([]byte(s), &all); err != nil {
			return nil, fmt.Errorf("pod %s: labels: %w", pod.Name, err)
		}
	}
	maps.Copy(all, labels)
	lj, err := json.Marshal(all)
	if err != nil {
		return nil, err
	}
	patch := map[string]any{"metadata": map[string]any{
		"resourceVersion": pod.ResourceVersion,
		"labels":          map[string]string{labelPoolState: poolClaimed, labelVolume: volumeLabel(volume)},
		"annotations": map[string]string{
			annotationVolume: volume, annotationClaimedBy: volume, annotationLabels: string(lj),
		},
	}}
	return json.Marshal(patch)
}

// claim takes pod for volume. A conflict is a lost race unless a fresh
// read shows the Pod still ready (the watch was behind a change of
// something else): then it tries again on the fresh version.
func (r *Runtime) claim(ctx context.Context, pod *corev1.Pod, volume string, labels map[string]string) (string, error) {
	for range 3 {
		patch, err := claimPatch(pod, volume, labels)
		if err != nil {
			return "", err
		}
		got, err := r.pods().Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			id := got.Annotations[annotationID]
			r.log.Debug("kubernetes: claimed a pooled sandbox", "id", id, "pod", got.Name, "volume", volume)
			return id, nil
		case apierrors.IsNotFound(err):
			return "", errLost
		case !apierrors.IsConflict(err):
			return "", fmt.Errorf("claim pod %s: %w", pod.Name, apiErr(err))
		}
		pod, err = r.pods().Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "", errLost
		}
		if err != nil {
			return "", fmt.Errorf("claim pod %s: %w", pod.Name, apiErr(err))
		}
		if !claimable(pod, "") {
			return "", errLost
		}
	}
	return "", errLost
}

// CollectPools deletes the pool Pods no claim should get: stuck starting,
// stopped, or ready in a pool or of a build not wanted. A ready Pod is
// deleted only at the version the watch saw, so a claim that wins the
// race keeps its Pod.
func (r *Runtime) CollectPools(ctx context.Context, want map[string]string, stuck time.Duration) (int, error) {
	inf, err := r.poolCache(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, obj := range inf.GetStore().List() {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.DeletionTimestamp != nil {
			continue
		}
		var why string
		state := p.Labels[labelPoolState]
		switch {
		case state == poolClaimed:
			continue // a session's: the session's sweeps decide
		case podState(p) == runtime.StateStopped:
			why = "stopped"
		case state == poolStarting && time.Since(p.CreationTimestamp.Time) > stuck:
			why = "stuck starting"
		case state == poolReady && want[p.Annotations[annotationPool]] == "":
			why = "pool no longer wanted"
		case state == poolReady && want[p.Annotations[annotationPool]] != p.Annotations[annotationBuild]:
			why = "build no longer wanted"
		default:
			continue
		}
		grace := int64(0)
		rv := p.ResourceVersion
		err := r.pods().Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("pool pod %s: delete: %w", p.Name, apiErr(err))
		}
		r.forget(p.Annotations[annotationID])
		r.log.Info("kubernetes: collected a warm pool's pod", "pod", p.Name, "pool", p.Annotations[annotationPool], "why", why, "age", time.Since(p.CreationTimestamp.Time).Round(time.Second))
		n++
	}
	return n, nil
}
