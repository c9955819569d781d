// Package kube is the runtime that runs sandboxes as Kubernetes Pods
// (issue 22, part 2). A sandbox is one Pod of its template's image, with
// the sbx executor as the container's first process, in the sandbox
// namespace. The API server is the source of truth for what runs: the
// runtime keeps no state a restarted replica would need, and any replica
// reaches any sandbox's executor directly at its Pod's IP and port, never
// through the API server, opening every connection with a credential the
// control plane issues and the executor can only verify
// (internal/executor/token).
//
// What a Pod cannot do, the runtime does not claim: it is no Pauser (a
// Pod cannot be frozen; idle sessions hibernate instead) and its
// sandboxes are not host processes. It is a StatsReader through the
// executor (stats.go).
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Config configures the runtime.
type Config struct {
	// Client talks to the cluster. Required.
	Client kubernetes.Interface
	// Namespace is where sandbox Pods go. Default sbx-sandboxes.
	Namespace string
	// Registry prefixes every image reference (runtime.Spec.Image, which
	// is sbx/NAME:HASH): "registry.example:5000" pulls
	// registry.example:5000/sbx/NAME:HASH. Empty: the reference as it is,
	// for images provided on the nodes (scripts/kube.sh import).
	Registry string
	// ImageSuffix is appended to every image's tag: the executor's part
	// of it (image.ExecutorSuffix), so that a Pod runs the executor of the
	// sbx that made it.
	ImageSuffix string
	// PullPolicy of the sandbox container. Default IfNotPresent: an image
	// names one build by its hash and never changes.
	PullPolicy corev1.PullPolicy
	// Signer signs the token every connection to an executor opens with
	// (internal/executor/token); each sandbox's executor is given only its
	// public key. Required.
	Signer *token.Signer
	// Port is the executor's TCP port in the Pod. Default 7071.
	Port int
	// RuntimeClasses maps a template's runtime (runtime.Spec.Runtime:
	// runc, crun or runsc) to the RuntimeClass its sandbox Pods run under,
	// e.g. runsc to a class of gVisor. A template of runc (the default)
	// without one runs under the cluster's default; one of another
	// runtime without one does not start (RuntimeClass): it asked for an
	// isolation the cluster was not said to give, and runc is not it.
	RuntimeClasses map[string]string
	// UserNamespaces gives each Pod a user namespace of its own
	// (hostUsers: false). It needs containerd 2 and runc 1.2 or later on
	// the nodes; the test cluster (Debian's containerd 1.6) has neither,
	// and a node without them refuses the Pod, which fails its Create at
	// once (refusal.go).
	UserNamespaces bool
	// RequestMilliCPU and RequestMemoryMB are what a sandbox asks the
	// scheduler for, capped by its limits: a sandbox mostly idles, so
	// asking for its whole limit would fit a node's worth of idle
	// sandboxes on a fraction of it. Defaults 10 and 64: a hundred idle
	// sandboxes ask a node for one core and 6.4 GiB (at 50 millicores,
	// this machine's two cores took 40 and no more).
	RequestMilliCPU int64
	RequestMemoryMB int64
	// PodLabels are added to every sandbox Pod (for the operator's
	// NetworkPolicies and quotas).
	PodLabels map[string]string
	// NodeSelector places sandbox Pods.
	NodeSelector map[string]string
	// StartTimeout bounds how long Create waits for a Pod to run and its
	// executor to answer. Default 2 minutes (an image pull may be slow).
	StartTimeout time.Duration
	// StatsTimeout bounds each talk of Stats with an executor or the API
	// server. Default DefaultStatsTimeout.
	StatsTimeout time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
}

func (c *Config) hostUsers() *bool {
	if !c.UserNamespaces {
		return nil
	}
	f := false
	return &f
}

// RuntimeClass is the RuntimeClass the sandboxes of a template of
// runtime name run under ("" for the cluster's default).
// ErrFailedPrecondition: name is not runc and no class is mapped for it.
func (r *Runtime) RuntimeClass(name string) (string, error) {
	if name == "" {
		name = "runc"
	}
	if !slices.Contains(templateRuntimes, name) {
		return "", fmt.Errorf("template runtime %s: want one of %s: %w", quote(name), strings.Join(templateRuntimes, ", "), errdefs.ErrInvalidArgument)
	}
	class, ok := r.cfg.RuntimeClasses[name]
	if !ok && name != "runc" {
		return "", fmt.Errorf("template runtime %s: no RuntimeClass runs it on this cluster (sbx serve --runtime-class %s=CLASS): %w", name, name, errdefs.ErrFailedPrecondition)
	}
	return class, nil
}

