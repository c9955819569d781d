// Package kubetest gives integration tests a real Kubernetes cluster: the
// one scripts/kube.sh runs on this machine (or SBX_KUBECONFIG's), a
// namespace of their own, and the template images their sandbox Pods run,
// built from this tree and provided on the node.
//
// Without a cluster the tests skip, saying how to start one, except under
// CI (CI=true), where a missing cluster is a failure: CI starts one.
package kubetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sbx-sandbox/sbx/internal/image"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// Root is where scripts/kube.sh keeps the test cluster.
const Root = "/var/lib/sbx-kube"

// Kubeconfig is the test cluster's admin kubeconfig: SBX_KUBECONFIG, else
// scripts/kube.sh's.
func Kubeconfig() string {
	if k := os.Getenv("SBX_KUBECONFIG"); k != "" {
		return k
	}
	return filepath.Join(Root, "kubeconfig")
}

// Cluster is a test's view of the cluster.
type Cluster struct {
	Client     kubernetes.Interface
	Kubeconfig string
	// Namespace is this test process's own; it goes when the test ends.
	Namespace string
}

// New returns the cluster with a new namespace for t, or skips t when
// there is no cluster (fails under CI).
func New(t testing.TB) *Cluster {
	t.Helper()
	testenv.RequiresRoot(t)
	kc := Kubeconfig()
	if _, err := os.Stat(kc); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no Kubernetes cluster (%s): CI runs scripts/kube.sh up first", kc)
		}
		t.Skipf("no Kubernetes cluster (%s): scripts/kube.sh up starts one", kc)
	}
	client, err := kube.Connect(kc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := fmt.Sprintf("sbx-test-%d-%d", os.Getpid(), nsSeq.Add(1))
	_, err = client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "sbx-tests"},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		zero := int64(0)
		// Pods at once (no grace), then the namespace.
		client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		if err := client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Logf("delete namespace %s: %v", ns, err)
		}
		kube.CloseIdle(client)
	})
	return &Cluster{Client: client, Kubeconfig: kc, Namespace: ns}
}

var nsSeq atomic.Int64

var (
	imageMu   sync.Mutex
	provided  = map[string]string{}
	provideEr = map[string]error{}
)

// Image returns the image reference of built-in template name (the
// runtime.Spec.Image of its sandboxes), built (once per machine) and
// exported as an image with this tree's executor, and imported into the
// node (once per test process) under that reference and Suffix: what a
// sandbox Pod of that template runs.
func Image(t testing.TB, name string) string {
	t.Helper()
	env := testenv.New(t)
	env.Rootfs(t, name) // built, or skip
	imageMu.Lock()
	defer imageMu.Unlock()
	if ref, ok := provided[name]; ok {
		return ref
	}
	if err, ok := provideEr[name]; ok {
		t.Fatal(err)
	}
	ref, err := provide(name, env.Executor)
	if err != nil {
		provideEr[name] = err
		t.Fatal(err)
	}
	provided[name] = ref
	return ref
}

func provide(name, executor string) (string, error) {
	spec, _ := template.Builtin(name)
	store := template.NewStore(testenv.TemplateDir())
	tmpl, ok := store.Lookup(spec)
	if !ok {
		return "", fmt.Errorf("template %s is not built", name)
	}
	ref := tmpl.Image()
	suffix, err := image.ExecutorSuffix(executor)
	if err != nil {
		return "", err
	}
	tag, err := image.ParseTag(ref + suffix)
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp("", "sbx-kube-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img, err := image.Template(ctx, tmp, store, tmpl, executor)
	if err != nil {
		return "", fmt.Errorf("image of %s: %w", name, err)
	}
	defer img.Close()
	file := filepath.Join(tmp, "image.tar")
	if err := image.WriteArchiveFile(file, tag, img); err != nil {
		return "", err
	}
	if out, err := exec.CommandContext(ctx, kubeScript(), "import", file).CombinedOutput(); err != nil {
		return "", fmt.Errorf("scripts/kube.sh import: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return ref, nil
}

// kubeScript is scripts/kube.sh of this tree.
func kubeScript() string {
	mod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "scripts/kube.sh"
	}
	return filepath.Join(filepath.Dir(strings.TrimSpace(string(mod))), "scripts", "kube.sh")
}

// Exec runs argv in the sandbox container of pod, as kubectl exec does:
// as the container's root with the container's capabilities.
func (c *Cluster) Exec(ctx context.Context, pod string, argv ...string) ([]byte, error) {
	args := append([]string{"--kubeconfig", c.Kubeconfig, "-n", c.Namespace, "exec", pod, "-c", "sandbox", "--"}, argv...)
	return exec.CommandContext(ctx, filepath.Join(Root, "bin", "kubectl"), args...).CombinedOutput()
}

// Suffix is the tag suffix of the images Image provides
// (kube.Config.ImageSuffix).
func Suffix(t testing.TB) string {
	t.Helper()
	s, err := image.ExecutorSuffix(testenv.New(t).Executor)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
