//go:build integration

package kubernetes

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/testenv"
	"github.com/sbx-sandbox/sbx/internal/testenv/kubetest"
)

// TestDeployKubernetes is issue 22's "how it will be checked", as CI
// runs it on the cluster `scripts/kube.sh up` made, with the images it
// imported: the Secret, `kubectl apply -k deploy/kubernetes`, then the
// API through the sbx Service's ClusterIP from the host, as a user would
// reach it. Sessions, executions, files, tenants, hibernation and agents;
// a sandbox Pod and an sbx replica deleted along the way; and what code
// in a sandbox Pod must not reach or hold. It deploys into the namespace
// sbx (refusing one it did not make) and removes everything it made,
// failed or not. A failure prints the Pods, their events and the sbx
// replicas' logs.
func TestDeployKubernetes(t *testing.T) {
	start := time.Now()
	d := deploy(t)
	t.Logf("deployed in %s", time.Since(start).Round(time.Second))
	for _, st := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"Sessions", d.testSessions},
		{"Tenants", d.testTenants},
		{"Hostile", d.testHostile},
		{"SandboxPodDeleted", d.testSandboxPodDeleted},
		{"ReplicaDeleted", d.testReplicaDeleted},
		{"ReplicasKilled", d.testReplicasKilled},
		{"Hibernate", d.testHibernate},
		{"Agents", d.testAgents},
	} {
		t0 := time.Now()
		t.Run(st.name, st.f)
		t.Logf("%s: %s", st.name, time.Since(t0).Round(100*time.Millisecond))
	}
	t.Logf("all scenarios done %s after the start", time.Since(start).Round(time.Second))
}

const (
	controlNamespace = controlNS
	sandboxNamespace = sandboxNS
	// containerdSocket is the test cluster's containerd (scripts/kube.sh).
	containerdSocket = "/run/sbx-kube/containerd/containerd.sock"
	// The bounded waits: the stores and the replicas to be ready, and
	// everything to be gone again.
	readyWait   = 4 * time.Minute
	cleanupWait = 3 * time.Minute
	// callWait bounds one API call (a synchronous execution included).
	callWait = 2 * time.Minute
)

// deployment is the deployed sbx and what the test made to get it.
type deployment struct {
	kubectlPath string
	kubeconfig  string
	kc          kubernetes.Interface
	dir         string // deploy/kubernetes
	url         string // the sbx Service, http://CLUSTER-IP:7070
	gateway     string // the host's address on the Pods' network (the API server's)
	keys        map[string]string

	// What was there before: teardown leaves it as it found it.
	madeControl    bool
	madeSandboxNS  bool
	sandboxNSMeta  metav1.ObjectMeta
	sandboxObjects []string // KIND/NAME of the kustomization's objects in sbx-sandboxes that it made
	podsBefore     map[string]bool
	volumes        []string // PersistentVolumes the stores' claims bound

	// The logs of every sbx replica there was, for a failure's report:
	// replicas deleted or replaced take theirs with them.
	logs *followed
}

// cluster returns kubectl and the admin kubeconfig of the test cluster,
// or skips t when there is none (fails it under CI, which starts one).
func cluster(t *testing.T) (kubectlPath, kubeconfig string, kc kubernetes.Interface) {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if os.Getenv("CI") != "" {
			t.Fatalf("%s: CI runs scripts/kube.sh up first", msg)
		}
		t.Skipf("%s: scripts/kube.sh up starts the test cluster and imports the deployment's images", msg)
	}
	testenv.RequiresRoot(t)
	kubeconfig = kubetest.Kubeconfig()
	if _, err := os.Stat(kubeconfig); err != nil {
		missing("no Kubernetes cluster (%v)", err)
	}
	kubectlPath = os.Getenv("KUBECTL")
	if kubectlPath == "" {
		kubectlPath = filepath.Join(kubetest.Root, "bin", "kubectl")
	}
	if _, err := os.Stat(kubectlPath); err != nil {
		missing("no kubectl (%v; set KUBECTL)", err)
	}
	kc, err := kube.Connect(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := kc.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		missing("the cluster of %s does not answer (%v)", kubeconfig, err)
	}
	// The node must have the images the manifests name (they are never
	// pulled): say so now rather than as Pods that cannot start.
	if out, err := exec.Command("ctr", "--address", containerdSocket, "-n", "k8s.io", "images", "ls", "-q").Output(); err == nil {
		have := strings.Fields(string(out))
		for _, want := range append(slices.Clone(providedImages), "sbx/python:") {
			if !slices.ContainsFunc(have, func(s string) bool {
				return s == want || s == "docker.io/"+want || strings.HasSuffix(want, ":") && strings.Contains(s, want)
			}) {
				missing("the node has no image %s", want)
			}
		}
	} else {
		t.Logf("not checking the node's images (ctr: %v)", err)
	}
	return kubectlPath, kubeconfig, kc
}