// runtimeClass is RuntimeClass as a Pod's runtimeClassName.
func (r *Runtime) runtimeClass(name string) (*string, error) {
	class, err := r.RuntimeClass(name)
	if err != nil || class == "" {
		return nil, err
	}
	return &class, nil
}

// templateRuntimes are the runtimes a template may declare
// (template.Spec.Runtime).
var templateRuntimes = []string{"runc", "crun", "runsc"}

// CheckRuntimeClasses refuses a mapping from something no template
// declares, or to something that cannot name a RuntimeClass
// (Config.RuntimeClasses).
func CheckRuntimeClasses(m map[string]string) error {
	for name, class := range m {
		if !slices.Contains(templateRuntimes, name) {
			return fmt.Errorf("runtime class for %s: a template's runtime is one of %s: %w", quote(name), strings.Join(templateRuntimes, ", "), errdefs.ErrInvalidArgument)
		}
		if errs := validation.IsDNS1123Subdomain(class); len(errs) > 0 {
			return fmt.Errorf("runtime class %s for %s: not a RuntimeClass name: %s: %w", quote(class), name, strings.Join(errs, "; "), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Runtime runs sandboxes as Pods.
type Runtime struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	addrs   map[string]string      // sandbox id -> pod IP:port, as last seen
	stats   map[string]*statsEntry // sandbox id -> what Stats keeps of it (stats.go)
	volumes *Volumes               // the workspace store over this runtime's Pods, once made

	warnEvents sync.Once // watchSandboxRefusal's warning

	// The warm pools' watch (pool.go), started by the first pool call.
	poolOnce  sync.Once
	informer  cache.SharedIndexInformer
	stopPools context.CancelFunc
	reserved  map[string]bool // pod name -> a claim of this process holds it
}

var (
	_ runtime.Runtime     = (*Runtime)(nil)
	_ runtime.StatsReader = (*Runtime)(nil)
)

// New returns a runtime with cfg.
func New(cfg Config) (*Runtime, error) {
	if cfg.Client == nil || cfg.Signer == nil {
		return nil, fmt.Errorf("kubernetes runtime: a client and a signer are required: %w", errdefs.ErrInvalidArgument)
	}
	if err := CheckRuntimeClasses(cfg.RuntimeClasses); err != nil {
		return nil, fmt.Errorf("kubernetes runtime: %w", err)
	}
	cfg.RuntimeClasses = maps.Clone(cfg.RuntimeClasses)
	if cfg.Namespace == "" {
		cfg.Namespace = "sbx-sandboxes"
	}
	if cfg.PullPolicy == "" {
		cfg.PullPolicy = corev1.PullIfNotPresent
	}
	if cfg.Port == 0 {
		cfg.Port = 7071
	}
	if cfg.RequestMilliCPU == 0 {
		cfg.RequestMilliCPU = 10
	}
	if cfg.RequestMemoryMB == 0 {
		cfg.RequestMemoryMB = 64
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 2 * time.Minute
	}
	if cfg.StatsTimeout == 0 {
		cfg.StatsTimeout = DefaultStatsTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Runtime{cfg: cfg, log: log, addrs: map[string]string{}, stats: map[string]*statsEntry{}, reserved: map[string]bool{}}, nil
}

// Capabilities: a Pod cannot be frozen and its processes are not the
// caller's host's; its usage is its executor's to tell (stats.go), and
// its warm pools are every replica's (pool.go).
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Stats: true, Pools: true}
}

func (r *Runtime) pods() podClient { return r.cfg.Client.CoreV1().Pods(r.cfg.Namespace) }

type podClient = interface {
	Create(ctx context.Context, pod *corev1.Pod, opts metav1.CreateOptions) (*corev1.Pod, error)
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Pod, error)
}

// image is the reference a Pod pulls for spec's image.
func (r *Runtime) image(ref string) string {
	ref += r.cfg.ImageSuffix
	if r.cfg.Registry == "" {
		return ref
	}
	return r.cfg.Registry + "/" + ref
}

// Create makes the sandbox's Pod and waits until it runs and its executor
// answers: a Running Pod is not yet a sandbox.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (*runtime.Info, error) {
	return r.create(ctx, spec, nil)
}

