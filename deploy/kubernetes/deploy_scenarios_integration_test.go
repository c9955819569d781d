//go:build integration

package kubernetes

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/chat/chattest"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
)

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// testSessions: a session's executions (stateless, a context, bash) and
// files (upload, list, download whole and in part, delete, a file code
// wrote).
func (d *deployment) testSessions(t *testing.T) {
	c := d.client("acme", true)
	const sid = "files"
	createSession(t, c, sid)

	if x := run(t, c, sid, api.ExecuteRequest{Code: "y = 6 * 7\nprint(y)"}); x.Stdout != "42\n" {
		t.Errorf("print(6 * 7): stdout %q", x.Stdout)
	}
	if x := run(t, c, sid, api.ExecuteRequest{Code: "print('y' in globals())"}); x.Stdout != "False\n" {
		t.Errorf("an execution without a context sees the last one's variables: %q", x.Stdout)
	}
	run(t, c, sid, api.ExecuteRequest{Code: "counter = 41", ContextID: "ctx-1"})
	if x := run(t, c, sid, api.ExecuteRequest{Code: "counter += 1\nprint(counter)", ContextID: "ctx-1"}); x.Stdout != "42\n" {
		t.Errorf("a context lost its state: stdout %q", x.Stdout)
	}
	if x := run(t, c, sid, api.ExecuteRequest{Code: "echo $((6 * 7)) $(id -u)", Language: "bash"}); x.Stdout != "42 1000\n" {
		t.Errorf("bash: stdout %q", x.Stdout)
	}

	data := randomBytes(1<<20 + 123)
	notes := []byte("notes " + token())
	upload(t, c, sid, "data/blob.bin", data)
	upload(t, c, sid, "data/notes.txt", notes)
	list, err := c.ListFiles(callCtx(t), sid, client.ListFilesOptions{Path: "data"})
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int64{}
	for _, f := range list.Files {
		sizes[f.Name] = f.Size
	}
	if sizes["blob.bin"] != int64(len(data)) || sizes["notes.txt"] != int64(len(notes)) {
		t.Errorf("list data/: %+v", list.Files)
	}
	if got := download(t, c, sid, "data/blob.bin"); !bytes.Equal(got, data) {
		t.Errorf("download data/blob.bin: %d bytes, not the %d uploaded", len(got), len(data))
	}
	// A name without an extension: the server sniffs the type from the
	// file's start and reads it again.
	readme := []byte("no extension " + token())
	upload(t, c, sid, "data/README", readme)
	if got := download(t, c, sid, "data/README"); !bytes.Equal(got, readme) {
		t.Errorf("download data/README: %q, want %q", got, readme)
	}
	for _, r := range []struct{ off, n int64 }{{1000, 5000}, {int64(len(data)) - 10, 0}, {0, 1}} {
		rc, err := c.OpenFile(callCtx(t), sid, "data/blob.bin", r.off, r.n)
		if err != nil {
			t.Fatalf("range %d+%d: %v", r.off, r.n, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		end := int64(len(data))
		if r.n > 0 {
			end = r.off + r.n
		}
		if err != nil || !bytes.Equal(got, data[r.off:end]) {
			t.Errorf("range %d+%d: %d bytes (%v), not the file's", r.off, r.n, len(got), err)
		}
	}
	x := run(t, c, sid, api.ExecuteRequest{Code: "import hashlib\nreturn hashlib.sha256(open('/workspace/data/blob.bin', 'rb').read()).hexdigest()"})
	var sum string
	returned(t, x, &sum)
	if sum != sha256hex(data) {
		t.Errorf("code reads the upload as sha256 %s, want %s", sum, sha256hex(data))
	}

	x = run(t, c, sid, api.ExecuteRequest{Code: "open('/workspace/data/made.txt', 'w').write('made by code')"})
	if !slices.Contains(x.Artifacts, "data/made.txt") {
		t.Errorf("artifacts %q lack data/made.txt", x.Artifacts)
	}
	if got := download(t, c, sid, "data/made.txt"); string(got) != "made by code" {
		t.Errorf("data/made.txt: %q", got)
	}

	if err := c.DeleteFile(callCtx(t), sid, "data/notes.txt", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.OpenFile(callCtx(t), sid, "data/notes.txt", 0, 0); !client.IsNotFound(err) {
		t.Errorf("download of a deleted file: %v, want not found", err)
	}
	x = run(t, c, sid, api.ExecuteRequest{Code: "import os\nreturn sorted(os.listdir('/workspace/data'))"})
	var names []string
	returned(t, x, &names)
	if !slices.Equal(names, []string{"README", "blob.bin", "made.txt"}) {
		t.Errorf("code lists data/ as %q, want README, blob.bin and made.txt", names)
	}
}

// testTenants: a tenant's key reaches none of another tenant's sessions,
// not even by naming them, and the same id is another session for it.
func (d *deployment) testTenants(t *testing.T) {
	acme, other := d.client("acme", true), d.client("other", true)
	const sid = "acme-only"
	createSession(t, acme, sid)
	secret := []byte("acme's secret " + token())
	upload(t, acme, sid, "secret.txt", secret)

	notFound := func(what string, err error) {
		t.Helper()
		if !client.IsNotFound(err) {
			t.Errorf("other tenant: %s of acme's session: %v, want 404", what, err)
		}
	}
	ctx := callCtx(t)
	_, err := other.GetSession(ctx, sid)
	notFound("get", err)
	_, err = other.Execute(ctx, sid, api.ExecuteRequest{Code: "print(open('/workspace/secret.txt').read())"})
	notFound("execute", err)
	_, err = other.OpenFile(ctx, sid, "secret.txt", 0, 0)
	notFound("download", err)
	_, err = other.ListFiles(ctx, sid, client.ListFilesOptions{})
	notFound("list files", err)
	notFound("delete file", other.DeleteFile(ctx, sid, "secret.txt", false))
	_, err = other.HibernateSession(ctx, sid)
	notFound("hibernate", err)
	_, err = other.DeleteSession(ctx, sid)
	notFound("delete", err)
	list, err := other.ListSessions(ctx, client.ListSessionsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Sessions {
		if s.SessionID == sid {
			t.Errorf("other tenant lists acme's session %s", sid)
		}
	}

	// The id is free in the other tenant: its session is another, with
	// another workspace.
	createSession(t, other, sid)
	x := run(t, other, sid, api.ExecuteRequest{Code: "import os\nreturn sorted(os.listdir('/workspace'))"})
	var names []string
	returned(t, x, &names)
	if slices.Contains(names, "secret.txt") {
		t.Errorf("other tenant's session %s sees acme's secret.txt: %q", sid, names)
	}
	if _, err := other.OpenFile(ctx, sid, "secret.txt", 0, 0); !client.IsNotFound(err) {
		t.Errorf("other tenant's download of secret.txt in its own %s: %v, want 404", sid, err)
	}
	if got := download(t, acme, sid, "secret.txt"); !bytes.Equal(got, secret) {
		t.Errorf("acme's secret.txt after the other tenant's calls: %q", got)
	}
}

// sandboxPod returns the one live sandbox Pod of tenant's session sid.
func (d *deployment) sandboxPod(t *testing.T, tenant, sid string) corev1.Pod {
	t.Helper()
	list, err := d.kc.CoreV1().Pods(sandboxNamespace).List(callCtx(t), metav1.ListOptions{LabelSelector: sandboxSelector})
	if err != nil {
		t.Fatal(err)
	}
	var found []corev1.Pod
	for _, p := range list.Items {
		var of map[string]string
		json.Unmarshal([]byte(p.Annotations["sbx.dev/labels"]), &of)
		if p.DeletionTimestamp == nil && of[sandbox.LabelTenant] == tenant && of[sandbox.LabelSession] == sid {
			found = append(found, p)
		}
	}
	if len(found) != 1 || found[0].Status.Phase != corev1.PodRunning || found[0].Status.PodIP == "" {
		var states []string
		for _, p := range found {
			states = append(states, p.Name+" "+string(p.Status.Phase)+" "+p.Status.PodIP)
		}
		t.Fatalf("session %s/%s has sandbox pods %q, want one running", tenant, sid, states)
	}
	return found[0]
}

// podsOf returns the Pods of namespace ns whose app.kubernetes.io/name
// is name, and not being deleted.
func (d *deployment) podsOf(t *testing.T, ns, name string) []corev1.Pod {
	t.Helper()
	list, err := d.kc.CoreV1().Pods(ns).List(callCtx(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %s pods in %s", name, ns)
	}
	return out
}

func (d *deployment) serviceAddr(t *testing.T, ns, name string) string {
	t.Helper()
	svc, err := d.kc.CoreV1().Services(ns).Get(callCtx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port)))
}

// probeCode runs in a sandbox: it dials every address of targets.dial
// and asks every DNS server of targets.dns for a name (all at once, 3 s
// each), resolves a name itself, and says what it holds: service-account
// secrets, its ids and capabilities, its root mount, whether the root
// filesystem takes a file.
const probeCode = `
import json, os, socket, threading
T = json.loads(%q)
out = {"dial": {}, "dns": {}}
lock = threading.Lock()
def err(e):
    return "%%s: %%s" %% (type(e).__name__, e)
def dial(name, addr):
    host, port = addr.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        r = "connected"
    except Exception as e:
        r = err(e)
    finally:
        s.close()
    with lock:
        out["dial"][name] = r
QUERY = bytes.fromhex("abcd01000001000000000000") + b"".join(
    bytes([len(p)]) + p.encode() for p in "kubernetes.default.svc.cluster.local".split(".")) + b"\x00\x00\x01\x00\x01"
def dns(name, addr):
    host, port = addr.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(QUERY, (host, int(port)))
        s.recvfrom(512)
        r = "answered"
    except Exception as e:
        r = err(e)
    finally:
        s.close()
    with lock:
        out["dns"][name] = r
threads = [threading.Thread(target=dial, args=kv) for kv in T["dial"].items()]
threads += [threading.Thread(target=dns, args=kv) for kv in T["dns"].items()]
for th in threads:
    th.start()
for th in threads:
    th.join()
try:
    out["resolve"] = socket.gethostbyname("kubernetes.default.svc.cluster.local")
except Exception as e:
    out["resolve"] = err(e)
out["secrets"] = [p for p in ("/var/run/secrets/kubernetes.io", "/run/secrets/kubernetes.io") if os.path.exists(p)]
out["status"] = {}
for line in open("/proc/self/status"):
    k, v = line.split(":", 1)
    if k in ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs"):
        out["status"][k] = " ".join(v.split())
root = [l.split() for l in open("/proc/self/mountinfo") if l.split()[4] == "/"]
out["root_options"] = root[-1][5] if root else ""
out["writes"] = {}
for p in ("/probe", "/etc/probe", "/usr/probe", "/opt/probe", "/var/probe"):
    try:
        open(p, "w").close()
        out["writes"][p] = "written"
    except OSError as e:
        out["writes"][p] = err(e)
return out
`

// testHostile: code in a sandbox Pod reaches nothing of the cluster (the
// API server, the kubelet, sbx, its stores, DNS, another sandbox, the
// host), holds no service-account token, runs as uid 1000 without
// capabilities, and cannot write its root filesystem. Every address is
// first dialled from the host, so that a refusal in the sandbox is the
// sandbox's, not a closed port.
func (d *deployment) testHostile(t *testing.T) {
	c := d.client("acme", true)
	createSession(t, c, "hostile")
	createSession(t, c, "neighbour")
	run(t, c, "hostile", api.ExecuteRequest{Code: "pass"})
	run(t, c, "neighbour", api.ExecuteRequest{Code: "pass"})
	neighbour := d.sandboxPod(t, "acme", "neighbour")

	// A port of the host on the Pods' network, like a developer's model
	// server or a node's agent.
	ln, err := net.Listen("tcp", net.JoinHostPort(d.gateway, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	node, err := d.kc.CoreV1().Nodes().List(callCtx(t), metav1.ListOptions{})
	if err != nil || len(node.Items) == 0 {
		t.Fatalf("nodes: %v", err)
	}
	kubelet := strconv.Itoa(int(node.Items[0].Status.DaemonEndpoints.KubeletEndpoint.Port))
	dial := map[string]string{
		"API server (kubernetes Service)": d.serviceAddr(t, "default", "kubernetes"),
		"API server":                      net.JoinHostPort(d.gateway, "6443"),
		"kubelet on the gateway":          net.JoinHostPort(d.gateway, kubelet),
		"host port on the gateway":        ln.Addr().String(),
		"sbx Service":                     d.serviceAddr(t, controlNamespace, "sbx"),
		"PostgreSQL Service":              d.serviceAddr(t, controlNamespace, "postgres"),
		"MinIO Service":                   d.serviceAddr(t, controlNamespace, "minio"),
		"kube-dns Service (TCP)":          d.serviceAddr(t, "kube-system", "kube-dns"),
		"neighbour sandbox's executor":    net.JoinHostPort(neighbour.Status.PodIP, "7071"),
	}
	for _, a := range node.Items[0].Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			dial["kubelet on the node's address"] = net.JoinHostPort(a.Address, kubelet)
		}
	}
	for _, p := range d.podsOf(t, controlNamespace, "sbx") {
		dial["sbx pod "+p.Name] = net.JoinHostPort(p.Status.PodIP, "7070")
	}
	dial["PostgreSQL pod"] = net.JoinHostPort(d.podsOf(t, controlNamespace, "postgres")[0].Status.PodIP, "5432")
	dial["MinIO pod"] = net.JoinHostPort(d.podsOf(t, controlNamespace, "minio")[0].Status.PodIP, "9000")
	// DNS over UDP: the kube-dns Service and its Pods at the port it
	// leads to.
	dnsSvc, err := d.kc.CoreV1().Services("kube-system").Get(callCtx(t), "kube-dns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dns := map[string]string{}
	for _, p := range dnsSvc.Spec.Ports {
		if p.Protocol != corev1.ProtocolUDP {
			continue
		}
		dns["kube-dns Service"] = net.JoinHostPort(dnsSvc.Spec.ClusterIP, strconv.Itoa(int(p.Port)))
		pods, err := d.kc.CoreV1().Pods("kube-system").List(callCtx(t), metav1.ListOptions{LabelSelector: labels.SelectorFromSet(dnsSvc.Spec.Selector).String()})
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range pods.Items {
			if pod.Status.PodIP != "" {
				dns["DNS pod "+pod.Name] = net.JoinHostPort(pod.Status.PodIP, p.TargetPort.String())
			}
		}
	}
	if len(dns) < 2 {
		t.Fatalf("kube-dns: %v, want the Service and a Pod", dns)
	}

	for name, addr := range dial {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Errorf("the host cannot reach %s (%s): %v; that the sandbox cannot either proves nothing", name, addr, err)
			continue
		}
		conn.Close()
	}
	for name, addr := range dns {
		if err := askDNS(addr); err != nil {
			t.Errorf("%s (%s) does not answer the host: %v; that it does not answer the sandbox proves nothing", name, addr, err)
		}
	}

	targets, _ := json.Marshal(map[string]any{"dial": dial, "dns": dns})
	x := run(t, c, "hostile", api.ExecuteRequest{Code: fmt.Sprintf(probeCode, targets), Timeout: 60})
	var got struct {
		Dial        map[string]string `json:"dial"`
		DNS         map[string]string `json:"dns"`
		Resolve     string            `json:"resolve"`
		Secrets     []string          `json:"secrets"`
		Status      map[string]string `json:"status"`
		RootOptions string            `json:"root_options"`
		Writes      map[string]string `json:"writes"`
	}
	returned(t, x, &got)
	t.Logf("from the sandbox: %+v", got)
	for name, addr := range dial {
		if r, ok := got.Dial[name]; !ok || r == "connected" {
			t.Errorf("the sandbox reached %s (%s): %q", name, addr, r)
		}
	}
	for name, addr := range dns {
		if r, ok := got.DNS[name]; !ok || r == "answered" {
			t.Errorf("%s (%s) answered the sandbox: %q", name, addr, r)
		}
	}
	if net.ParseIP(got.Resolve) != nil {
		t.Errorf("the sandbox resolved kubernetes.default.svc.cluster.local to %s", got.Resolve)
	}
	if len(got.Secrets) > 0 {
		t.Errorf("the sandbox has %q: a service-account token", got.Secrets)
	}
	for k, want := range map[string]string{
		"Uid": "1000 1000 1000 1000", "Gid": "1000 1000 1000 1000", "NoNewPrivs": "1",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapAmb": "0000000000000000",
	} {
		if got.Status[k] != want {
			t.Errorf("the sandbox's code has %s %q, want %q", k, got.Status[k], want)
		}
	}
	// The bounding set may keep CAP_SETGID, which a Pod's zygote holds
	// for conversations' groups (internal/executor/unprivileged.go):
	// with every other set empty, under no_new_privs, nothing gains it.
	const capSetgid = 1 << 6
	if bnd, err := strconv.ParseUint(got.Status["CapBnd"], 16, 64); err != nil || bnd&^capSetgid != 0 {
		t.Errorf("the sandbox's code has CapBnd %q, want none but CAP_SETGID", got.Status["CapBnd"])
	}
	if !slices.Contains(strings.Split(got.RootOptions, ","), "ro") {
		t.Errorf("the sandbox's root is mounted %q, want ro", got.RootOptions)
	}
	for p, r := range got.Writes {
		if r == "written" {
			t.Errorf("the sandbox wrote %s on its root filesystem", p)
		}
	}
	if len(got.Writes) == 0 {
		t.Error("the probe tried no write")
	}
}

// askDNS asks the server at addr for kubernetes.default.svc.cluster.local
// and returns nil when it answers.
func askDNS(addr string) error {
	q := []byte{0xab, 0xcd, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, p := range strings.Split("kubernetes.default.svc.cluster.local", ".") {
		q = append(append(q, byte(len(p))), p...)
	}
	q = append(q, 0, 0, 1, 0, 1)
	conn, err := net.DialTimeout("udp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(q); err != nil {
		return err
	}
	_, err = conn.Read(make([]byte, 512))
	return err
}

// deletePod deletes a Pod as `kubectl delete pod` does (with force: at
// once, without waiting for its containers to stop) and waits until the
// API server no longer has it.
func (d *deployment) deletePod(t *testing.T, ns, name string, force bool) {
	t.Helper()
	args := []string{"-n", ns, "delete", "pod", name, "--wait=true", "--timeout=2m"}
	if force {
		args = append(args, "--grace-period=0", "--force")
	}
	if _, err := d.kubectl(callCtx(t), args...); err != nil {
		t.Fatal(err)
	}
	ctx := callCtx(t)
	for {
		_, err := d.kc.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s/%s still there after its delete: %v", ns, name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// testSandboxPodDeleted: a session's sandbox Pod deleted from outside sbx
// (an operator, an eviction) costs nothing a completed call wrote: the
// next calls succeed in a new Pod, with the files.
func (d *deployment) testSandboxPodDeleted(t *testing.T) {
	c := d.client("acme", true)
	const sid = "pod-deleted"
	createSession(t, c, sid)
	files := plant(t, c, sid, "before")
	pod := d.sandboxPod(t, "acme", sid)
	d.deletePod(t, sandboxNamespace, pod.Name, true)
	t.Logf("deleted sandbox pod %s", pod.Name)

	files.check(t, c, sid)
	if again := d.sandboxPod(t, "acme", sid); again.Name == pod.Name {
		t.Errorf("the session's pod is still %s", pod.Name)
	}
	for k, v := range plant(t, c, sid, "after") {
		files[k] = v
	}
	files.check(t, c, sid)
}

// traffic is one client's calls to one session, one after the other.
// A writer's calls each leave a file behind when they succeed; a
// reader's list the session's files and read its record.
type traffic struct {
	c      *client.Client
	sid    string
	tag    string
	reader bool

	mu     sync.Mutex
	calls  int
	files  planted
	errs   []string
	notify chan struct{} // a call ended
}

func (tr *traffic) loop(stop <-chan struct{}) {
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), callWait)
		path := fmt.Sprintf("traffic/%s-%d.txt", tr.tag, n)
		data := []byte(fmt.Sprintf("%s %d %s", tr.tag, n, token()))
		var err error
		switch {
		case tr.reader && n%2 == 0:
			path = "list the workspace"
			_, err = tr.c.ListFiles(ctx, tr.sid, client.ListFilesOptions{})
		case tr.reader:
			path = "get the session"
			_, err = tr.c.GetSession(ctx, tr.sid)
		case n%2 == 0:
			_, err = tr.c.Upload(ctx, tr.sid, client.UploadOptions{Path: path}, client.UploadFile{Name: filepath.Base(path), Reader: bytes.NewReader(data)})
		default:
			var x *api.Execution
			x, err = tr.c.Execute(ctx, tr.sid, api.ExecuteRequest{Code: fmt.Sprintf(
				"import os\nos.makedirs('/workspace/traffic', exist_ok=True)\nopen('/workspace/%s', 'w').write(%q)", path, data)})
			if err == nil && x.Status != "completed" {
				err = fmt.Errorf("execution %s: %+v", x.Status, x.Error)
			}
		}
		cancel()
		tr.mu.Lock()
		tr.calls++
		if err != nil {
			tr.errs = append(tr.errs, fmt.Sprintf("%s %s %s: %v", time.Now().Format("15:04:05.000"), tr.tag, path, err))
		} else if !tr.reader {
			tr.files[path] = data
		}
		tr.mu.Unlock()
		select {
		case tr.notify <- struct{}{}:
		default:
		}
	}
}

// waitCalls waits until every loop has ended n more calls than it had.
func waitCalls(t *testing.T, trs []*traffic, n int) {
	t.Helper()
	ctx := callCtx(t)
	for _, tr := range trs {
		tr.mu.Lock()
		want := tr.calls + n
		tr.mu.Unlock()
		for {
			tr.mu.Lock()
			have := tr.calls
			tr.mu.Unlock()
			if have >= want {
				break
			}
			select {
			case <-tr.notify:
			case <-time.After(time.Second):
			case <-ctx.Done():
				t.Fatalf("traffic %s: %d calls, waiting for %d", tr.tag, have, want)
			}
		}
	}
}

// testReplicaDeleted: an sbx replica deleted as `kubectl delete pod`
// does (a drain, a rolling update, an operator) while calls go on.
// Writers open a connection per call, which the Service gives to either
// replica; a reader keeps its connection, which the deleted replica may
// hold. No call fails, the Deployment brings the replica back, and every
// file a call wrote is there.
func (d *deployment) testReplicaDeleted(t *testing.T) {
	c := d.client("acme", true)
	const sid = "traffic"
	createSession(t, c, sid)
	files := plant(t, c, sid, "before")
	var trs []*traffic
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 5 {
		reader := i == 4
		tr := &traffic{c: d.client("acme", reader), sid: sid, tag: fmt.Sprintf("w%d", i), reader: reader, files: planted{}, notify: make(chan struct{}, 1)}
		trs = append(trs, tr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr.loop(stop)
		}()
	}
	stopped := false
	stopAll := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopAll()
	waitCalls(t, trs, 4)

	victim := d.podsOf(t, controlNamespace, "sbx")[0].Name
	t0 := time.Now()
	d.deletePod(t, controlNamespace, victim, false)
	t.Logf("deleted replica %s in %s", victim, time.Since(t0).Round(100*time.Millisecond))
	d.waitReplicas(t, victim)
	t.Logf("the Deployment has its replicas ready again %s after the delete", time.Since(t0).Round(100*time.Millisecond))
	d.waitServing(t, callCtx(t))
	waitCalls(t, trs, 4)
	stopAll()

	total := 0
	for _, tr := range trs {
		total += tr.calls
		for _, e := range tr.errs {
			t.Errorf("traffic: %s", e)
		}
		for k, v := range tr.files {
			files[k] = v
		}
	}
	t.Logf("traffic: %d calls, %d files", total, len(files))
	files.check(t, c, sid)
}

// testReplicasKilled: every sbx replica killed at once with no grace (a
// node lost, `kubectl delete --force --grace-period=0`): no drain, no
// lease given back. Once the Deployment has replaced them, a session made
// before has every file and runs code again; the sandbox Pods outlived
// their control plane, and the new replicas adopt them.
func (d *deployment) testReplicasKilled(t *testing.T) {
	c := d.client("acme", false)
	const sid = "killed"
	createSession(t, c, sid)
	files := plant(t, c, sid, "before")
	var gone []string
	for _, p := range d.podsOf(t, controlNamespace, "sbx") {
		gone = append(gone, p.Name)
	}
	t0 := time.Now()
	for _, name := range gone {
		d.deletePod(t, controlNamespace, name, true)
	}
	for _, name := range gone {
		d.waitReplicas(t, name)
	}
	d.waitServing(t, callCtx(t))
	t.Logf("killed replicas %v; the Deployment serves again %s later", gone, time.Since(t0).Round(100*time.Millisecond))
	files.check(t, c, sid)
	after := plant(t, c, sid, "after")
	after.check(t, c, sid)
	// Its sandbox's CPU counts against the tenant's limit (8 cores), which
	// the scenarios after this one need.
	if _, err := c.DeleteSession(callCtx(t), sid); err != nil {
		t.Error(err)
	}
}

// waitReplicas waits until the Deployment has all its replicas ready
// and no other Pod: none terminating, none named gone.
func (d *deployment) waitReplicas(t *testing.T, gone string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyWait)
	defer cancel()
	for {
		dep, err := d.kc.AppsV1().Deployments(controlNamespace).Get(ctx, "sbx", metav1.GetOptions{})
		if err == nil && dep.Spec.Replicas != nil && dep.Status.ObservedGeneration >= dep.Generation &&
			dep.Status.ReadyReplicas == *dep.Spec.Replicas && dep.Status.AvailableReplicas == *dep.Spec.Replicas &&
			dep.Status.UpdatedReplicas == *dep.Spec.Replicas && dep.Status.Replicas == *dep.Spec.Replicas {
			pods, err := d.kc.CoreV1().Pods(controlNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sbx"})
			if err == nil && len(pods.Items) == int(*dep.Spec.Replicas) && !slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool {
				return p.Name == gone || p.DeletionTimestamp != nil
			}) {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("deployment sbx not back to its replicas alone within %s: %+v (%v)", readyWait, dep.Status, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// testHibernate: a hibernated session has no Pod, and its files come
// back with the next call.
func (d *deployment) testHibernate(t *testing.T) {
	c := d.client("acme", true)
	const sid = "hibernate"
	createSession(t, c, sid)
	files := plant(t, c, sid, "before")
	pod := d.sandboxPod(t, "acme", sid)
	s, err := c.HibernateSession(callCtx(t), sid)
	if err != nil {
		t.Fatal(err)
	}
	if s.Status != "hibernated" {
		t.Fatalf("hibernate: status %s", s.Status)
	}
	ctx := callCtx(t)
	for {
		_, err := d.kc.CoreV1().Pods(sandboxNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("hibernated session %s keeps its pod %s", sid, pod.Name)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if s, err := c.GetSession(ctx, sid); err != nil || s.Status != "hibernated" {
		t.Fatalf("after hibernation: %+v %v", s, err)
	}
	files.check(t, c, sid)
	if s, err := c.GetSession(ctx, sid); err != nil || s.Status != "running" {
		t.Errorf("after a call: %+v %v, want running", s, err)
	}
}

// testAgents: an agent's execute, and a chat turn whose model (a fake of
// the test's on the host, which the sbx Pods reach at the gateway) calls
// the code tool in the agent's session.
func (d *deployment) testAgents(t *testing.T) {
	c := d.client("acme", true)
	x, err := c.AgentExecute(callCtx(t), "analyst", api.AgentExecuteRequest{UserID: "alice",
		Code: "open('/workspace/agent.txt', 'w').write('hi from the agent')\nprint(6 * 7)"})
	if err != nil {
		t.Fatal(err)
	}
	if x.Status != "completed" || x.Stdout != "42\n" {
		t.Fatalf("agent execute: %s %q %+v", x.Status, x.Stdout, x.Error)
	}
	sid := api.AgentSessionID("alice", "analyst")
	if x.SessionID != sid {
		t.Errorf("agent execute ran in %s, want %s", x.SessionID, sid)
	}

	llm := chattest.NewOn(t, net.JoinHostPort(d.gateway, "0"),
		chattest.Reply{ToolCalls: []chattest.ToolCall{{ID: "call_1", Name: "execute_code",
			Arguments: chattest.Args(map[string]string{"code": "print(open('/workspace/agent.txt').read(), 6 * 7)"})}}},
		chattest.Reply{Text: "The file says hi."})
	d.pointAtModel(t, llm.BaseURL())

	// A client of its own: a connection kept from before would lead to a
	// replica of the old configuration, which drains for a while.
	c = d.client("acme", true)
	ctx := callCtx(t)
	stream, err := c.Chat(ctx, "analyst", api.ChatRequest{UserID: "alice", ConversationID: "conv-1", Message: "What does agent.txt say?"})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var events []*client.ChatEvent
	for {
		ev, err := stream.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("chat stream: %v", err)
		}
		events = append(events, ev)
	}
	var calls, results, messages, errs []string
	var done *api.ChatDone
	for _, ev := range events {
		switch {
		case ev.ToolCall != nil:
			calls = append(calls, ev.ToolCall.Name)
		case ev.ToolResult != nil:
			r := ev.ToolResult.Content
			if ev.ToolResult.IsError {
				r = "error: " + r
			}
			results = append(results, r)
		case ev.Message != nil:
			messages = append(messages, ev.Message.Content)
		case ev.Error != nil:
			errs = append(errs, ev.Error.Code+": "+ev.Error.Message)
		case ev.Done != nil:
			done = ev.Done
		}
	}
	if len(errs) > 0 {
		t.Errorf("chat: errors %q", errs)
	}
	if !slices.Equal(calls, []string{"execute_code"}) {
		t.Errorf("chat: tool calls %q, want execute_code", calls)
	}
	if len(results) != 1 || !strings.Contains(results[0], "hi from the agent 42") || strings.HasPrefix(results[0], "error: ") {
		t.Errorf("chat: tool results %q, want the code's output", results)
	}
	if !slices.Equal(messages, []string{"The file says hi."}) {
		t.Errorf("chat: messages %q", messages)
	}
	if done == nil || done.SessionID != sid || done.Steps != 2 {
		t.Errorf("chat: done %+v, want session %s and 2 steps", done, sid)
	}
	reqs := llm.Requests()
	if len(reqs) != 2 || !reqs[1].Contains("hi from the agent 42") {
		t.Errorf("the model had %d requests; the second should carry the tool's output", len(reqs))
	}
}

// pointAtModel makes the deployment's chat loop call the model at
// baseURL: an overlay of deploy/kubernetes, made in a temporary
// directory, that adds SBX_LLM_BASE_URL and SBX_LLM_MODEL to the sbx
// container, applied as a user would; then waits for the rollout.
func (d *deployment) pointAtModel(t *testing.T, baseURL string) {
	t.Helper()
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, d.dir)
	if err != nil {
		t.Fatal(err)
	}
	env := func(name, value string) string {
		return fmt.Sprintf("      - op: add\n        path: /spec/template/spec/containers/0/env/-\n        value: {name: %s, value: %q}\n", name, value)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel + "\n" +
		"patches:\n  - target: {kind: Deployment, name: sbx}\n    patch: |-\n" +
		env("SBX_LLM_BASE_URL", baseURL) + env("SBX_LLM_MODEL", "test-model")
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	ctx := callCtx(t)
	if _, err := d.kubectl(ctx, "apply", "-k", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := d.kubectl(ctx, "-n", controlNamespace, "rollout", "status", "deployment/sbx", "--timeout="+readyWait.String()); err != nil {
		t.Fatalf("deployment/sbx with the model: %v", err)
	}
	d.waitReplicas(t, "")
	d.waitServing(t, ctx)
	t.Logf("sbx rolled out with the model at %s in %s", baseURL, time.Since(t0).Round(100*time.Millisecond))
}