// deploy applies the manifests as a user would, waits until sbx answers
// through its Service, and makes t's cleanup remove it all.
func deploy(t *testing.T) *deployment {
	kubectlPath, kubeconfig, kc := cluster(t)
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	d := &deployment{kubectlPath: kubectlPath, kubeconfig: kubeconfig, kc: kc, dir: dir, podsBefore: map[string]bool{},
		keys: map[string]string{"acme": "acme-" + token(), "other": "other-" + token()}}
	ctx, cancel := context.WithTimeout(context.Background(), readyWait+time.Minute)
	defer cancel()

	if ns, err := kc.CoreV1().Namespaces().Get(ctx, controlNamespace, metav1.GetOptions{}); err == nil {
		t.Fatalf("namespace %s exists already (%s, made %s): this test deploys sbx there and deletes the namespace afterwards, so it will not use one it did not make; if it is a leftover, `kubectl delete namespace %s`",
			controlNamespace, ns.Status.Phase, ns.CreationTimestamp, controlNamespace)
	} else if !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	// What sbx-sandboxes holds now (scripts/kube.sh makes the namespace,
	// a previous deployment may have left objects), to leave it so.
	switch ns, err := kc.CoreV1().Namespaces().Get(ctx, sandboxNamespace, metav1.GetOptions{}); {
	case apierrors.IsNotFound(err):
		d.madeSandboxNS = true
	case err != nil:
		t.Fatal(err)
	default:
		d.sandboxNSMeta = metav1.ObjectMeta{Labels: ns.Labels, Annotations: ns.Annotations}
		for _, o := range build(t, ".") {
			if o.Metadata.Namespace != sandboxNamespace {
				continue
			}
			ref := strings.ToLower(o.Kind) + "/" + o.Metadata.Name
			out, err := d.kubectl(ctx, "-n", sandboxNamespace, "get", ref, "--ignore-not-found", "-o", "name")
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(out) == "" {
				d.sandboxObjects = append(d.sandboxObjects, ref)
			}
		}
		pods, err := kc.CoreV1().Pods(sandboxNamespace).List(ctx, metav1.ListOptions{LabelSelector: sandboxSelector})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			d.podsBefore[p.Name] = true
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			d.diagnose(t)
		}
		if d.logs != nil {
			d.logs.stop()
		}
		d.teardown(t)
	})

	t0 := time.Now()
	if _, err := d.kubectl(ctx, "create", "namespace", controlNamespace); err != nil {
		t.Fatal(err)
	}
	d.madeControl = true
	var specs []string
	for tenant, key := range d.keys {
		specs = append(specs, key+":"+tenant)
	}
	sort.Strings(specs)
	if _, err := d.kubectl(ctx, "-n", controlNamespace, "create", "secret", "generic", "sbx-api-keys",
		"--from-literal=SBX_API_KEYS="+strings.Join(specs, ",")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.kubectl(ctx, "apply", "-k", d.dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("applied in %s", time.Since(t0).Round(100*time.Millisecond))
	d.logs = d.followLogs()
	for _, w := range []string{"statefulset/postgres", "statefulset/minio", "deployment/sbx"} {
		if _, err := d.kubectl(ctx, "-n", controlNamespace, "rollout", "status", w, "--timeout="+readyWait.String()); err != nil {
			t.Fatalf("%s not ready within %s: %v", w, readyWait, err)
		}
	}
	t.Logf("stores and replicas ready %s after the apply", time.Since(t0).Round(100*time.Millisecond))
	pvcs, err := kc.CoreV1().PersistentVolumeClaims(controlNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pvcs.Items {
		if c.Spec.VolumeName != "" {
			d.volumes = append(d.volumes, c.Spec.VolumeName)
		}
	}
	svc, err := kc.CoreV1().Services(controlNamespace).Get(ctx, "sbx", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.url = "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "7070")
	d.gateway = gatewayOf(t, kubeconfig)
	d.waitServing(t, ctx)
	t.Logf("sbx answers at %s %s after the apply", d.url, time.Since(t0).Round(100*time.Millisecond))
	return d
}

// sandboxSelector selects the sandbox Pods sbx makes.
const sandboxSelector = "app.kubernetes.io/managed-by=sbx,app.kubernetes.io/component=sandbox"

// gatewayOf is the host's address the API server listens on, which the
// Pods reach the host at (scripts/kube.sh: the bridge's own address).
func gatewayOf(t *testing.T, kubeconfig string) string {
	t.Helper()
	b, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(line), "server: https://"); ok {
			if host, _, err := net.SplitHostPort(s); err == nil {
				return host
			}
		}
	}
	t.Fatalf("%s: no server: https://HOST:PORT", kubeconfig)
	return ""
}

// waitServing waits until the Service leads to a replica that is ready:
// Pods are ready before kube-proxy's rules lead to them.
func (d *deployment) waitServing(t *testing.T, ctx context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// A connection each time: one made before kube-proxy's rules for the
	// ClusterIP were in place went elsewhere (the host's default route)
	// and would stay there.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var last string
	for {
		resp, err := hc.Get(d.url + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%s: %s", resp.Status, b)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("GET %s/readyz through the Service: still %s", d.url, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (d *deployment) kubectl(ctx context.Context, args ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, d.kubectlPath, append([]string{"--kubeconfig", d.kubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %v: %s%s", strings.Join(args, " "), err, errb.String(), out.String())
	}
	return out.String(), nil
}

// diagnose logs what a failure needs from the cluster: the Pods of both
// namespaces, their events, the sbx replicas' logs (the previous
// container's too after a restart, and those of replicas the test
// deleted) and the stores' last lines.
func (d *deployment) diagnose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	show := func(args ...string) {
		out, err := d.kubectl(ctx, args...)
		if err != nil {
			out += "\n" + err.Error()
		}
		t.Logf("$ kubectl %s\n%s", strings.Join(args, " "), out)
	}
	for _, ns := range []string{controlNamespace, sandboxNamespace} {
		show("-n", ns, "get", "pods", "-o", "wide")
		show("-n", ns, "get", "events", "--sort-by=.lastTimestamp")
	}
	show("-n", controlNamespace, "get", "deployment,statefulset,pvc,endpointslice", "-o", "wide")
	pods, err := d.kc.CoreV1().Pods(controlNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("listing the pods of %s: %v", controlNamespace, err)
		return
	}
	for _, p := range pods.Items {
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}
		if !ready {
			show("-n", controlNamespace, "describe", "pod", p.Name)
		}
		if p.Labels["app.kubernetes.io/name"] != "sbx" || d.logs == nil {
			show("-n", controlNamespace, "logs", p.Name, "--all-containers", "--tail=100")
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount > 0 {
				show("-n", controlNamespace, "logs", p.Name, "-c", cs.Name, "--previous", "--tail=100")
			}
		}
	}
	sandboxes, err := d.kc.CoreV1().Pods(sandboxNamespace).List(ctx, metav1.ListOptions{LabelSelector: sandboxSelector})
	if err == nil {
		for _, p := range sandboxes.Items {
			if !d.podsBefore[p.Name] {
				show("-n", sandboxNamespace, "logs", p.Name, "--all-containers", "--tail=100")
			}
		}
	}
	if d.logs != nil {
		d.logs.report(t)
	}
}

