package main

// The Kubernetes runtime against runc (-only kube): two throwaway control
// planes in this process, one running sandboxes as runc containers on
// this host (the default) and one running them as Pods of a cluster
// (internal/runtime/kube), measured in turns so that the other load on
// the machine falls on both alike, each kubernetes figure beside runc's
// with the ratio kube/runc.
//
//	(r) warm pool claim -> first result, one at a time and 20 at once:
//	    a pool of 20 per server, full again before every round.
//	(s) cold create -> first result, no pool.
//	(t) execution round trip, print(1) with ?wait=true, paced.
//	(u) upload 50 MB, and download it, through the executor.
//	(v) hibernate and restore a 100 MB workspace, without a warm pool
//	    (the restore starts a Pod) and with one (it claims one).
//	(w) 100 sessions (-kube-sessions) created and run at once.
//
// The cluster is SBX_KUBECONFIG's, else the test cluster of
// scripts/kube.sh (/var/lib/sbx-kube/kubeconfig); without one the kube
// half is skipped and says so. Its Pods go in a namespace of the bench's
// own (sbx-bench-PID), which it deletes at the end, after counting the
// Pods the server left there. The python template's image, holding
// -executor, is built and imported into the node first (scripts/kube.sh
// import), as kubetest does for the tests: the bench must run from the
// repository's root.
//
// The two servers do not run together: the warm-pool pair first (their
// pools would serve the cold creates), then the pair without pools.

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/image"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv/kubetest"
)

var (
	kubeSessions = flag.Int("kube-sessions", 100, "-only kube: sessions created and run at once")
	kubeRounds   = flag.Int("kube-rounds", 5, "-only kube: rounds of 20 warm-pool claims at once")
)

// kubePool is the warm pool of each -only kube server: enough for 20
// claims at once without a miss.
const kubePool = 20

// benchCluster is the cluster the kube half runs on and the namespace of
// the bench's Pods.
type benchCluster struct {
	client     kubernetes.Interface
	kubeconfig string
	namespace  string
}

func benchKube(ctx context.Context, add func(row)) {
	store := template.NewStore(filepath.Join(*dataDir, "templates"))
	py := ensure(ctx, store, "python")
	cl, err := openBenchCluster(ctx, store, py)
	if err != nil {
		skipped("(r..w) the kubernetes runtime", err, add)
	} else {
		defer cl.close(add)
	}
	pair := func(name string, configure ...func(*app.Config)) (runc, pods *controlPlane) {
		runc = startControlPlane(filepath.Join(*dataDir, "bench-kube-runc-"+name), nil, configure...)
		if cl != nil {
			configure = append(configure, func(c *app.Config) {
				c.Kubernetes = &app.Kubernetes{Kubeconfig: cl.kubeconfig, Namespace: cl.namespace}
			})
			pods = startControlPlane(filepath.Join(*dataDir, "bench-kube-pods-"+name), noSandboxes, configure...)
		}
		return runc, pods
	}

	runc, pods := pair("pool", func(c *app.Config) { c.Pools = map[string]int{"python": kubePool} })
	benchKubePool(ctx, cl, runc, pods, add)
	benchKubeLifecycle(ctx, runc, pods, add, " (warm pool)")
	stopPair(runc, pods)
	if cl != nil {
		// A stopped server leaves its pool's Pods (its leader collected
		// them); the next pair must have the node's Pod slots to itself.
		cl.deletePods()
	}

	runc, pods = pair("plain")
	defer stopPair(runc, pods)
	benchKubeCold(ctx, runc, pods, add)
	benchKubeRoundTrip(ctx, cl, runc, pods, add)
	benchKubeLifecycle(ctx, runc, pods, add, "")
	benchKubeConcurrent(ctx, runc, pods, add)
}

func stopPair(runc, pods *controlPlane) {
	runc.stop()
	if pods != nil {
		pods.stop()
	}
}