// create is Create, of a warm pool's Pod when pool is not nil: it is
// made with the pool's labels, state starting.
func (r *Runtime) create(ctx context.Context, spec runtime.Spec, pool *poolMeta) (info *runtime.Info, err error) {
	if !validID(spec.ID) {
		return nil, fmt.Errorf("sandbox id %s: want [a-zA-Z0-9][a-zA-Z0-9_-]{0,63}: %w", quote(spec.ID), errdefs.ErrInvalidArgument)
	}
	// A template build, by its full hash: nothing else is an image here.
	if _, err := template.ParseImageRef(spec.Image); err != nil {
		return nil, fmt.Errorf("sandbox %s: image %s: %w", spec.ID, quote(spec.Image), errdefs.ErrInvalidArgument)
	}
	if err := workspace.CheckVolume(spec.Volume); err != nil {
		return nil, fmt.Errorf("sandbox %s: volume %s: %w", spec.ID, quote(spec.Volume), errdefs.ErrInvalidArgument)
	}
	if spec.Network {
		return nil, fmt.Errorf("sandbox %s: network access is not supported: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	res := spec.Resources.WithDefaults()
	pod, err := r.podSpec(spec, r.image(spec.Image), res)
	if err != nil {
		return nil, err
	}
	if pool != nil {
		pool.apply(pod)
	}
	created, err := r.pods().Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	if apierrors.IsForbidden(err) && pod.Spec.RuntimeClassName != nil && strings.Contains(err.Error(), "RuntimeClass") {
		// The RuntimeClass admission plugin: the class mapped for the
		// template's runtime is not in the cluster. No retry mends that.
		return nil, fmt.Errorf("sandbox %s: RuntimeClass %s: %w: %w", spec.ID, *pod.Spec.RuntimeClassName, errdefs.ErrFailedPrecondition, err)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: create pod: %w", spec.ID, apiErr(err))
	}
	defer func() {
		if err != nil {
			r.remove(context.WithoutCancel(ctx), spec.ID, created.Name)
		}
	}()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, r.cfg.StartTimeout)
	defer cancel()
	running, err := r.waitRunning(wctx, created)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	addr := net.JoinHostPort(running.Status.PodIP, strconv.Itoa(r.cfg.Port))
	r.mu.Lock()
	r.addrs[spec.ID] = addr
	r.mu.Unlock()
	if err := r.waitExecutor(wctx, spec.ID); err != nil {
		return nil, fmt.Errorf("sandbox %s: the executor at %s does not answer: %w", spec.ID, addr, err)
	}
	r.mu.Lock()
	vols := r.volumes
	r.mu.Unlock()
	if vols != nil && spec.Volume != "" {
		if err := vols.restore(wctx, spec.ID, spec.Volume); err != nil {
			return nil, fmt.Errorf("sandbox %s: restoring workspace %s: %w", spec.ID, spec.Volume, err)
		}
	}
	r.log.Debug("kubernetes: sandbox ready", "id", spec.ID, "pod", created.Name, "addr", addr, "took", time.Since(start).Round(time.Millisecond))
	got, ok := r.info(running)
	if !ok {
		return nil, fmt.Errorf("sandbox %s: pod %s lost sbx's annotations", spec.ID, running.Name)
	}
	got.State = runtime.StateRunning
	return &got, nil
}

// waitRunning watches pod until it runs with an IP, fails, or ctx ends.
// A Pod whose sandbox the node refuses to make for good (sandboxRefusal)
// fails at once rather than at the end of ctx.
func (r *Runtime) waitRunning(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	refused := r.watchSandboxRefusal(ctx, pod)
	sel := fields.OneTermEqualSelector("metadata.name", pod.Name).String()
	rv := pod.ResourceVersion
	for {
		w, err := r.pods().Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: rv})
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("pod %s did not start in time: %w", pod.Name, errdefs.ErrUnavailable)
			}
			return nil, fmt.Errorf("watch pod %s: %w", pod.Name, apiErr(err))
		}
		results := w.ResultChan()
		for open := true; open; {
			var ev watch.Event
			select {
			case err := <-refused:
				w.Stop()
				return nil, fmt.Errorf("pod %s: %w", pod.Name, err)
			case <-ctx.Done():
				w.Stop()
				return nil, fmt.Errorf("pod %s did not start in time: %w", pod.Name, errdefs.ErrUnavailable)
			case ev, open = <-results:
			}
			if !open {
				break
			}
			switch ev.Type {
			case watch.Deleted:
				w.Stop()
				return nil, fmt.Errorf("pod %s was deleted while starting: %w", pod.Name, errdefs.ErrUnavailable)
			case watch.Error:
				w.Stop()
				rv = "" // expired: start again from the present
				continue
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.Name != pod.Name {
				continue
			}
			rv = p.ResourceVersion
			if err := failure(p); err != nil {
				w.Stop()
				return nil, err
			}
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && podState(p) == runtime.StateRunning {
				w.Stop()
				return p, nil
			}
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("pod %s did not start in time: %w", pod.Name, errdefs.ErrUnavailable)
		}
		// The server closed the watch: go on from the last version seen
		// (or, after an error, from a fresh read).
		if rv == "" {
			p, err := r.pods().Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("pod %s: %w", pod.Name, apiErr(err))
			}
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && podState(p) == runtime.StateRunning {
				return p, nil
			}
			rv = p.ResourceVersion
		}
	}
}