// followed follows the logs of every sbx replica from its start.
type followed struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	pods   []string
	logs   map[string]*lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// followLogs starts `kubectl logs -f` for each sbx replica as its
// container starts, until the test's cleanup.
func (d *deployment) followLogs() *followed {
	ctx, cancel := context.WithCancel(context.Background())
	f := &followed{cancel: cancel, logs: map[string]*lockedBuffer{}}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for ctx.Err() == nil {
			pods, err := d.kc.CoreV1().Pods(controlNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sbx"})
			if err == nil {
				for _, p := range pods.Items {
					f.mu.Lock()
					_, seen := f.logs[p.Name]
					f.mu.Unlock()
					started := len(p.Status.ContainerStatuses) > 0 &&
						(p.Status.ContainerStatuses[0].State.Running != nil || p.Status.ContainerStatuses[0].State.Terminated != nil)
					if seen || !started {
						continue
					}
					buf := &lockedBuffer{}
					f.mu.Lock()
					f.pods = append(f.pods, p.Name)
					f.logs[p.Name] = buf
					f.mu.Unlock()
					cmd := exec.CommandContext(ctx, d.kubectlPath, "--kubeconfig", d.kubeconfig, "-n", controlNamespace, "logs", "-f", p.Name)
					cmd.Stdout, cmd.Stderr = buf, buf
					if err := cmd.Start(); err != nil {
						fmt.Fprintf(buf, "kubectl logs -f: %v\n", err)
						continue
					}
					f.wg.Add(1)
					go func() {
						defer f.wg.Done()
						cmd.Wait()
					}()
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return f
}

func (f *followed) stop() {
	f.cancel()
	f.wg.Wait()
}

// report logs the last lines of every replica's log.
func (f *followed) report(t *testing.T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, name := range f.pods {
		lines := strings.Split(strings.TrimRight(f.logs[name].String(), "\n"), "\n")
		if len(lines) > 400 {
			lines = append([]string{fmt.Sprintf("(%d lines before)", len(lines)-400)}, lines[len(lines)-400:]...)
		}
		t.Logf("log of sbx replica %s, from its start:\n%s", name, strings.Join(lines, "\n"))
	}
}

// teardown removes what the test made: the namespace sbx (the stores'
// claims with it), the sandbox Pods sbx made, the kustomization's objects
// in sbx-sandboxes that were not there before, the namespace's labels as
// they were; and waits until the stores' volumes are free again.
func (d *deployment) teardown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupWait)
	defer cancel()
	t0 := time.Now()
	var steps []string
	step := func(what string) {
		steps = append(steps, fmt.Sprintf("%s %s", what, time.Since(t0).Round(100*time.Millisecond)))
	}
	if d.madeControl {
		// The replicas first, while the store they close their work in
		// is still there: the namespace's deletion stops everything at
		// once, and a replica waiting on a store that has stopped holds
		// up the namespace until its grace period ends.
		if _, err := d.kubectl(ctx, "-n", controlNamespace, "delete", "deployment", "sbx", "--ignore-not-found", "--cascade=foreground", "--wait=true", "--timeout="+cleanupWait.String()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		step("replicas gone")
		if _, err := d.kubectl(ctx, "delete", "namespace", controlNamespace, "--wait=true", "--timeout="+cleanupWait.String()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		step("namespace sbx gone")
	}
	if d.madeSandboxNS {
		if _, err := d.kubectl(ctx, "delete", "namespace", sandboxNamespace, "--ignore-not-found", "--wait=true", "--timeout="+cleanupWait.String()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	} else {
		zero := int64(0)
		pods := d.kc.CoreV1().Pods(sandboxNamespace)
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sandboxSelector})
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		var mine []string
		for _, p := range list.Items {
			if !d.podsBefore[p.Name] {
				mine = append(mine, p.Name)
				if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("cleanup: deleting pod %s: %v", p.Name, err)
				}
			}
		}
		for _, name := range mine {
			for {
				if _, err := pods.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
					break
				} else if ctx.Err() != nil {
					t.Errorf("cleanup: sandbox pod %s still there after %s", name, cleanupWait)
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		if len(d.sandboxObjects) > 0 {
			args := append([]string{"-n", sandboxNamespace, "delete", "--ignore-not-found"}, d.sandboxObjects...)
			if _, err := d.kubectl(ctx, args...); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		step("sandbox pods gone")
		if ns, err := d.kc.CoreV1().Namespaces().Get(ctx, sandboxNamespace, metav1.GetOptions{}); err != nil {
			t.Errorf("cleanup: %v", err)
		} else {
			ns.Labels, ns.Annotations = d.sandboxNSMeta.Labels, d.sandboxNSMeta.Annotations
			if _, err := d.kc.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
				t.Errorf("cleanup: restoring namespace %s's labels: %v", sandboxNamespace, err)
			}
		}
	}
	// scripts/kube.sh's volume loop empties a released volume and makes
	// it Available again; the next deployment needs it.
	for _, name := range d.volumes {
		for {
			pv, err := d.kc.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
			if err == nil && pv.Status.Phase == corev1.VolumeAvailable || apierrors.IsNotFound(err) {
				break
			}
			if ctx.Err() != nil {
				t.Errorf("cleanup: volume %s not Available again (%v, %v)", name, pv.Status.Phase, err)
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	step("volumes free")
	t.Logf("cleanup: %s", strings.Join(steps, ", "))
}

// client is an API client of tenant's key. keepAlive false makes each
// request a connection of its own, which the Service sends to a replica
// of its choosing.
func (d *deployment) client(tenant string, keepAlive bool) *client.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = !keepAlive
	return client.New(d.url, client.WithAPIKey(d.keys[tenant]), client.WithHTTPClient(&http.Client{Transport: tr, Timeout: callWait}))
}

func token() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callWait)
	t.Cleanup(cancel)
	return ctx
}

// run executes code in session sid and fails t unless it completed.
func run(t *testing.T, c *client.Client, sid string, req api.ExecuteRequest) *api.Execution {
	t.Helper()
	x, err := c.Execute(callCtx(t), sid, req)
	if err != nil {
		t.Fatalf("execute in %s: %v", sid, err)
	}
	if x.Status != "completed" {
		t.Fatalf("execute in %s: %s: %+v\nstdout: %s\nstderr: %s", sid, x.Status, x.Error, x.Stdout, x.Stderr)
	}
	return x
}

// returned decodes an execution's return value into v.
func returned(t *testing.T, x *api.Execution, v any) {
	t.Helper()
	if err := json.Unmarshal(x.ReturnValue, v); err != nil {
		t.Fatalf("return value %s: %v\nstdout: %s\nstderr: %s", x.ReturnValue, err, x.Stdout, x.Stderr)
	}
}

func createSession(t *testing.T, c *client.Client, sid string) {
	t.Helper()
	if _, _, err := c.CreateSession(callCtx(t), api.CreateSessionRequest{SessionID: sid, TemplateID: "python"}); err != nil {
		t.Fatalf("create session %s: %v", sid, err)
	}
}

func upload(t *testing.T, c *client.Client, sid, path string, data []byte) {
	t.Helper()
	if _, err := c.Upload(callCtx(t), sid, client.UploadOptions{Path: path},
		client.UploadFile{Name: filepath.Base(path), Reader: bytes.NewReader(data)}); err != nil {
		t.Fatalf("upload %s to %s: %v", path, sid, err)
	}
}

func download(t *testing.T, c *client.Client, sid, path string) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := c.Download(callCtx(t), sid, path, &b); err != nil {
		t.Fatalf("download %s from %s: %v", path, sid, err)
	}
	return b.Bytes()
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// planted is what plant left in a session: files by path, and what they
// hold.
type planted map[string][]byte

// plant uploads a file and has code write another, and returns both.
func plant(t *testing.T, c *client.Client, sid, tag string) planted {
	t.Helper()
	up := randomBytes(200<<10 + 11)
	upload(t, c, sid, "in/"+tag+".bin", up)
	mark := tag + "-" + token()
	run(t, c, sid, api.ExecuteRequest{Code: fmt.Sprintf(
		"import os\nos.makedirs('/workspace/out', exist_ok=True)\nopen('/workspace/out/%s.txt', 'w').write(%q)", tag, mark)})
	return planted{"in/" + tag + ".bin": up, "out/" + tag + ".txt": []byte(mark)}
}

// check fails t unless the session has every planted file as it was,
// read both through the file API and by code in the sandbox.
func (p planted) check(t *testing.T, c *client.Client, sid string) {
	t.Helper()
	var paths []string
	for path, want := range p {
		paths = append(paths, path)
		if got := download(t, c, sid, path); !bytes.Equal(got, want) {
			t.Errorf("%s of %s: %d bytes, not the %d written", path, sid, len(got), len(want))
		}
	}
	sort.Strings(paths)
	b, _ := json.Marshal(paths)
	x := run(t, c, sid, api.ExecuteRequest{Code: fmt.Sprintf(
		"import hashlib, json\nreturn {p: hashlib.sha256(open('/workspace/' + p, 'rb').read()).hexdigest() for p in json.loads(%q)}", b)})
	var sums map[string]string
	returned(t, x, &sums)
	for path, want := range p {
		if got := sums[path]; got != sha256hex(want) {
			t.Errorf("%s of %s read by code: sha256 %s, want %s", path, sid, got, sha256hex(want))
		}
	}
}