// openBenchCluster connects to the cluster, makes the bench's namespace
// and provides the template's image on the node.
func openBenchCluster(ctx context.Context, store *template.Store, t *template.Template) (*benchCluster, error) {
	kc := kubetest.Kubeconfig()
	if _, err := os.Stat(kc); err != nil {
		return nil, fmt.Errorf("no cluster (%w): scripts/kube.sh up starts one, or set SBX_KUBECONFIG", err)
	}
	c, err := kube.Connect(kc)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Discovery().ServerVersion(); err != nil {
		return nil, fmt.Errorf("the cluster of %s does not answer: %w", kc, err)
	}
	cl := &benchCluster{client: c, kubeconfig: kc, namespace: fmt.Sprintf("sbx-bench-%d", os.Getpid())}
	if _, err := c.CoreV1().Namespaces().Create(cctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: cl.namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "sbx-bench"},
	}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("namespace %s: %w", cl.namespace, err)
	}
	t0 := time.Now()
	if err := provideImage(ctx, store, t); err != nil {
		cl.deleteNamespace()
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "bench: kube: image of %s on the node in %v; Pods in namespace %s\n", t.Spec.Name, time.Since(t0).Round(time.Millisecond), cl.namespace)
	return cl, nil
}

// provideImage builds the template's image with -executor, under the tag
// the kubernetes runtime asks the node for, and imports it there.
func provideImage(ctx context.Context, store *template.Store, t *template.Template) error {
	suffix, err := image.ExecutorSuffix(*exePath)
	if err != nil {
		return err
	}
	tag, err := image.ParseTag(t.Image() + suffix)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "sbx-bench-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	img, err := image.Template(ctx, tmp, store, t, *exePath)
	if err != nil {
		return fmt.Errorf("image of %s: %w", t.Spec.Name, err)
	}
	defer img.Close()
	file := filepath.Join(tmp, "image.tar")
	if err := image.WriteArchiveFile(file, tag, img); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "scripts/kube.sh", "import", file).CombinedOutput(); err != nil {
		return fmt.Errorf("scripts/kube.sh import (run the bench from the repository's root): %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// close counts the Pods the servers left in the namespace (a row, when
// there are any: every session was deleted and the servers stopped), then
// deletes them and the namespace.
func (cl *benchCluster) close(add func(row)) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods, err := cl.client.CoreV1().Pods(cl.namespace).List(ctx, metav1.ListOptions{})
	switch {
	case err != nil:
		log.Printf("listing the Pods left in %s: %v", cl.namespace, err)
	case len(pods.Items) > 0:
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Name)
		}
		add(row{name: fmt.Sprintf("    Pods left in %s after the servers stopped", cl.namespace), goal: "none",
			vs: fmt.Sprintf("%d: %s", len(names), strings.Join(names[:min(len(names), 5)], " "))})
	}
	zero := int64(0)
	cl.client.CoreV1().Pods(cl.namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	cl.deleteNamespace()
}

// deletePods deletes the Pods of the bench's namespace and waits until
// they are gone.
func (cl *benchCluster) deletePods() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods := cl.client.CoreV1().Pods(cl.namespace)
	zero := int64(0)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		log.Printf("deleting the pods of %s: %v", cl.namespace, err)
		return
	}
	for ctx.Err() == nil {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) == 0 {
			return
		}
		time.Sleep(time.Second)
	}
	log.Printf("the pods of %s are not gone after 2 minutes", cl.namespace)
}

func (cl *benchCluster) deleteNamespace() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.client.CoreV1().Namespaces().Delete(ctx, cl.namespace, metav1.DeleteOptions{}); err != nil {
		log.Printf("deleting namespace %s: %v", cl.namespace, err)
	}
}

// sideBySide adds runc's row and, when the kube half ran, the Pods' one
// below it, with the ratios kube/runc of p50 and p99.
func sideBySide(add func(row), name, goal string, runc, pods samples) {
	add(row{name: name + ": runc", p50: runc.p(50), p99: runc.p(99)})
	if pods == nil {
		return
	}
	add(row{name: "    same, kubernetes Pods", p50: pods.p(50), p99: pods.p(99), goal: goal, vs: kubeRatio(runc, pods)})
}

// kubeRatio is kube/runc at p50 and p99.
func kubeRatio(runc, pods samples) string {
	r := func(q int) string {
		if runc.p(q) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", float64(pods.p(q))/float64(runc.p(q)))
	}
	return fmt.Sprintf("kube/runc p50 %s, p99 %s", r(50), r(99))
}

