package kube

import (
	"archive/tar"
	"bytes"
	"errors"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sbx-sandbox/sbx/errdefs"
	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
)

func newTestRuntime(t *testing.T) *Runtime {
	t.Helper()
	_, key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Client: fake.NewClientset(), Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestPodName(t *testing.T) {
	seen := map[string]string{}
	for _, id := range []string{
		"a", "abc-123", "ABC", "a_b", "x-1", "x-" + strings.Repeat("0", 32),
		strings.Repeat("a", 59), strings.Repeat("a", 60), strings.Repeat("Z", 64), "a-", "0",
	} {
		name := podName(id)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 || len(name) > 63 {
			t.Errorf("podName(%q) = %q: not a valid pod name: %v", id, name, errs)
		}
		if other, ok := seen[name]; ok {
			t.Errorf("podName(%q) = podName(%q) = %q", id, other, name)
		}
		seen[name] = id
	}
	if got := podName("sess-1"); got != "sbx-sess-1" {
		t.Errorf("a plain id keeps its name: got %q", got)
	}
}

// TestPodIsolation checks the sandbox Pod's spec against the isolation
// the issue asks of it: whatever else changes, these hold.
func TestPodIsolation(t *testing.T) {
	r := newTestRuntime(t)
	pod, err := r.podSpec(runtime.Spec{
		ID: "s1", Image: "sbx/python:abc", Volume: "t/s1",
		Env: map[string]string{"A": "1"}, Labels: map[string]string{"session": "s1"},
	}, "sbx/python:abc", runtime.Resources{CPU: 2, MemoryMB: 256, PIDs: 64, TmpMB: 32, DiskMB: 100})
	if err != nil {
		t.Fatal(err)
	}
	ps := pod.Spec
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Error("the service account token is mounted")
	}
	if ps.EnableServiceLinks == nil || *ps.EnableServiceLinks {
		t.Error("service links are on")
	}
	if ps.HostNetwork || ps.HostPID || ps.HostIPC {
		t.Error("a host namespace is shared")
	}
	if ps.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restart policy %s", ps.RestartPolicy)
	}
	if len(ps.Containers) != 1 || len(ps.InitContainers) != 0 {
		t.Fatalf("containers %d, init %d", len(ps.Containers), len(ps.InitContainers))
	}
	c := ps.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("privileged or privilege escalation allowed")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the root filesystem is writable")
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("no seccomp profile")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Error("capabilities are not all dropped first")
	}
	for _, add := range sc.Capabilities.Add {
		switch add {
		case "CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETPCAP", "SETUID":
		default:
			t.Errorf("capability %s added", add)
		}
	}
	lim := c.Resources.Limits
	if lim.Cpu().MilliValue() != 2000 || lim.Memory().Value() != 256<<20 {
		t.Errorf("limits %v", lim)
	}
	if req := c.Resources.Requests; req.Cpu().Cmp(*lim.Cpu()) > 0 || req.Memory().Cmp(*lim.Memory()) > 0 {
		t.Errorf("requests %v above limits %v", req, lim)
	}
	for _, v := range ps.Volumes {
		if v.HostPath != nil {
			t.Errorf("volume %s is a host path", v.Name)
		}
		if v.EmptyDir != nil && v.EmptyDir.SizeLimit == nil {
			t.Errorf("volume %s has no size limit", v.Name)
		}
	}
	for _, e := range c.Env {
		if e.Name == "A" {
			t.Error("the tenant's variables are in the executor's environment")
		}
	}
	if ps.DNSPolicy != corev1.DNSNone {
		t.Errorf("DNS policy %s: the cluster's resolver is reachable by name", ps.DNSPolicy)
	}
	// What Info reads back is what Create was given.
	info, ok := r.info(pod)
	if !ok || info.ID != "s1" || info.Image != "sbx/python:abc" || info.Volume != "t/s1" || info.Labels["session"] != "s1" || info.Resources.CPU != 2 {
		t.Errorf("info %+v, %v", info, ok)
	}
}

func TestPodState(t *testing.T) {
	p := &corev1.Pod{}
	if podState(p) != runtime.StateCreating {
		t.Error("pending pod not creating")
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName}}
	if podState(p) != runtime.StateRunning {
		t.Error("running pod not running")
	}
	p.Status.ContainerStatuses[0].State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1}
	if podState(p) != runtime.StateStopped {
		t.Error("pod whose executor ended not stopped")
	}
	if failure(p) == nil {
		t.Error("no failure for an ended executor")
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"a": true, "A_b-1": true, strings.Repeat("a", 64): true,
		"": false, "-a": false, "_a": false, "a/b": false, "a.b": false, strings.Repeat("a", 65): false, "é": false,
	} {
		if validID(id) != want {
			t.Errorf("validID(%q) = %v", id, !want)
		}
	}
}

// TestLoadSigner: two replicas starting at once end up with one key.
func TestLoadSigner(t *testing.T) {
	c := fake.NewClientset()
	a, err := LoadSigner(t.Context(), c, "ns")
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadSigner(t.Context(), c, "ns")
	if err != nil {
		t.Fatal(err)
	}
	if !a.PublicKey().Equal(b.PublicKey()) {
		t.Fatal("a second replica made a key of its own")
	}
}

