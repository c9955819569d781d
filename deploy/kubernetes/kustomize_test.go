// Package kubernetes holds the manifests' tests: they build the
// kustomizations with kubectl's own kustomize and check what must hold
// of every object, so that an edit cannot quietly give sbx cluster-wide
// rights, a privileged container or a sandbox a way out.
package kubernetes

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

const (
	controlNS = "sbx"
	sandboxNS = "sbx-sandboxes"
)

// The images scripts/kube-images.sh provides under fixed tags.
var providedImages = []string{"sbx/sbx:dev", "sbx/postgres:dev", "sbx/minio:dev"}

// kubectl finds kubectl: $KUBECTL, PATH, then what scripts/kube.sh builds.
func kubectl(t *testing.T) string {
	t.Helper()
	if k := os.Getenv("KUBECTL"); k != "" {
		return k
	}
	if k, err := exec.LookPath("kubectl"); err == nil {
		return k
	}
	if m, _ := filepath.Glob("/var/lib/sbx-kube/bin/*/kubectl"); len(m) > 0 {
		return m[0]
	}
	t.Skip("no kubectl (set KUBECTL, or run scripts/kube.sh up, which builds one): the manifests are not checked")
	return ""
}

type object struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	raw []byte
}

func (o object) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(o.raw, v); err != nil {
		t.Fatalf("%s %s: %v", o.Kind, o.Metadata.Name, err)
	}
}

// build runs kubectl kustomize on dir and returns its objects.
func build(t *testing.T, dir string) []object {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(kubectl(t), "kustomize", dir)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl kustomize %s: %v: %s", dir, err, errb.String())
	}
	dec := yaml.NewYAMLOrJSONDecoder(&out, 4096)
	var objs []object
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		o := object{raw: raw}
		if err := json.Unmarshal(raw, &o); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		t.Fatalf("kubectl kustomize %s: no objects", dir)
	}
	return objs
}

func find(objs []object, kind, ns, name string) (object, bool) {
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Namespace == ns && o.Metadata.Name == name {
			return o, true
		}
	}
	return object{}, false
}

func mustFind(t *testing.T, objs []object, kind, ns, name string) object {
	t.Helper()
	o, ok := find(objs, kind, ns, name)
	if !ok {
		t.Fatalf("no %s %s/%s", kind, ns, name)
	}
	return o
}

// podTemplates returns every Pod template with what it belongs to.
func podTemplates(t *testing.T, objs []object) map[string]corev1.PodTemplateSpec {
	out := map[string]corev1.PodTemplateSpec{}
	for _, o := range objs {
		switch o.Kind {
		case "Deployment":
			var d appsv1.Deployment
			o.decode(t, &d)
			out["Deployment "+d.Name] = d.Spec.Template
		case "StatefulSet":
			var s appsv1.StatefulSet
			o.decode(t, &s)
			out["StatefulSet "+s.Name] = s.Spec.Template
		case "DaemonSet", "Job", "CronJob", "Pod", "ReplicaSet":
			t.Errorf("%s %s: a kind these checks do not cover; add it", o.Kind, o.Metadata.Name)
		}
	}
	return out
}