// waitExecutor waits until the sandbox's executor answers /health. The
// container runs before the executor listens; its socket refuses until
// then.
func (r *Runtime) waitExecutor(ctx context.Context, id string) error {
	c := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return r.Dial(ctx, id) })
	defer c.Close()
	return c.WaitReady(ctx)
}

// addr is where sandbox id's executor listens.
func (r *Runtime) addr(ctx context.Context, id string) (string, error) {
	r.mu.Lock()
	a, ok := r.addrs[id]
	r.mu.Unlock()
	if ok {
		return a, nil
	}
	pod, err := r.pods().Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		return "", fmt.Errorf("sandbox %s: %w", id, apiErr(err))
	}
	if _, ok := r.info(pod); !ok || pod.Annotations[annotationID] != id {
		return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if podState(pod) != runtime.StateRunning || pod.Status.PodIP == "" {
		return "", fmt.Errorf("sandbox %s is %s: %w", id, podState(pod), errdefs.ErrUnavailable)
	}
	a = net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(r.cfg.Port))
	r.mu.Lock()
	r.addrs[id] = a
	r.mu.Unlock()
	return a, nil
}

// Dial connects to the sandbox's executor at its Pod's address and opens
// the connection with the control plane's credential for that sandbox.
func (r *Runtime) Dial(ctx context.Context, id string) (net.Conn, error) {
	if !validID(id) {
		return nil, fmt.Errorf("sandbox %s: %w", quote(id), errdefs.ErrNotFound)
	}
	addr, err := r.addr(ctx, id)
	if err != nil {
		return nil, err
	}
	// A Pod that goes away with its network (deleted, evicted, its node
	// lost) sends no FIN: without probes a run's connection, quiet while
	// the code sleeps, would wait out the run's timeout. Probed, it fails
	// within about 20 s of the Pod's end, and the run is known lost.
	d := net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 5 * time.Second, Count: 3}}
	conn, err := r.cfg.Signer.Dial(ctx, &d, "tcp", addr, id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return conn, nil
}

// Stop ends the sandbox's processes and keeps its Pod, so that Inspect
// says it is stopped until Destroy. The Pod is marked stopped at once and
// given an active deadline already past, which has the kubelet kill it;
// nothing runs in it again (restartPolicy Never).
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if !validID(id) {
		return fmt.Errorf("sandbox %s: %w", quote(id), errdefs.ErrNotFound)
	}
	patch := []byte(`{"metadata":{"annotations":{"` + annotationStopped + `":"true"}},"spec":{"activeDeadlineSeconds":1}}`)
	_, err := r.pods().Patch(ctx, podName(id), types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: stop: %w", id, apiErr(err))
	}
	r.forget(id)
	return nil
}

// Destroy deletes the sandbox's Pod at once (no grace: the executor
// keeps nothing worth a graceful end; the workspace is the caller's) and
// waits until it is gone, so that its name is free again.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	if !validID(id) {
		return nil // nothing by that name can exist
	}
	return r.remove(ctx, id, podName(id))
}