// TestCheckpointsOfAVolumeSerialise: a volume's checkpoints in one
// process run one at a time, others' alongside, and nothing is kept of a
// volume none waits on.
func TestCheckpointsOfAVolumeSerialise(t *testing.T) {
	v := &Volumes{saving: map[string]*saving{}}
	done := v.serialise("t/a")
	other := v.serialise("t/b") // another volume: not held up
	got := make(chan struct{})
	go func() {
		defer close(got)
		v.serialise("t/a")()
	}()
	for waiting := false; !waiting; {
		v.mu.Lock()
		waiting = v.saving["t/a"].waiters == 2
		v.mu.Unlock()
		goruntime.Gosched()
	}
	select {
	case <-got:
		t.Fatal("a second checkpoint of one volume ran alongside the first")
	default:
	}
	done()
	<-got
	other()
	if len(v.saving) != 0 {
		t.Errorf("kept %d volumes' entries", len(v.saving))
	}
}

func TestArchiveBound(t *testing.T) {
	if b := archiveBound(100); b < 100<<20 || b > 200<<20 {
		t.Errorf("archiveBound(100 MiB) = %d", b)
	}
	if archiveBound(0) != archiveBound(runtime.DefaultResources.DiskMB) {
		t.Error("no disk: not the default's bound")
	}
}

// TestHolder: by the volume's name, the holder is the newest running
// Pod labelled with it (a start a dead replica left may run beside the
// session's until the leader collects it); by the sandbox the session
// names, that sandbox, or ErrUnavailable once it holds it no more.
func TestHolder(t *testing.T) {
	r := newTestRuntime(t)
	v := r.Volumes(nil, 0)
	ctx := t.Context()
	run := func(id string, created time.Time) {
		t.Helper()
		pod, err := r.podSpec(runtime.Spec{ID: id, Image: "sbx/python:abc", Volume: "t/s"}, "img", runtime.DefaultResources)
		if err != nil {
			t.Fatal(err)
		}
		pod.CreationTimestamp = metav1.NewTime(created)
		pod.Status.Phase = corev1.PodRunning
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName}}
		if _, err := r.pods().Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	holder := func() string {
		t.Helper()
		info, err := v.holderInfo(ctx, "t/s")
		if err != nil {
			t.Fatal(err)
		}
		if info == nil {
			return ""
		}
		return info.ID
	}
	if h := holder(); h != "" {
		t.Fatalf("no Pod, holder %q", h)
	}
	now := time.Now()
	run("b", now)
	run("a", now.Add(-time.Minute)) // older: a dead replica's start
	if h := holder(); h != "b" {
		t.Fatalf("holder %q, want the newest, b", h)
	}
	if info, err := v.in(ctx, "t/s", "a"); err != nil || info.ID != "a" {
		t.Errorf("in a: %+v, %v", info, err)
	}
	if _, err := v.in(ctx, "t/s", "c"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("in a sandbox that does not exist: %v, want unavailable", err)
	}
	if _, err := v.in(ctx, "t/other", "b"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("in a sandbox of another volume: %v, want unavailable", err)
	}
	if err := r.pods().Delete(ctx, podName("b"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if h := holder(); h != "a" {
		t.Fatalf("after b went: holder %q, want a", h)
	}
	if _, err := v.in(ctx, "t/s", "b"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("in a sandbox gone: %v, want unavailable", err)
	}
}

// TestSaveWithoutPod: a workspace no Pod holds saves as its checkpoint:
// the empty tree of a new one (a session hibernated before its first
// call), and after a hibernation (the Pod gone, the workspace discarded)
// the files it had, however often it is saved again. An older save path
// once wrote the empty tree over a hibernated one.
func TestSaveWithoutPod(t *testing.T) {
	r := newTestRuntime(t)
	blobs, err := blobfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	snaps := snapshot.New(blobs, "snapshots", snapshot.Limits{})
	v := r.Volumes(snaps, 0)
	ctx := t.Context()
	if err := v.Create(ctx, "t/s", 0); err != nil {
		t.Fatal(err)
	}
	mf, _, err := v.Save(ctx, "t/s", "t/s/hibernated", nil)
	if err != nil {
		t.Fatalf("save of a new workspace: %v", err)
	}
	if mf.Files != 0 || mf.Dirs != 1 {
		t.Errorf("saved %d files, %d dirs; want the root alone", mf.Files, mf.Dirs)
	}
	// The files a Pod's last checkpoint had.
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "log.txt", Mode: 0o644, Size: 3, Uid: 1000, Gid: 1000, Typeflag: tar.TypeReg})
	tw.Write([]byte("abc"))
	tw.Close()
	if _, _, err := snaps.SaveArchive(ctx, &b, checkpointKey("t/s"), nil); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // hibernated, then hibernated again
		mf, _, err := v.Save(ctx, "t/s", "t/s/hibernated", nil)
		if err != nil || mf.Files != 1 {
			t.Fatalf("save %d without a Pod: %+v, %v; want the checkpoint's file", i, mf, err)
		}
		if err := v.Discard(ctx, "t/s"); err != nil {
			t.Fatal(err)
		}
	}
	if there, err := v.Exists(ctx, "t/s"); err != nil || !there {
		t.Errorf("exists after a discard: %v, %v", there, err)
	}
	if err := v.Remove(ctx, "t/s"); err != nil {
		t.Fatal(err)
	}
	if there, err := v.Exists(ctx, "t/s"); err != nil || there {
		t.Errorf("exists after a remove: %v, %v", there, err)
	}
}
