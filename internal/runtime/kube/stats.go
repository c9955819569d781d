package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbx-sandbox/sbx/errdefs"
	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// A Pod's usage is its executor's GET /stats: the sandbox container's own
// cgroup, which the executor reads from the top of its /sys/fs/cgroup (the
// container runtime mounts the container's cgroup there, read-only; on
// this test cluster's cgroup v1 node as on v2). The API server is asked
// only the first time and when the executor does not answer: the usage
// sampler (internal/usage) reads every held sandbox every few seconds,
// and a Get per reading would load the API server with hundreds of
// requests per pass.

// DefaultStatsTimeout bounds one Stats call's talk with the executor. An
// executor answers in about a millisecond; one that does not answer
// within this (its Pod gone without a word, its CPU quota spent by the
// code it runs, or a sandbox that made it hostile) costs the caller no
// more, and the reading fails as unavailable.
const DefaultStatsTimeout = time.Second

// maxFigure caps every figure an executor reports: internal/usage turns
// them into int64s, and an executor is trusted with its own sandbox's
// figures, not with the control plane's arithmetic.
const maxFigure = 1 << 62

// statsEntry is what Stats keeps of a sandbox it reads.
type statsEntry struct {
	// client holds a kept-alive connection to the sandbox's executor;
	// nil once that connection failed or the sandbox was stopped.
	client *execclient.Client
	// limits are the sandbox's resources, from its Pod's annotation.
	limits runtime.Resources
	// cpu and oomKills are the last figures read: they only grow, and a
	// stopped sandbox, whose cgroup went with its container, reports them.
	cpu, oomKills uint64
}

// Stats reads the sandbox's usage from its executor. A stopped sandbox
// (or one still starting) runs no process: it reports no memory and no
// processes, the CPU time and OOM kills this process last read of it (an
// executor the OOM killer ended counts as one), and its limits. A sandbox
// whose Pod does not exist is ErrNotFound; one whose executor does not
// answer in Config.StatsTimeout, ErrUnavailable.
func (r *Runtime) Stats(ctx context.Context, id string) (*runtime.Stats, error) {
	if !validID(id) {
		return nil, fmt.Errorf("sandbox %s: %w", quote(id), errdefs.ErrNotFound)
	}
	r.mu.Lock()
	e := r.stats[id]
	var c *execclient.Client
	if e != nil {
		c = e.client
	}
	r.mu.Unlock()
	if c == nil {
		pod, err := r.statsPod(ctx, id)
		if err != nil {
			return nil, err
		}
		if e, c = r.track(id, pod); c == nil {
			return r.stoppedStats(id, pod), nil
		}
	}
	sctx, cancel := context.WithTimeout(ctx, r.cfg.StatsTimeout)
	ws, err := c.Stats(sctx)
	cancel()
	if err == nil {
		return r.record(e, ws), nil
	}
	// The executor did not answer: its Pod may have stopped or gone, or
	// moved (a new Pod of the same sandbox, a new IP). Its connection and
	// address are dropped, and the API server says which.
	r.forget(id)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("sandbox %s: stats: %w", id, context.Cause(ctx))
	}
	pod, perr := r.statsPod(ctx, id)
	if perr != nil {
		return nil, perr
	}
	if podState(pod) != runtime.StateRunning {
		return r.stoppedStats(id, pod), nil
	}
	if !errors.Is(err, errdefs.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	return nil, fmt.Errorf("sandbox %s: stats: %w", id, err)
}

// statsPod is sandbox id's Pod, from the API server; ErrNotFound if it
// has none (and then Stats forgets it).
func (r *Runtime) statsPod(ctx context.Context, id string) (*corev1.Pod, error) {
	gctx, cancel := context.WithTimeout(ctx, r.cfg.StatsTimeout)
	defer cancel()
	pod, err := r.pods().Get(gctx, podName(id), metav1.GetOptions{})
	if err == nil {
		if info, ok := r.info(pod); ok && info.ID == id {
			return pod, nil
		}
	} else if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("sandbox %s: %w", id, apiErr(err))
	}
	r.mu.Lock()
	delete(r.stats, id)
	r.mu.Unlock()
	return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

// track keeps what Stats needs of sandbox id's Pod: its limits and, if it
// runs, a client of its executor (nil otherwise), whose address it keeps
// for Dial too.
func (r *Runtime) track(id string, pod *corev1.Pod) (*statsEntry, *execclient.Client) {
	info, _ := r.info(pod)
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.stats[id]
	if e == nil {
		e = &statsEntry{}
		r.stats[id] = e
	}
	e.limits = info.Resources
	if podState(pod) != runtime.StateRunning || pod.Status.PodIP == "" {
		return e, nil
	}
	if e.client == nil {
		r.addrs[id] = net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(r.cfg.Port))
		e.client = execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return r.Dial(ctx, id) })
	}
	return e, e.client
}

// record turns what the executor said into a sandbox's Stats, keeping the
// figures that only grow.
func (r *Runtime) record(e *statsEntry, ws *wire.Stats) *runtime.Stats {
	mem := min(ws.MemoryUsageBytes, maxFigure)
	st := &runtime.Stats{
		MemoryBytes:      mem,
		MemoryPeakBytes:  min(max(ws.MemoryPeakBytes, mem), maxFigure),
		MemoryCacheBytes: min(ws.MemoryCacheBytes, mem),
		CPUNanos:         min(ws.CPUUsageNs, maxFigure),
		PIDs:             min(ws.PidsCurrent, maxFigure),
		OOMKills:         min(ws.OOMKillCount, maxFigure),
		DiskBytes:        min(ws.WorkspaceBytes, maxFigure),
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st.CPUNanos = max(st.CPUNanos, e.cpu)
	st.OOMKills = max(st.OOMKills, e.oomKills)
	e.cpu, e.oomKills = st.CPUNanos, st.OOMKills
	st.Limits = e.limits
	return st
}

// stoppedStats are the figures of sandbox id, whose Pod runs no executor.
func (r *Runtime) stoppedStats(id string, pod *corev1.Pod) *runtime.Stats {
	info, _ := r.info(pod)
	st := &runtime.Stats{Limits: info.Resources}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; cs.Name == containerName && t != nil && t.Reason == "OOMKilled" {
			st.OOMKills = 1
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.stats[id]; e != nil {
		st.CPUNanos = e.cpu
		st.OOMKills = max(st.OOMKills, e.oomKills)
		e.oomKills = st.OOMKills
	}
	return st
}

// closeStats closes the executors' kept-alive connections of Stats.
func (r *Runtime) closeStats() {
	r.mu.Lock()
	var cs []*execclient.Client
	for _, e := range r.stats {
		if e.client != nil {
			cs = append(cs, e.client)
			e.client = nil
		}
	}
	r.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}