func (r *Runtime) remove(ctx context.Context, id, name string) error {
	r.forget(id)
	r.mu.Lock()
	delete(r.stats, id)
	r.mu.Unlock()
	grace := int64(0)
	bg := metav1.DeletePropagationBackground
	err := r.pods().Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace, PropagationPolicy: &bg})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: delete pod: %w", id, apiErr(err))
	}
	return r.waitGone(ctx, name)
}

// waitGone waits until pod name no longer exists.
func (r *Runtime) waitGone(ctx context.Context, name string) error {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	for {
		list, err := r.pods().List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return fmt.Errorf("pod %s: %w", name, apiErr(err))
		}
		if len(list.Items) == 0 {
			return nil
		}
		w, err := r.pods().Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return fmt.Errorf("pod %s: %w", name, apiErr(err))
		}
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ev.Type == watch.Deleted && ok && p.Name == name {
				w.Stop()
				return nil
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("pod %s is still being deleted: %w", name, ctx.Err())
		}
	}
}

// forget drops what this process keeps of sandbox id's Pod: its address
// and its stats connection (not the figures Stats keeps of it).
func (r *Runtime) forget(id string) {
	r.mu.Lock()
	delete(r.addrs, id)
	var c *execclient.Client
	if e := r.stats[id]; e != nil {
		c, e.client = e.client, nil
	}
	r.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Inspect reports one sandbox, as the API server has it now.
func (r *Runtime) Inspect(ctx context.Context, id string) (*runtime.Info, error) {
	if !validID(id) {
		return nil, fmt.Errorf("sandbox %s: %w", quote(id), errdefs.ErrNotFound)
	}
	pod, err := r.pods().Get(ctx, podName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, apiErr(err))
	}
	info, ok := r.info(pod)
	if !ok || info.ID != id {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return &info, nil
}

// List reports every sandbox Pod in the namespace, whichever replica made
// it.
func (r *Runtime) List(ctx context.Context) ([]runtime.Info, error) {
	sel := labelManaged + "=" + labelManagedBy + "," + labelComponent + "=" + componentSandbox
	var out []runtime.Info
	opts := metav1.ListOptions{LabelSelector: sel, Limit: 500}
	for {
		list, err := r.pods().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list sandbox pods: %w", apiErr(err))
		}
		for i := range list.Items {
			if info, ok := r.info(&list.Items[i]); ok {
				out = append(out, info)
			}
		}
		if list.Continue == "" {
			return out, nil
		}
		opts.Continue = list.Continue
	}
}

// quote quotes a name for an error, cut short: a caller's 64 KiB name
// is not repeated back.
func quote(s string) string {
	if len(s) > 80 {
		return strconv.Quote(s[:80]) + "..."
	}
	return strconv.Quote(s)
}

// apiErr maps the API server's refusals onto errdefs, keeping its words.
func apiErr(err error) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		return fmt.Errorf("%w: %w", errdefs.ErrConflict, err)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	case apierrors.IsForbidden(err):
		var st apierrors.APIStatus
		if errors.As(err, &st) && st.Status().Details != nil && st.Status().Details.Kind == "resourcequotas" {
			return fmt.Errorf("%w: %w", errdefs.ErrResourceExhausted, err)
		}
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsServiceUnavailable(err):
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	return err
}

// Connect returns a client of the cluster: kubeconfig's, or, when it is
// empty, the one sbx runs in (its Pod's service account).
func Connect(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	// The runtime's calls are few and small; the defaults (5 per second,
	// bursts of 10) would throttle a burst of creates on their own.
	cfg.QPS, cfg.Burst = 100, 200
	cfg.UserAgent = "sbx"
	return kubernetes.NewForConfig(cfg)
}

// CloseIdle closes the idle connections of client to the API server (an
// HTTP/2 connection keeps a goroutine reading it until it closes): when
// a server or a test is done with the cluster. A later call opens a new
// one.
func CloseIdle(client kubernetes.Interface) {
	if rc, ok := client.CoreV1().RESTClient().(*rest.RESTClient); ok && rc != nil && rc.Client != nil {
		// Through client-go's wrappers (auth, user agent), which
		// http.Client's own CloseIdleConnections does not see through.
		utilnet.CloseIdleConnectionsFor(rc.Client.Transport)
	}
}