// both runs f on runc's server, then on the Pods' (if any), appending
// each duration f returns to that server's samples: the measures take
// their samples in turns.
func both(runc, pods *controlPlane, out *[2]samples, f func(cp *controlPlane) time.Duration) {
	for j, cp := range []*controlPlane{runc, pods} {
		if cp != nil {
			out[j] = append(out[j], f(cp))
		}
	}
}

// sorted sorts both halves; the Pods' half is nil when it did not run.
func sorted(s [2]samples) (samples, samples) {
	sortSamples(s[0])
	sortSamples(s[1])
	return s[0], s[1]
}

// firstResult creates session id and runs print(1) in it: create -> first
// result.
func firstResult(ctx context.Context, cp *controlPlane, id string) time.Duration {
	t0 := time.Now()
	if _, _, err := cp.c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: "python"}); err != nil {
		log.Fatal(err)
	}
	mustExec(ctx, cp.c, id, "print(1)")
	return time.Since(t0)
}

// deleteAll deletes the sessions at once.
func deleteAll(ctx context.Context, cp *controlPlane, ids []string) {
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := cp.c.DeleteSession(ctx, id); err != nil {
				log.Printf("deleting %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
}

// waitPoolFull waits until the server's python pool holds kubePool ready
// sandboxes, then a little more for the last one's preload to settle (as
// benchPool does).
func waitPoolFull(cp *controlPlane) {
	deadline := time.Now().Add(5 * time.Minute)
	for cp.app.Sessions.PoolSizes()["python"] < kubePool {
		if time.Now().After(deadline) {
			log.Fatalf("%s: the warm pool holds %d of %d after 5 minutes", cp.dir, cp.app.Sessions.PoolSizes()["python"], kubePool)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
}

// benchKubePool (r) claims sandboxes from full warm pools: -http-creates
// single claims, then -kube-rounds rounds of 20 at once.
func benchKubePool(ctx context.Context, cl *benchCluster, runc, pods *controlPlane, add func(row)) {
	var one [2]samples
	n := 0
	calls := cl.podCalls(ctx)
	for range *httpCreates {
		n++
		both(runc, pods, &one, func(cp *controlPlane) time.Duration {
			waitPoolFull(cp)
			return firstResult(ctx, cp, fmt.Sprintf("pool-%d", n))
		})
	}
	var ids []string
	for k := 1; k <= n; k++ {
		ids = append(ids, fmt.Sprintf("pool-%d", k))
	}
	both(runc, pods, &[2]samples{}, func(cp *controlPlane) time.Duration { deleteAll(ctx, cp, ids); return 0 })
	claimCalls := cl.podCalls(ctx).since(calls, n)
	r1, p1 := sorted(one)
	sideBySide(add, "(r) HTTP warm pool claim -> first result, one at a time", "p50 < 100 ms", r1, p1)
	if pods != nil {
		add(row{name: "    kube API calls on Pods per claim, refill and deletion included", vs: claimCalls})
	}

	var par [2]samples
	for round := range *kubeRounds {
		for j, cp := range []*controlPlane{runc, pods} {
			if cp == nil {
				continue
			}
			waitPoolFull(cp)
			ids := make([]string, kubePool)
			lat := make(samples, kubePool)
			var wg sync.WaitGroup
			for k := range kubePool {
				ids[k] = fmt.Sprintf("par-%d-%d", round, k)
				wg.Add(1)
				go func() {
					defer wg.Done()
					lat[k] = firstResult(ctx, cp, ids[k])
				}()
			}
			wg.Wait()
			par[j] = append(par[j], lat...)
			deleteAll(ctx, cp, ids)
		}
	}
	r20, p20 := sorted(par)
	sideBySide(add, fmt.Sprintf("    same, %d claims at once (%d rounds)", kubePool, *kubeRounds), "", r20, p20)
}

// benchKubeCold (s) creates sessions without a pool: create -> first
// result, Pod scheduling and image start included.
func benchKubeCold(ctx context.Context, runc, pods *controlPlane, add func(row)) {
	var cold [2]samples
	for i := range *httpCreates {
		id := fmt.Sprintf("cold-%d", i)
		both(runc, pods, &cold, func(cp *controlPlane) time.Duration {
			d := firstResult(ctx, cp, id)
			deleteAll(ctx, cp, []string{id})
			return d
		})
	}
	r, p := sorted(cold)
	sideBySide(add, "(s) HTTP cold create -> first result (python, no pool)", "", r, p)
}

// benchKubeRoundTrip (t) is the paced execution round trip, then (u) an
// upload of 50 MB and its download in the same session.
func benchKubeRoundTrip(ctx context.Context, cl *benchCluster, runc, pods *controlPlane, add func(row)) {
	both(runc, pods, &[2]samples{}, func(cp *controlPlane) time.Duration {
		firstResult(ctx, cp, "rt")
		for range 20 {
			mustExec(ctx, cp.c, "rt", "print(1)")
		}
		return 0
	})
	var trip [2]samples
	calls := cl.podCalls(ctx)
	for range *rounds {
		both(runc, pods, &trip, func(cp *controlPlane) time.Duration {
			time.Sleep(*pause)
			t0 := time.Now()
			mustExec(ctx, cp.c, "rt", "print(1)")
			return time.Since(t0)
		})
	}
	tripCalls := cl.podCalls(ctx).since(calls, *rounds)
	r, p := sorted(trip)
	sideBySide(add, fmt.Sprintf("(t) HTTP round trip print(1), ?wait=true, %v apart", *pause), "kube/runc p50 < 1.5x", r, p)
	if pods != nil {
		add(row{name: "    kube API calls on Pods per execution", vs: tripCalls})
	}

	const mb = 50
	data := bytes.Repeat([]byte("0123456789abcdef"), mb<<16)
	var up, down [2]samples
	for range 5 {
		both(runc, pods, &up, func(cp *controlPlane) time.Duration {
			t0 := time.Now()
			if _, err := cp.c.Upload(ctx, "rt", client.UploadOptions{}, client.UploadFile{Name: "up.bin", Reader: bytes.NewReader(data)}); err != nil {
				log.Fatal(err)
			}
			return time.Since(t0)
		})
		both(runc, pods, &down, func(cp *controlPlane) time.Duration {
			t0 := time.Now()
			n, err := cp.c.Download(ctx, "rt", "up.bin", io.Discard)
			if err != nil || n != int64(len(data)) {
				log.Fatalf("download: %d of %d bytes: %v", n, len(data), err)
			}
			return time.Since(t0)
		})
	}
	both(runc, pods, &[2]samples{}, func(cp *controlPlane) time.Duration { deleteAll(ctx, cp, []string{"rt"}); return 0 })
	ru, pu := sorted(up)
	sideBySide(add, fmt.Sprintf("(u) HTTP upload %d MB", mb), "< 0.5 s", ru, pu)
	rd, pd := sorted(down)
	sideBySide(add, fmt.Sprintf("    HTTP download the %d MB", mb), "", rd, pd)
}

// benchKubeLifecycle (v) hibernates a session with 100 MB in its
// workspace (as (k) does: one 50 MB file and fifty of 1 MB, random) and
// restores it, three times; then hibernates it once more and runs code,
// which restores it into a new sandbox.
func benchKubeLifecycle(ctx context.Context, runc, pods *controlPlane, add func(row), label string) {
	const fill = `
import os
os.makedirs("/workspace/data", exist_ok=True)
open("/workspace/data/big.bin", "wb").write(os.urandom(50 << 20))
for i in range(50):
    open("/workspace/data/part%02d.bin" % i, "wb").write(os.urandom(1 << 20))
`
	both(runc, pods, &[2]samples{}, func(cp *controlPlane) time.Duration {
		firstResult(ctx, cp, "life")
		mustExec(ctx, cp.c, "life", fill)
		return 0
	})
	var first, hib, restore [2]samples
	for k := range 3 {
		h := &hib
		if k == 0 {
			h = &first
		}
		both(runc, pods, h, func(cp *controlPlane) time.Duration {
			t0 := time.Now()
			if _, err := cp.c.HibernateSession(ctx, "life"); err != nil {
				log.Fatal(err)
			}
			return time.Since(t0)
		})
		both(runc, pods, &restore, func(cp *controlPlane) time.Duration {
			t0 := time.Now()
			if l, err := cp.c.ListFiles(ctx, "life", client.ListFilesOptions{Path: "data"}); err != nil || len(l.Files) != 51 {
				log.Fatalf("restoring: %v, %+v", err, l)
			}
			return time.Since(t0)
		})
	}
	var exec [2]samples
	both(runc, pods, &exec, func(cp *controlPlane) time.Duration {
		if _, err := cp.c.HibernateSession(ctx, "life"); err != nil {
			log.Fatal(err)
		}
		t0 := time.Now()
		mustExec(ctx, cp.c, "life", "import os\nprint(len(os.listdir('/workspace/data')))")
		return time.Since(t0)
	})
	both(runc, pods, &[2]samples{}, func(cp *controlPlane) time.Duration { deleteAll(ctx, cp, []string{"life"}); return 0 })
	rf, pf := sorted(first)
	sideBySide(add, "(v) HTTP hibernate a 100 MB workspace, first time"+label, "", rf, pf)
	rh, ph := sorted(hib)
	sideBySide(add, "    HTTP hibernate again, content unchanged"+label, "", rh, ph)
	rr, pr := sorted(restore)
	sideBySide(add, "    HTTP restore it (file call; 3 times)"+label, "< 1 s", rr, pr)
	re, pe := sorted(exec)
	sideBySide(add, "    execute on the hibernated session (restore + new sandbox)"+label, "", re, pe)
}

// benchKubeConcurrent (w) creates -kube-sessions sessions and runs one
// execution in each, all at once (runConcurrent, as (g)): runc's server
// first, then the Pods'.
func benchKubeConcurrent(ctx context.Context, runc, pods *controlPlane, add func(row)) {
	n := *kubeSessions
	var res [2]*concurrentRun
	for j, cp := range []*controlPlane{runc, pods} {
		if cp != nil {
			r := runConcurrent(ctx, cp.c, n)
			res[j] = &r
		}
	}
	for j, what := range []string{fmt.Sprintf("(w) %d sessions created and run at once: runc", n), "    same, kubernetes Pods"} {
		r := res[j]
		if r == nil {
			continue
		}
		vs := fmt.Sprintf("%d errors", len(r.errs))
		if j == 1 {
			vs += fmt.Sprintf("; kube/runc wall %.2fx", float64(r.total)/float64(res[0].total))
			if len(r.errs) > 0 {
				vs += "; first: " + firstLine(r.errs[0])
			}
		}
		add(row{name: what + ", all done (wall)", p50: r.total, goal: "0 errors", vs: vs})
		add(row{name: "        submit -> result per session", p50: r.lat.p(50), p99: r.lat.p(99)})
		add(row{name: fmt.Sprintf("        delete the %d at once", n), p50: r.del})
	}
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

// apiCalls counts the API server's requests on Pods by verb, from its
// metrics (apiserver_request_total): what the runtime asks of the cluster
// per operation. The count is the whole cluster's, whoever else calls.
type apiCalls map[string]float64

// podCalls reads the counts; nil without a cluster or without metrics.
func (cl *benchCluster) podCalls(ctx context.Context) apiCalls {
	if cl == nil {
		return nil
	}
	raw, err := cl.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		log.Printf("the API server's metrics: %v", err)
		return nil
	}
	calls := apiCalls{}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="pods"`) {
			continue
		}
		labels, value, ok := strings.Cut(strings.TrimPrefix(line, "apiserver_request_total{"), "} ")
		if !ok {
			continue
		}
		var verb, sub string
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "verb":
				verb = strings.Trim(v, `"`)
			case "subresource":
				sub = strings.Trim(v, `"`)
			}
		}
		if sub != "" {
			verb += " " + sub
		}
		var n float64
		fmt.Sscan(value, &n)
		calls[verb] += n
	}
	return calls
}

// since is the calls made after before, per operation of n, by verb.
func (a apiCalls) since(before apiCalls, n int) string {
	if a == nil || before == nil || n == 0 {
		return ""
	}
	var parts []string
	verbs := make([]string, 0, len(a))
	for v := range a {
		verbs = append(verbs, v)
	}
	sort.Strings(verbs)
	for _, v := range verbs {
		if d := a[v] - before[v]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s %.1f", v, d/float64(n)))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