// checkCommon holds for both kustomizations.
func checkCommon(t *testing.T, objs []object) {
	for _, o := range objs {
		switch o.Kind {
		case "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
			"CustomResourceDefinition", "PersistentVolume", "PodSecurityPolicy", "StorageClass":
			t.Errorf("%s %s: cluster-wide objects are not sbx's to make", o.Kind, o.Metadata.Name)
		case "Namespace":
			if o.Metadata.Name != controlNS && o.Metadata.Name != sandboxNS {
				t.Errorf("namespace %s: not one of sbx's", o.Metadata.Name)
			}
		default:
			if o.Metadata.Namespace != controlNS && o.Metadata.Namespace != sandboxNS {
				t.Errorf("%s %s: namespace %q, want sbx or sbx-sandboxes", o.Kind, o.Metadata.Name, o.Metadata.Namespace)
			}
		}
		if o.Kind == "Role" {
			var r rbacv1.Role
			o.decode(t, &r)
			checkRole(t, r)
		}
		if o.Kind == "RoleBinding" {
			var b rbacv1.RoleBinding
			o.decode(t, &b)
			if b.RoleRef.Kind != "Role" {
				t.Errorf("RoleBinding %s/%s binds a %s: only the namespace's own Roles", b.Namespace, b.Name, b.RoleRef.Kind)
			}
			for _, s := range b.Subjects {
				if s.Kind != "ServiceAccount" || s.Name != "sbx" || s.Namespace != controlNS {
					t.Errorf("RoleBinding %s/%s: subject %+v, want the ServiceAccount sbx/sbx alone", b.Namespace, b.Name, s)
				}
			}
		}
	}

	// PSA: the control plane restricted, sandboxes at least baseline.
	for ns, level := range map[string]string{controlNS: "restricted", sandboxNS: "baseline"} {
		o := mustFind(t, objs, "Namespace", "", ns)
		if got := o.Metadata.Labels["pod-security.kubernetes.io/enforce"]; got != level {
			t.Errorf("namespace %s: pod-security enforce %q, want %q", ns, got, level)
		}
	}

	for owner, pt := range podTemplates(t, objs) {
		checkPod(t, owner, pt.Spec)
	}

	var d appsv1.Deployment
	mustFind(t, objs, "Deployment", controlNS, "sbx").decode(t, &d)
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("Deployment sbx: replicas %v, want 2 or more", ptrString(d.Spec.Replicas))
	}
	if d.Spec.Template.Spec.ServiceAccountName != "sbx" {
		t.Errorf("Deployment sbx: service account %q", d.Spec.Template.Spec.ServiceAccountName)
	}
	c := d.Spec.Template.Spec.Containers[0]
	probe := func(what string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path {
			t.Errorf("Deployment sbx: %s probe %+v, want GET %s", what, p, path)
		}
	}
	probe("readiness", c.ReadinessProbe, "/readyz")
	probe("liveness", c.LivenessProbe, "/healthz")
	// A replica deleted keeps serving until kube-proxy no longer sends it
	// new connections, then drains (sbx's shutdown waits up to 10 s for
	// the requests under way), all within the grace period.
	const drain = 10
	switch grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds; {
	case c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 3:
		t.Errorf("Deployment sbx: lifecycle %+v, want a preStop sleep of 3 s or more, so that a replica deleted leaves the Service before it stops listening", c.Lifecycle)
	case grace == nil || *grace < c.Lifecycle.PreStop.Sleep.Seconds+drain:
		t.Errorf("Deployment sbx: terminationGracePeriodSeconds %v, want the preStop sleep and %d s of drain", ptrString64(grace), drain)
	}
	for _, want := range []string{"serve", "--addr=0.0.0.0:7070", "--runtime=kubernetes", "--sandbox-namespace=" + sandboxNS, "--prebuild="} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("Deployment sbx: args %q lack %q", c.Args, want)
		}
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["SBX_API_KEYS"]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
		e.ValueFrom.SecretKeyRef.Name != "sbx-api-keys" || e.ValueFrom.SecretKeyRef.Key != "SBX_API_KEYS" ||
		(e.ValueFrom.SecretKeyRef.Optional != nil && *e.ValueFrom.SecretKeyRef.Optional) {
		t.Errorf("Deployment sbx: SBX_API_KEYS %+v, want the required key SBX_API_KEYS of Secret sbx-api-keys", e)
	}
	if e := env["POD_NAMESPACE"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("Deployment sbx: POD_NAMESPACE %+v, want the downward API's metadata.namespace", e)
	}
	for _, name := range []string{"SBX_STORE", "SBX_BLOB"} {
		if _, ok := env[name]; !ok {
			t.Errorf("Deployment sbx: no %s", name)
		}
	}
	for _, e := range c.Env {
		if strings.Contains(strings.ToUpper(e.Name), "KEY") && e.Value != "" {
			t.Errorf("Deployment sbx: %s is a literal, want it from a Secret", e.Name)
		}
	}

	var svc corev1.Service
	mustFind(t, objs, "Service", controlNS, "sbx").decode(t, &svc)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 7070 || svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		t.Errorf("Service sbx: %+v, want a ClusterIP on port 7070", svc.Spec)
	}
	var pdb policyv1.PodDisruptionBudget
	mustFind(t, objs, "PodDisruptionBudget", controlNS, "sbx").decode(t, &pdb)
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 ||
		pdb.Spec.Selector == nil || pdb.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "sbx" {
		t.Errorf("PodDisruptionBudget sbx: %+v, want minAvailable 1 of the sbx Pods", pdb.Spec)
	}

	// Sandboxes: everything denied both ways, the executor's port open
	// to the sbx Pods alone.
	var deny networkingv1.NetworkPolicy
	mustFind(t, objs, "NetworkPolicy", sandboxNS, "default-deny").decode(t, &deny)
	if len(deny.Spec.PodSelector.MatchLabels)+len(deny.Spec.PodSelector.MatchExpressions) != 0 ||
		!slices.Contains(deny.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(deny.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) ||
		len(deny.Spec.Ingress)+len(deny.Spec.Egress) != 0 {
		t.Errorf("NetworkPolicy default-deny: %+v, want every Pod, no ingress, no egress", deny.Spec)
	}
	for _, o := range objs {
		if o.Kind != "NetworkPolicy" {
			continue
		}
		var np networkingv1.NetworkPolicy
		o.decode(t, &np)
		if np.Namespace == sandboxNS && len(np.Spec.Egress) > 0 {
			t.Errorf("NetworkPolicy %s: lets sandboxes out", np.Name)
		}
		if np.Namespace == sandboxNS || np.Name == "postgres" || np.Name == "minio" {
			checkOnlyFromSbx(t, np)
		}
	}
	mustFind(t, objs, "NetworkPolicy", sandboxNS, "executor-from-sbx")
	mustFind(t, objs, "ResourceQuota", sandboxNS, "sandboxes")
	mustFind(t, objs, "LimitRange", sandboxNS, "sandboxes")
}

func checkRole(t *testing.T, r rbacv1.Role) {
	allowed := map[string]map[string][]string{ // namespace -> resource -> verbs
		sandboxNS: {"pods": {"get", "list", "watch", "create", "delete", "patch"}, "events": {"list", "watch"}},
		controlNS: {"secrets": {"get", "create"}},
	}[r.Namespace]
	for _, rule := range r.Rules {
		for _, res := range rule.Resources {
			ok := allowed[res]
			if ok == nil {
				t.Errorf("Role %s/%s: resource %q is not one sbx needs there", r.Namespace, r.Name, res)
				continue
			}
			for _, v := range rule.Verbs {
				if !slices.Contains(ok, v) {
					t.Errorf("Role %s/%s: verb %q on %q", r.Namespace, r.Name, v, res)
				}
			}
			if res == "secrets" && slices.Contains(rule.Verbs, "get") && !slices.Equal(rule.ResourceNames, []string{"sbx-executor-key"}) {
				t.Errorf("Role %s/%s: get on secrets %q, want sbx-executor-key alone", r.Namespace, r.Name, rule.ResourceNames)
			}
		}
	}
}

func checkPod(t *testing.T, owner string, spec corev1.PodSpec) {
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		t.Errorf("%s: shares a host namespace", owner)
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("%s: hostPath volume %s", owner, v.Name)
		}
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("%s: want runAsNonRoot and a non-root runAsUser", owner)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: want the RuntimeDefault seccomp profile", owner)
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		name := owner + " container " + c.Name
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("%s: no securityContext", name)
			continue
		case sc.Privileged != nil && *sc.Privileged:
			t.Errorf("%s: privileged", name)
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("%s: allowPrivilegeEscalation is not false", name)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("%s: root filesystem is writable", name)
		case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
			t.Errorf("%s: capabilities %+v, want ALL dropped and none added", name, sc.Capabilities)
		case sc.RunAsUser != nil && *sc.RunAsUser == 0:
			t.Errorf("%s: runs as root", name)
		}
		if !slices.Contains(providedImages, c.Image) {
			t.Errorf("%s: image %q is none of %q, the images scripts/kube-images.sh provides", name, c.Image, providedImages)
		}
		// An unqualified sbx/... is docker.io's: a node without the image
		// must not pull whatever is published there under that name.
		if c.ImagePullPolicy != corev1.PullNever {
			t.Errorf("%s: imagePullPolicy %q, want Never", name, c.ImagePullPolicy)
		}
		if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
			t.Errorf("%s: no memory limit", name)
		}
	}
}

// checkOnlyFromSbx: every ingress rule of np admits the sbx Pods and
// nothing else.
func checkOnlyFromSbx(t *testing.T, np networkingv1.NetworkPolicy) {
	for _, rule := range np.Spec.Ingress {
		if len(rule.From) == 0 {
			t.Errorf("NetworkPolicy %s/%s: an ingress rule from anywhere", np.Namespace, np.Name)
		}
		for _, peer := range rule.From {
			fromSbxNS := np.Namespace == controlNS && peer.NamespaceSelector == nil ||
				peer.NamespaceSelector != nil && len(peer.NamespaceSelector.MatchExpressions) == 0 &&
					len(peer.NamespaceSelector.MatchLabels) == 1 && peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == controlNS
			sbxPods := peer.PodSelector != nil && len(peer.PodSelector.MatchExpressions) == 0 &&
				len(peer.PodSelector.MatchLabels) == 1 && peer.PodSelector.MatchLabels["app.kubernetes.io/name"] == "sbx"
			if peer.IPBlock != nil || !fromSbxNS || !sbxPods {
				t.Errorf("NetworkPolicy %s/%s: ingress from %+v, want the sbx Pods alone", np.Namespace, np.Name, peer)
			}
		}
	}
}

func TestBase(t *testing.T) {
	objs := build(t, ".")
	checkCommon(t, objs)
	for _, name := range []string{"postgres", "minio"} {
		mustFind(t, objs, "StatefulSet", controlNS, name)
		mustFind(t, objs, "Service", controlNS, name)
		var np networkingv1.NetworkPolicy
		mustFind(t, objs, "NetworkPolicy", controlNS, name).decode(t, &np)
		if len(np.Spec.Ingress) == 0 || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || len(np.Spec.Egress) != 0 {
			t.Errorf("NetworkPolicy %s: %+v, want ingress from sbx only and no egress", name, np.Spec)
		}
	}
}

func TestExternalOverlay(t *testing.T) {
	objs := build(t, "overlays/external")
	checkCommon(t, objs)
	for _, o := range objs {
		if o.Metadata.Name == "postgres" || o.Metadata.Name == "minio" || strings.HasPrefix(o.Metadata.Name, "sbx-backing") {
			t.Errorf("%s %s: the external overlay keeps an in-cluster store", o.Kind, o.Metadata.Name)
		}
	}
	var d appsv1.Deployment
	mustFind(t, objs, "Deployment", controlNS, "sbx").decode(t, &d)
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if (e.Name == "SBX_STORE" || e.Name == "SBX_BLOB") && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "sbx-external") {
			t.Errorf("%s: %+v, want it from Secret sbx-external", e.Name, e)
		}
	}
}

// TestImagesAreProvided: the tags the manifests name are the ones
// scripts/kube-images.sh writes.
func TestImagesAreProvided(t *testing.T) {
	b, err := os.ReadFile("../../scripts/kube-images.sh")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.Contains(s, "\nTAG=dev\n") {
		t.Fatal("scripts/kube-images.sh: no TAG=dev")
	}
	for _, img := range providedImages {
		repo, _, _ := strings.Cut(img, ":")
		if !strings.Contains(s, `"`+repo+`:$TAG"`) {
			t.Errorf("scripts/kube-images.sh does not build %s", img)
		}
	}
}

func ptrString64(p *int64) string {
	if p == nil {
		return "unset"
	}
	return strconv.FormatInt(*p, 10)
}

func ptrString(p *int32) string {
	if p == nil {
		return "unset"
	}
	return strconv.Itoa(int(*p))
}
