//go:build integration

package app_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/blob/s3"
	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/quota/quotatest"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/store/postgres"
	"github.com/sbx-sandbox/sbx/internal/testenv"
	"github.com/sbx-sandbox/sbx/internal/testenv/kubetest"
	"github.com/sbx-sandbox/sbx/internal/testenv/miniotest"
	"github.com/sbx-sandbox/sbx/internal/testenv/pgtest"
)

// The replica suite (issue 14): three `sbx serve` processes share one
// PostgreSQL store, one S3 bucket (MinIO), one data directory and one
// sandbox state directory, as replicas behind a load balancer would on one
// host. Every step of a session goes to a different replica, and replicas
// are killed and restarted under it.
//
// Set SBX_REPLICAS_LOG_DIR to keep the replicas' logs (one file per
// process) after the test; otherwise they go with the test's temporary
// directory, and failures quote the lines that concern them.

// Lease and timing constants of internal/app (leader.go) and the server's
// defaults, which the deadlines below are made of.
const (
	leaderTTL    = 15 * time.Second // the reaper's lease
	replicaTTL   = 15 * time.Second // a replica's liveness lease
	beatEvery    = 5 * time.Second  // its renewal, and Recover on the leader
	reapInterval = 5 * time.Second  // sbx serve's default
)

// blobPrefix is where in the bucket the replicas keep their blobs.
const blobPrefix = "replicas"

func TestReplicas(t *testing.T) {
	env := testenv.New(t)
	testenv.New(t).Rootfs(t, "python")
	pgtest.Require(t)
	quotatest.Require(t)
	sbx := env.Sbx(t)

	// Cleanups run last first: the replicas die, then the test's store
	// closes, then the sandboxes are destroyed, then the workspace image
	// is unmounted, then the database is dropped and the data directory
	// removed.
	dir := t.TempDir()
	state := filepath.Join(env.StateRoot, "rp")
	rt, err := oci.New(oci.Config{StateDir: state, ExecutorPath: env.Executor})
	if err != nil {
		t.Fatal(err)
	}
	cl := &cluster{sbx: sbx, dir: dir, state: state, rt: rt}
	cl.setUp(t)
	cl.run(t)
}

// TestReplicasKubernetes is the same suite on the kubernetes runtime, as
// a cluster deployment has it: each replica a data directory of its own
// (a Pod's emptyDir: nothing shared on disk, and a restarted replica
// starts with an empty one), sandboxes as Pods in the test's namespace,
// the executors' signing key in a Secret there, and the same shared
// PostgreSQL and MinIO. Kube-only subtests delete sandbox Pods from
// outside and leave orphans for the leader.
func TestReplicasKubernetes(t *testing.T) {
	env := testenv.New(t)
	pgtest.Require(t)
	kc := kubetest.New(t)
	kubetest.Image(t, "python")
	sbx := env.Sbx(t)

	// The key every replica signs executor tokens with: made here so that
	// this test's own runtime (listing, and the orphans it starts) signs
	// with it too; the replicas find it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	signer, err := kube.LoadSigner(ctx, kc.Client, kc.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := kube.New(kube.Config{Client: kc.Client, Namespace: kc.Namespace, Signer: signer,
		PullPolicy: "Never", ImageSuffix: kubetest.Suffix(t)})
	if err != nil {
		t.Fatal(err)
	}
	cl := &cluster{sbx: sbx, dir: t.TempDir(), kube: kc, rt: rt}
	cl.setUp(t)
	cl.run(t)
}

// setUp gives cl its store, its bucket and its three replicas, and
// registers their cleanups.
func (cl *cluster) setUp(t *testing.T) {
	cl.storeURL = pgtest.URL(t)
	bucket := miniotest.New(t)
	cl.blobURL = fmt.Sprintf("s3://%s/%s?endpoint=%s&region=%s", bucket.Name, blobPrefix, bucket.Endpoint, miniotest.Region)
	cl.logDir = os.Getenv("SBX_REPLICAS_LOG_DIR")
	if cl.logDir == "" {
		cl.logDir = t.TempDir()
	} else if err := os.MkdirAll(cl.logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cl.env = append(os.Environ(),
		"AWS_ACCESS_KEY_ID="+miniotest.AccessKey,
		"AWS_SECRET_ACCESS_KEY="+miniotest.SecretKey,
		"AWS_REGION="+miniotest.Region,
	)
	if cl.kube != nil {
		// Where a replica's Pod would have it from the downward API: the
		// Secret of the executors' key is looked for there.
		cl.env = append(cl.env, "POD_NAMESPACE="+cl.kube.Namespace)
	}
	if cl.kube == nil {
		// After the replicas are gone and their sandboxes destroyed.
		t.Cleanup(func() { cl.unmountImage(t) })
	}
	t.Cleanup(func() { cl.destroySandboxes(t) })
	st, err := postgres.Open(context.Background(), cl.storeURL)
	if err != nil {
		t.Fatal(err)
	}
	cl.store = st
	t.Cleanup(func() { st.Close() })
	cl.blobs, err = s3.Open(context.Background(), cl.blobURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.killAll)

	// One at a time: on runc the first mounts the shared workspace image,
	// the others find it mounted.
	for i := range cl.reps {
		cl.start(t, i)
	}
}

// run runs the suite on cl: every subtest on both runtimes but those that
// check what only one has.
func (cl *cluster) run(t *testing.T) {
	t.Run("CreateElsewhere", cl.testCreateElsewhere)
	t.Run("ConcurrentCreates", cl.testConcurrentCreates)
	t.Run("HibernateRestoreAcross", cl.testHibernateRestoreAcross)
	t.Run("ReaperFailover", cl.testReaperFailover)
	t.Run("RestartWhileRunning", cl.testRestartWhileRunning)
	t.Run("KillMidExecution", cl.testKillMidExecution)
	t.Run("CancelElsewhere", cl.testCancelElsewhere)
	t.Run("OutputElsewhere", cl.testOutputElsewhere)
	t.Run("OutcomeIsFinal", cl.testOutcomeIsFinal)
	t.Run("MixedTraffic", cl.testMixedTraffic)
	t.Run("EventsAcross", cl.testEventsAcross)
	if cl.kube != nil {
		// What only Pods do: they are deleted and evicted from outside
		// sbx, and they outlive the replica that made them.
		t.Run("PodDeleted", cl.testPodDeleted)
		t.Run("PodAndReplicaKilled", cl.testPodAndReplicaKilled)
		t.Run("PodDeletedMidExecution", cl.testPodDeletedMidExecution)
		t.Run("Orphans", cl.testOrphans)
		t.Run("PodDeletedRunning", cl.testPodDeletedRunning)
		t.Run("Conversations", cl.testConversations)
	}
}

// errorLog is the replicas' clients' transport: it keeps the 5xx answers
// (with their bodies), which the client may retry and so hide.
type errorLog struct {
	http.Transport
	cl  *cluster
	idx int
}

func (l *errorLog) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.Transport.RoundTrip(req)
	if err != nil || resp.StatusCode < 500 {
		return resp, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	l.cl.mu.Lock()
	l.cl.errors = append(l.cl.errors, fmt.Sprintf("replica %d: %s %s: %d %s", l.idx, req.Method, req.URL.Path, resp.StatusCode, bytes.TrimSpace(body)))
	l.cl.mu.Unlock()
	return resp, nil
}

// takeErrors returns the 5xx answers kept since the last call.
func (cl *cluster) takeErrors() []string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	out := cl.errors
	cl.errors = nil
	return out
}

// cluster is the three replicas and what they share.
type cluster struct {
	sbx, logDir       string
	storeURL, blobURL string
	env               []string
	// dir is the replicas' one data directory and state their one
	// sandbox state directory on runc; on Kubernetes dir holds a data
	// directory for each replica process, and state is unused.
	dir, state string
	// kube is the cluster the sandboxes run in; nil: runc on this host.
	kube  *kubetest.Cluster
	rt    runtime.Runtime // the replicas' sandboxes, seen by the test
	store *postgres.Store
	blobs *s3.Store

	mu     sync.Mutex
	errors []string // 5xx answers (errorLog)
	reps   [3]*replica
	all    []*replica // every process started, for the cleanup
}

// replica is one sbx serve process.
type replica struct {
	idx    int
	gen    int // how many processes this slot had before
	addr   string
	cmd    *exec.Cmd
	c      *client.Client
	log    string
	exited chan struct{} // closed once the process has exited
}

func (r *replica) name() string {
	return fmt.Sprintf("replica %d (pid %d, %s)", r.idx, r.cmd.Process.Pid, r.addr)
}

func (r *replica) alive() bool {
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// c returns the client of replica i.
func (cl *cluster) c(i int) *client.Client {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.reps[i].c
}

func (cl *cluster) rep(i int) *replica {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.reps[i]
}

// start starts replica i on a free loopback port and waits until it
// answers /healthz.
func (cl *cluster) start(t *testing.T, i int) *replica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	gen := 0
	if old := cl.rep(i); old != nil {
		gen = old.gen + 1
	}
	logPath := filepath.Join(cl.logDir, fmt.Sprintf("replica%d.%d.log", i, gen))
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close() // the child has its own descriptor
	args := []string{"serve", "--addr", addr,
		"--store", cl.storeURL, "--blob", cl.blobURL,
		"--template-dir", testenv.TemplateDir(), "--prebuild", "",
		"--webhook-allow-private",
		// Many sessions of the default GiB on a small image, and sandboxes
		// on whatever machine runs the tests: the limits are not what is
		// tested here (TestServeDefaultLimits is their test).
		"--disk-overcommit", "0", "--limits", "sandboxes=0,memory=0,cpu=0"}
	if cl.kube == nil {
		args = append(args, "--data-dir", cl.dir, "--state-dir", cl.state, "--workspace-image-size", "4")
	} else {
		// A data directory of this process's own, as a replica Pod's
		// emptyDir is: a restarted replica finds nothing of its last life.
		data := filepath.Join(cl.dir, fmt.Sprintf("replica%d.%d", i, gen))
		args = append(args, "--data-dir", data, "--state-dir", filepath.Join(data, "state"),
			"--runtime", "kubernetes", "--kubeconfig", cl.kube.Kubeconfig, "--sandbox-namespace", cl.kube.Namespace)
	}
	cmd := exec.Command(cl.sbx, args...)
	cmd.Env = cl.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// The replica dies with the test process, however that ends: the
	// signal comes when the thread that started it exits, so that thread
	// is held until the replica has exited.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r := &replica{idx: i, gen: gen, addr: addr, cmd: cmd, log: logPath, exited: make(chan struct{}),
		c: client.New("http://"+addr, client.WithHTTPClient(&http.Client{Transport: &errorLog{cl: cl, idx: i}}))}
	started := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(r.exited)
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	cl.mu.Lock()
	cl.reps[i] = r
	cl.all = append(cl.all, r)
	cl.mu.Unlock()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-r.exited:
			t.Fatalf("%s exited at start (%v); its log:\n%s", r.name(), cmd.ProcessState, tail(logPath, 30))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not come up in 60s (last: %v); its log:\n%s", r.name(), err, tail(logPath, 30))
		}
	}
	t.Logf("started %s", r.name())
	return r
}

// stop signals replica i and waits for it to exit (SIGKILL after 20 s).
func (cl *cluster) stop(t *testing.T, i int, sig syscall.Signal) {
	t.Helper()
	r := cl.rep(i)
	r.cmd.Process.Signal(sig)
	select {
	case <-r.exited:
	case <-time.After(20 * time.Second):
		t.Errorf("%s did not exit within 20s of %v; killing it", r.name(), sig)
		r.cmd.Process.Kill()
		<-r.exited
	}
	t.Logf("%s: %v: %v", r.name(), sig, r.cmd.ProcessState)
}

// ensureAll restarts the replicas a previous subtest left dead.
func (cl *cluster) ensureAll(t *testing.T) {
	t.Helper()
	for i := range cl.reps {
		if !cl.rep(i).alive() {
			cl.start(t, i)
		}
	}
}

// killAll kills every replica ever started.
func (cl *cluster) killAll() {
	cl.mu.Lock()
	all := slices.Clone(cl.all)
	cl.mu.Unlock()
	for _, r := range all {
		if r.alive() {
			r.cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	for _, r := range all {
		<-r.exited
	}
}

// destroySandboxes destroys what the replicas left in the runtime and
// removes the state directory; nothing may be left.
func (cl *cluster) destroySandboxes(t *testing.T) {
	ctx := context.Background()
	infos, err := cl.rt.List(ctx)
	if err != nil {
		t.Errorf("listing the replicas' sandboxes: %v", err)
	}
	for _, info := range infos {
		if err := cl.rt.Destroy(ctx, info.ID); err != nil {
			t.Errorf("destroying sandbox %s: %v", info.ID, err)
		}
	}
	if infos, err := cl.rt.List(ctx); err != nil || len(infos) > 0 {
		t.Errorf("sandboxes left after the cleanup: %+v %v", infos, err)
	}
	if cl.kube != nil {
		return // the namespace goes with the test (kubetest)
	}
	if err := os.RemoveAll(cl.state); err != nil {
		t.Errorf("removing the state directory: %v", err)
	}
}

// unmountImage unmounts the workspace image the first replica mounted
// and checks that its loop device went with it.
func (cl *cluster) unmountImage(t *testing.T) {
	ws := filepath.Join(cl.dir, "workspaces")
	if err := quota.Unmount(ws); err != nil {
		t.Error(err)
	}
	image := filepath.Join(cl.dir, "workspaces.img")
	deadline := time.Now().Add(10 * time.Second)
	for {
		devs := loopsOf(image)
		if len(devs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("loop devices still attached to %s after the unmount: %v", image, devs)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// loopsOf lists the loop devices backed by file.
func loopsOf(file string) []string {
	var out []string
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == file {
			out = append(out, strings.Split(p, "/")[3])
		}
	}
	return out
}

// sandboxesOf lists the sandboxes of a session in the shared runtime.
func (cl *cluster) sandboxesOf(t *testing.T, sid string) []runtime.Info {
	t.Helper()
	infos, err := cl.rt.List(context.Background())
	if err != nil {
		t.Fatalf("listing sandboxes: %v", err)
	}
	var out []runtime.Info
	for _, info := range infos {
		if info.Labels[sandbox.LabelSession] == sid {
			out = append(out, info)
		}
	}
	return out
}

func describe(infos []runtime.Info) string {
	var parts []string
	for _, i := range infos {
		parts = append(parts, fmt.Sprintf("%s (%s, created %s)", i.ID, i.State, i.CreatedAt.Format("15:04:05.000")))
	}
	return fmt.Sprintf("%d: [%s]", len(infos), strings.Join(parts, ", "))
}

// logs returns the lines of every replica's log (every process so far)
// that mention one of words, the last max of them, each with its
// replica's name.
func (cl *cluster) logs(max int, words ...string) string {
	cl.mu.Lock()
	all := slices.Clone(cl.all)
	cl.mu.Unlock()
	type line struct {
		at   string
		text string
	}
	var lines []line
	for _, r := range all {
		f, err := os.Open(r.log)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			text := sc.Text()
			for _, w := range words {
				if strings.Contains(text, w) {
					var v struct {
						Time string `json:"time"`
					}
					json.Unmarshal([]byte(text), &v)
					lines = append(lines, line{v.Time, fmt.Sprintf("  r%d.%d: %s", r.idx, r.gen, text)})
					break
				}
			}
		}
		f.Close()
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
	if len(lines) > max {
		lines = lines[len(lines)-max:]
	}
	if len(lines) == 0 {
		return "  (no log lines mention " + strings.Join(words, ", ") + ")"
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l.text + "\n")
	}
	return b.String()
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func token() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func describeExec(x *api.Execution, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	s := fmt.Sprintf("execution %s %s, stdout %q, stderr %q", x.ExecutionID, x.Status, x.Stdout, x.Stderr)
	if x.Error != nil {
		s += fmt.Sprintf(", error %s: %s", x.Error.Type, x.Error.Message)
	}
	return s
}

// exec runs req in session sid through replica i and returns the
// completed execution, or fails t saying what the replica answered and
// what the logs say about the session.
func (cl *cluster) exec(t *testing.T, i int, sid string, req api.ExecuteRequest) *api.Execution {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	x, err := cl.c(i).Execute(ctx, sid, req)
	if err != nil || x.Status != api.ExecCompleted {
		t.Fatalf("execute through %s in session %s: %s\nsandboxes of the session: %s\nlogs:\n%s",
			cl.rep(i).name(), sid, describeExec(x, err), describe(cl.sandboxesOf(t, sid)), cl.logs(40, sid))
	}
	return x
}

// create creates a session through replica i.
func (cl *cluster) create(t *testing.T, i int, req api.CreateSessionRequest) *api.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if req.TemplateID == "" {
		req.TemplateID = "python"
	}
	s, created, err := cl.c(i).CreateSession(ctx, req)
	if err != nil || !created {
		t.Fatalf("create session %s through %s: created %v, %+v, %v\nlogs:\n%s", req.SessionID, cl.rep(i).name(), created, s, err, cl.logs(40, req.SessionID))
	}
	return s
}

// getAll asks every replica for the session and says what each answered.
func (cl *cluster) getAll(sid string) string {
	var parts []string
	for i := range cl.reps {
		if !cl.rep(i).alive() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := cl.c(i).GetSession(ctx, sid)
		cancel()
		if err != nil {
			parts = append(parts, fmt.Sprintf("replica %d: %v", i, err))
		} else {
			parts = append(parts, fmt.Sprintf("replica %d: %s (sandbox %s, error %q)", i, s.Status, s.SandboxState, s.Error))
		}
	}
	return strings.Join(parts, "; ")
}

// 1. A session created through one replica is used through the others:
// executions (plain and streamed), uploads, downloads, listings and the
// delete, and every replica sees it gone.
func (cl *cluster) testCreateElsewhere(t *testing.T) {
	cl.ensureAll(t)
	const sid = "elsewhere"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl.create(t, 0, api.CreateSessionRequest{SessionID: sid})

	mark := token()
	x := cl.exec(t, 1, sid, api.ExecuteRequest{Code: fmt.Sprintf("open('/tmp/replicas-mark', 'w').write(%q)\nprint('hello from', 6 * 7)", mark)})
	if x.Stdout != "hello from 42\n" {
		t.Errorf("execute through replica 1: stdout %q, want %q", x.Stdout, "hello from 42\n")
	}
	// Replica 0 holds no sandbox of the session (replica 1 started it):
	// its metrics read the one the record names, on this host.
	// The kubernetes runtime reads no usage of a Pod yet (it is no
	// runtime.StatsReader): there the answer has the sandbox's state and
	// no reading.
	if m, err := cl.c(0).SessionMetrics(ctx, sid, time.Time{}); err != nil {
		t.Errorf("metrics through replica 0 of the sandbox replica 1 started: %v", err)
	} else if c := m.Current; m.Sandbox != api.SandboxRunning || cl.kube == nil && (c == nil || c.MemoryUsedBytes == 0 || c.CPUCount == 0 || c.DiskLimitBytes == 0) {
		t.Errorf("metrics through replica 0 of the sandbox replica 1 started: %+v (current %+v)", m, c)
	}

	var streamed strings.Builder
	var mu sync.Mutex
	x, err := cl.c(2).ExecuteStream(ctx, sid, api.ExecuteRequest{Code: "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.2)"},
		func(stream, text string) {
			mu.Lock()
			defer mu.Unlock()
			if stream == api.EventStdout {
				streamed.WriteString(text)
			}
		})
	const ticks = "tick 0\ntick 1\ntick 2\n"
	if err != nil || x.Status != api.ExecCompleted || x.Stdout != ticks || streamed.String() != ticks {
		t.Fatalf("streamed execute through replica 2: %s; streamed stdout %q, want %q\nsandboxes: %s\nlogs:\n%s",
			describeExec(x, err), streamed.String(), ticks, describe(cl.sandboxesOf(t, sid)), cl.logs(40, sid))
	}

	// Replica 2 ran that in the sandbox replica 1 started: /tmp is the
	// sandbox's own, not the workspace.
	x, err = cl.c(2).Execute(ctx, sid, api.ExecuteRequest{Code: "print(open('/tmp/replicas-mark').read())"})
	if err != nil || x.Status != api.ExecCompleted || x.Stdout != mark+"\n" {
		t.Errorf("replica 2 does not run code in the sandbox replica 1 started (and wrote /tmp/replicas-mark in): %s\nsandboxes now: %s\nlogs:\n%s",
			describeExec(x, err), describe(cl.sandboxesOf(t, sid)), cl.logs(20, sid))
	}

	// A long poll for the result of an execution another replica runs
	// waits for it.
	sub, err := cl.c(0).Submit(ctx, sid, api.ExecuteRequest{Code: "import time\ntime.sleep(1.5)\nprint('waited')"})
	if err != nil {
		t.Fatalf("submit through replica 0: %v", err)
	}
	polled := time.Now()
	x, err = cl.c(2).GetResult(ctx, sub.ExecutionID, true, 30*time.Second)
	if err != nil || x.Status != api.ExecCompleted || x.Stdout != "waited\n" {
		t.Errorf("a 30s long poll through replica 2 for the result of a 1.5s execution replica 0 runs answered after %v: %s",
			time.Since(polled).Round(time.Millisecond), describeExec(x, err))
	}
	if x, err = cl.c(0).WaitResult(ctx, sub.ExecutionID); err != nil || x.Status != api.ExecCompleted || x.Stdout != "waited\n" {
		t.Fatalf("the execution through replica 0: %s\nlogs:\n%s", describeExec(x, err), cl.logs(20, sid))
	}

	data := make([]byte, 1<<20+123)
	rand.Read(data)
	if _, err := cl.c(1).Upload(ctx, sid, client.UploadOptions{Path: "in/data.bin"}, client.UploadFile{Name: "data.bin", Reader: bytes.NewReader(data)}); err != nil {
		t.Fatalf("upload through replica 1: %v\nlogs:\n%s", err, cl.logs(40, sid))
	}
	var got bytes.Buffer
	if _, err := cl.c(2).Download(ctx, sid, "in/data.bin", &got); err != nil || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("download through replica 2 of what replica 1 took: %d bytes (want %d), equal %v, %v\nlogs:\n%s",
			got.Len(), len(data), bytes.Equal(got.Bytes(), data), err, cl.logs(40, sid))
	}
	list, err := cl.c(0).ListFiles(ctx, sid, client.ListFilesOptions{Path: "in"})
	if err != nil || len(list.Files) != 1 || list.Files[0].Name != "data.bin" || list.Files[0].Size != int64(len(data)) {
		t.Fatalf("list through replica 0: %+v %v", list, err)
	}

	del, err := cl.c(2).DeleteSession(ctx, sid)
	if err != nil || del.Status != api.StatusTerminated {
		t.Fatalf("delete through replica 2: %+v %v\nlogs:\n%s", del, err, cl.logs(40, sid))
	}
	for _, i := range []int{0, 1} {
		s, err := cl.c(i).GetSession(ctx, sid)
		if err == nil && s.Status != api.StatusTerminated || err != nil && !client.IsNotFound(err) {
			t.Errorf("replica %d after the delete through replica 2: %+v %v, want 404 or terminated", i, s, err)
		}
		x, err := cl.c(i).Execute(ctx, sid, api.ExecuteRequest{Code: "print(1)"})
		if err == nil {
			t.Errorf("replica %d ran code in the deleted session: %s", i, describeExec(x, nil))
		}
	}
	// No replica keeps (or starts) a sandbox for it.
	var left []runtime.Info
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if left = cl.sandboxesOf(t, sid); len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("sandboxes of the deleted session still in the runtime 10s later: %s\nlogs:\n%s", describe(left), cl.logs(40, sid))
	}
}

// 2. One session id created 100 times at once through all three
// replicas is one session with one sandbox, which every replica runs code
// in.
func (cl *cluster) testConcurrentCreates(t *testing.T) {
	cl.ensureAll(t)
	const sid = "concurrent"
	const n = 100
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type answer struct {
		replica int
		s       *api.Session
		created bool
		err     error
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for k := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			i := k % 3
			c := cl.c(i)
			<-start
			s, created, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid, TemplateID: "python", WarmUp: true})
			answers[k] = answer{i, s, created, err}
		}()
	}
	close(start)
	wg.Wait()

	// Sum the answers up by replica and outcome.
	counts := map[string]int{}
	created := 0
	var first *api.Session
	sameSession := true
	for _, a := range answers {
		var what string
		switch {
		case a.err != nil:
			what = a.err.Error()
		case a.created:
			created++
			what = "201 created"
		default:
			what = "200 existing"
		}
		if a.err == nil {
			if a.s.SessionID != sid {
				sameSession = false
			}
			if first == nil {
				first = a.s
			} else if !a.s.CreatedAt.Equal(first.CreatedAt) {
				sameSession = false
			}
		}
		counts[fmt.Sprintf("replica %d: %s", a.replica, what)]++
	}
	var summary []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		summary = append(summary, fmt.Sprintf("  %3d × %s", counts[k], k))
	}
	t.Logf("answers to %d creates of %s:\n%s", n, sid, strings.Join(summary, "\n"))
	failed := false
	if created != 1 || !sameSession || slices.ContainsFunc(answers, func(a answer) bool { return a.err != nil }) {
		failed = true
		t.Errorf("%d creates of one id: %d answered created, same session in every answer: %v; want every create 200/201, exactly one 201, one session:\n%s\nlogs:\n%s",
			n, created, sameSession, strings.Join(summary, "\n"), cl.logs(40, sid, `"level":"ERROR"`))
	}

	// Exactly one session of that id, and it comes up.
	list, err := cl.c(1).ListSessions(ctx, client.ListSessionsOptions{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, s := range list.Sessions {
		if s.SessionID == sid {
			found++
		}
	}
	if found != 1 {
		t.Errorf("%d sessions %s listed, want 1", found, sid)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		s, err := cl.c(0).GetSession(ctx, sid)
		if err == nil && s.Status == api.StatusRunning {
			break
		}
		if err == nil && (s.Status == api.StatusError || s.Status == api.StatusTerminated) || time.Now().After(deadline) {
			t.Fatalf("session %s after the creates: %s\nsandboxes: %s\nlogs:\n%s",
				sid, cl.getAll(sid), describe(cl.sandboxesOf(t, sid)), cl.logs(40, sid))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Starts that were under way have ended by now.
	time.Sleep(3 * time.Second)
	if sbs := cl.sandboxesOf(t, sid); len(sbs) > 1 {
		failed = true
		t.Errorf("%s sandboxes of session %s in the runtime after %d concurrent warm-up creates, want at most 1\nlogs:\n%s",
			describe(sbs), sid, n, cl.logs(40, sid))
	}

	// Every replica runs code in the one sandbox: /tmp is the sandbox's
	// own, not the workspace.
	mark := token()
	cl.exec(t, 0, sid, api.ExecuteRequest{Code: fmt.Sprintf("open('/tmp/replicas-mark', 'w').write(%q)", mark)})
	for _, i := range []int{1, 2} {
		x, err := cl.c(i).Execute(ctx, sid, api.ExecuteRequest{Code: "print(open('/tmp/replicas-mark').read())"})
		if err != nil || x.Status != api.ExecCompleted || x.Stdout != mark+"\n" {
			failed = true
			t.Errorf("replica %d does not run code in the sandbox replica 0 wrote /tmp/replicas-mark in: %s\nsandboxes now: %s",
				i, describeExec(x, err), describe(cl.sandboxesOf(t, sid)))
		}
	}
	if failed {
		t.Logf("logs about %s:\n%s", sid, cl.logs(40, sid))
	}
}

// fingerprintCode describes every entry of the workspace: type and mode,
// owner, a link's target, a file's size, mtime, SHA-256 and the SHA-256 of
// each of its 4 MiB pieces (what the snapshot store keys its chunks by).
const fingerprintCode = `
import hashlib, os, stat
out = {}
for root, dirs, files in os.walk("/workspace"):
    for name in dirs + files:
        p = os.path.join(root, name)
        st = os.lstat(p)
        e = {"mode": stat.filemode(st.st_mode), "uid": st.st_uid, "gid": st.st_gid}
        if stat.S_ISLNK(st.st_mode):
            e["link"] = os.readlink(p)
        elif stat.S_ISREG(st.st_mode):
            data = open(p, "rb").read()
            e["size"] = len(data)
            e["mtime"] = st.st_mtime_ns
            e["sha256"] = hashlib.sha256(data).hexdigest()
            e["chunks"] = [hashlib.sha256(data[i:i + (4 << 20)]).hexdigest() for i in range(0, len(data), 4 << 20)]
        out[p] = e
return out
`

// plantTree writes files of several modes, a nested directory, links and
// a few MB of random data.
const plantTree = `
set -e
cd /workspace
mkdir -p tree/nested/deeper tree/empty
head -c 5000000 /dev/urandom > tree/random.bin
printf '#!/bin/sh\necho run\n' > tree/run.sh
chmod 0755 tree/run.sh
echo secret > tree/nested/secret.txt
chmod 0600 tree/nested/secret.txt
echo leaf > tree/nested/deeper/leaf.txt
chmod 0700 tree/nested/deeper
: > tree/zero
ln -s nested/deeper/leaf.txt tree/link
ln -s /etc/hostname tree/outside
`

type entry struct {
	Mode   string   `json:"mode"`
	UID    int      `json:"uid"`
	GID    int      `json:"gid"`
	Link   string   `json:"link,omitempty"`
	Size   int64    `json:"size,omitempty"`
	Mtime  int64    `json:"mtime,omitempty"`
	SHA256 string   `json:"sha256,omitempty"`
	Chunks []string `json:"chunks,omitempty"`
}

func (cl *cluster) fingerprint(t *testing.T, i int, sid string) map[string]entry {
	t.Helper()
	x := cl.exec(t, i, sid, api.ExecuteRequest{Code: fingerprintCode})
	var fp map[string]entry
	if err := json.Unmarshal(x.ReturnValue, &fp); err != nil {
		t.Fatalf("fingerprint through replica %d: %v: %s", i, err, x.ReturnValue)
	}
	return fp
}

// diff says how two fingerprints differ.
func diff(before, after map[string]entry) string {
	var out []string
	for _, p := range slices.Sorted(maps.Keys(before)) {
		a, ok := after[p]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("  %s: gone (was %+v)", p, before[p]))
		case !equalEntry(a, before[p]):
			out = append(out, fmt.Sprintf("  %s: %+v, was %+v", p, a, before[p]))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[p]; !ok {
			out = append(out, fmt.Sprintf("  %s: new %+v", p, after[p]))
		}
	}
	return strings.Join(out, "\n")
}

func equalEntry(a, b entry) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// 3. A session written through one replica, hibernated through another
// and restored through the third has every byte, mode and link it had;
// the hibernated workspace is in the bucket in between.
func (cl *cluster) testHibernateRestoreAcross(t *testing.T) {
	cl.ensureAll(t)
	const sid = "across"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl.create(t, 0, api.CreateSessionRequest{SessionID: sid})
	cl.exec(t, 0, sid, api.ExecuteRequest{Language: "bash", Code: plantTree})
	before := cl.fingerprint(t, 0, sid)
	for p, want := range map[string]string{
		"/workspace/tree/run.sh":            "-rwxr-xr-x",
		"/workspace/tree/nested/secret.txt": "-rw-------",
		"/workspace/tree/nested/deeper":     "drwx------",
		"/workspace/tree/link":              "lrwxrwxrwx",
	} {
		if before[p].Mode != want {
			t.Fatalf("planted tree: %s is %+v, want mode %s", p, before[p], want)
		}
	}
	if big := before["/workspace/tree/random.bin"]; big.Size != 5000000 || len(big.Chunks) != 2 {
		t.Fatalf("planted tree: random.bin is %+v", big)
	}

	s, err := cl.c(1).HibernateSession(ctx, sid)
	if err != nil || s.Status != api.StatusHibernated {
		t.Fatalf("hibernate through replica 1: %+v %v (every replica: %s)\nlogs:\n%s", s, err, cl.getAll(sid), cl.logs(40, sid))
	}
	if sbs := cl.sandboxesOf(t, sid); len(sbs) > 0 {
		t.Errorf("sandboxes of the hibernated session still in the runtime: %s", describe(sbs))
	}
	// The bucket has its manifest and every chunk of the random file.
	keys := map[string]bool{}
	for _, prefix := range []string{"snapshots/manifests/default/" + sid + "/", "snapshots/tenants/default/chunks/"} {
		err := cl.blobs.List(ctx, prefix, func(info blob.Info) error { keys[info.Key] = true; return nil })
		if err != nil {
			t.Fatalf("listing the bucket under %s: %v", prefix, err)
		}
	}
	var missing []string
	want := []string{"snapshots/manifests/default/" + sid + "/hibernated"}
	for _, sum := range before["/workspace/tree/random.bin"].Chunks {
		want = append(want, "snapshots/tenants/default/chunks/"+sum[:2]+"/"+sum)
	}
	for _, k := range want {
		if !keys[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("not in the bucket (under %s/) after the hibernation: %v; it has %d objects there: %v",
			blobPrefix, missing, len(keys), slices.Sorted(maps.Keys(keys)))
	}

	after := cl.fingerprint(t, 2, sid)
	if d := diff(before, after); d != "" {
		t.Errorf("workspace changed across hibernation through replica 1 and restore through replica 2:\n%s", d)
	}
	if s, err := cl.c(0).GetSession(ctx, sid); err != nil || s.Status != api.StatusRunning {
		t.Errorf("after the restore through replica 2, replica 0 says %+v %v", s, err)
	}
	if sbs := cl.sandboxesOf(t, sid); len(sbs) != 1 {
		t.Errorf("after the restore: %s sandboxes, want 1", describe(sbs))
	}
}

// leader returns the index of the replica that holds the reaper's lease,
// waiting up to within for one to hold it.
func (cl *cluster) leader(t *testing.T, within time.Duration) (int, string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		holder, live, err := cl.store.LeaseHolder(context.Background(), "reaper")
		if err != nil {
			t.Fatalf("reading the reaper's lease: %v", err)
		}
		if live {
			if parts := strings.Split(holder, "/"); len(parts) == 3 {
				if pid, err := strconv.Atoi(parts[1]); err == nil {
					for i := range cl.reps {
						if r := cl.rep(i); r.alive() && r.cmd.Process.Pid == pid {
							return i, holder
						}
					}
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live replica holds the reaper's lease after %v: holder %q, live %v", within, holder, live)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// 4. When the replica running the reaper dies, another takes over, and
// an idle session is paused and hibernated all the same (on Kubernetes,
// hibernated); a third replica
// then restores it with its files.
func (cl *cluster) testReaperFailover(t *testing.T) {
	cl.ensureAll(t)
	const sid = "failover"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	lead, holder := cl.leader(t, leaderTTL+2*reapInterval)
	var survivors []int
	for i := range cl.reps {
		if i != lead {
			survivors = append(survivors, i)
		}
	}
	a, b := survivors[0], survivors[1]
	t.Logf("the reaper runs on replica %d (%s); the session goes through replica %d, then %d", lead, holder, a, b)

	mark := token()
	cl.create(t, a, api.CreateSessionRequest{SessionID: sid, IdleTimeout: 2, HibernateTimeout: 4})
	cl.exec(t, a, sid, api.ExecuteRequest{Code: fmt.Sprintf("open('/workspace/mark.txt', 'w').write(%q)", mark)})
	killed := time.Now()
	cl.stop(t, lead, syscall.SIGKILL)

	// Paused, then hibernated, by whichever survivor takes the lease.
	within := leaderTTL + reapInterval + 2*time.Second + reapInterval + 20*time.Second
	var seen []string
	deadline := killed.Add(within)
	for {
		s, err := cl.c(a).GetSession(ctx, sid)
		if err != nil {
			t.Fatalf("get through replica %d: %v", a, err)
		}
		if len(seen) == 0 || seen[len(seen)-1] != s.Status {
			seen = append(seen, s.Status)
			t.Logf("%5.1fs after the kill: %s", time.Since(killed).Seconds(), s.Status)
		}
		if s.Status == api.StatusHibernated {
			break
		}
		if time.Now().After(deadline) {
			h, live, _ := cl.store.LeaseHolder(ctx, "reaper")
			t.Fatalf("session %s went through %v in the %v after the leader's kill, never hibernated; the reaper's lease: %q (live %v); sandboxes: %s\nlogs:\n%s",
				sid, seen, within, h, live, describe(cl.sandboxesOf(t, sid)), cl.logs(40, sid, "reaper"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A Pod cannot be frozen: on Kubernetes the reaper hibernates an idle
	// session at once instead of pausing it first (session.Reaper), so
	// the pause is runc's alone. (A hibernation still shows the session
	// paused while it saves the workspace, on either runtime.)
	if cl.kube == nil && !slices.Contains(seen, api.StatusPaused) {
		t.Errorf("session %s went %v: never paused before it hibernated", sid, seen)
	}
	newLead, h := cl.leader(t, time.Second)
	t.Logf("the reaper runs on replica %d (%s) now", newLead, h)
	if sbs := cl.sandboxesOf(t, sid); len(sbs) > 0 {
		t.Errorf("sandboxes of the hibernated session still in the runtime: %s", describe(sbs))
	}

	x := cl.exec(t, b, sid, api.ExecuteRequest{Code: "print(open('/workspace/mark.txt').read())"})
	if x.Stdout != mark+"\n" {
		t.Errorf("restored through replica %d: mark.txt has %q, want %q", b, x.Stdout, mark)
	}
	if s, err := cl.c(a).GetSession(ctx, sid); err != nil || s.Status != api.StatusRunning {
		t.Errorf("after the restore: %+v %v", s, err)
	}
}

// 5. A replica stopping and starting again while others run code breaks
// none of their executions.
func (cl *cluster) testRestartWhileRunning(t *testing.T) {
	cl.ensureAll(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sessions := map[string]int{"restart-a": 0, "restart-b": 1} // session: its replica
	for sid, i := range sessions {
		cl.create(t, i, api.CreateSessionRequest{SessionID: sid})
		cl.exec(t, i, sid, api.ExecuteRequest{Code: "print('warm')"})
	}
	type run struct {
		sid, tag string
		replica  int
		x        *api.Execution
		err      error
	}
	var runs []*run
	for sid, i := range sessions {
		for k := range 2 {
			runs = append(runs, &run{sid: sid, tag: fmt.Sprintf("%s-%d", sid, k), replica: i})
		}
	}
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.x, r.err = cl.c(r.replica).Execute(ctx, r.sid, api.ExecuteRequest{Code: fmt.Sprintf("import time\ntime.sleep(3)\nprint('done', %q)", r.tag)})
		}()
	}
	time.Sleep(700 * time.Millisecond)
	cl.stop(t, 2, syscall.SIGTERM)
	cl.start(t, 2)
	wg.Wait()
	for _, r := range runs {
		if r.err != nil || r.x.Status != api.ExecCompleted || r.x.Stdout != "done "+r.tag+"\n" {
			t.Errorf("execution in %s through replica %d while replica 2 restarted: %s\nlogs:\n%s",
				r.sid, r.replica, describeExec(r.x, r.err), cl.logs(20, r.sid))
		}
	}
	for sid := range sessions {
		if s, err := cl.c(2).GetSession(ctx, sid); err != nil || s.Status != api.StatusRunning {
			t.Errorf("the restarted replica 2 says of %s: %+v %v", sid, s, err)
		}
		if sbs := cl.sandboxesOf(t, sid); len(sbs) != 1 || sbs[0].State != runtime.StateRunning {
			t.Errorf("after replica 2's restart, session %s has sandboxes %s, want 1 running", sid, describe(sbs))
		}
	}
}

// 6. A replica killed in the middle of an execution leaves the session
// usable through the others, with its files, and its execution ends
// failed, not running for ever.
func (cl *cluster) testKillMidExecution(t *testing.T) {
	cl.ensureAll(t)
	const sid = "killed"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	mark := token()
	cl.create(t, 1, api.CreateSessionRequest{SessionID: sid})
	cl.exec(t, 1, sid, api.ExecuteRequest{Code: fmt.Sprintf("open('/workspace/mark.txt', 'w').write(%q)", mark)})
	sub, err := cl.c(1).Submit(ctx, sid, api.ExecuteRequest{Code: "import time\ntime.sleep(30)\nprint('woke up')", Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		x, err := cl.c(1).GetExecution(ctx, sub.ExecutionID)
		if err == nil && x.Status == api.ExecRunning {
			break
		}
		if err != nil || time.Now().After(deadline) || x.Status != api.ExecPending && x.Status != api.ExecSubmitted {
			t.Fatalf("the long execution through replica 1: %s", describeExec(x, err))
		}
	}
	time.Sleep(300 * time.Millisecond) // the code is sleeping
	killed := time.Now()
	cl.stop(t, 1, syscall.SIGKILL)

	x := cl.exec(t, 0, sid, api.ExecuteRequest{Code: "print(open('/workspace/mark.txt').read())"})
	if x.Stdout != mark+"\n" {
		t.Errorf("through replica 0 after replica 1's kill: mark.txt has %q, want %q", x.Stdout, mark)
	}
	mark2 := token()
	cl.exec(t, 2, sid, api.ExecuteRequest{Code: fmt.Sprintf("print(open('/workspace/mark.txt').read())\nopen('/workspace/mark2.txt', 'w').write(%q)", mark2)})
	x = cl.exec(t, 0, sid, api.ExecuteRequest{Code: "print(open('/workspace/mark.txt').read() + ' ' + open('/workspace/mark2.txt').read())"})
	if want := mark + " " + mark2 + "\n"; x.Stdout != want {
		t.Errorf("through replica 0 after writes through 2: %q, want %q", x.Stdout, want)
	}

	if sbs := cl.sandboxesOf(t, sid); len(sbs) != 1 {
		t.Errorf("after executions through replicas 0 and 2: %s sandboxes of the session, want 1\nlogs:\n%s", describe(sbs), cl.logs(20, sid))
	}

	// The dead replica's execution is failed once its liveness lease has
	// run out and the reaper's replica (after a failover, if the dead one
	// ran it) has noticed.
	// Generous: if the survivors' executions above waited for the killed
	// one's sandbox to be free, they took some of it.
	within := replicaTTL + beatEvery + leaderTTL + 30*time.Second
	var seen []string
	for k := 0; ; k++ {
		i := []int{0, 2}[k%2]
		x, err := cl.c(i).GetExecution(ctx, sub.ExecutionID)
		if err != nil {
			t.Fatalf("the killed replica's execution through replica %d: %v", i, err)
		}
		if len(seen) == 0 || seen[len(seen)-1] != x.Status {
			seen = append(seen, x.Status)
			t.Logf("%5.1fs after the kill: execution %s", time.Since(killed).Seconds(), x.Status)
		}
		if x.Status != api.ExecPending && x.Status != api.ExecRunning && x.Status != api.ExecSubmitted {
			if x.Status != api.ExecFailed {
				t.Errorf("the killed replica's execution ended %s (%+v), want failed", x.Status, x.Error)
			}
			if x, err := cl.c(i).GetResult(ctx, sub.ExecutionID, false, 0); err == nil && x.Error != nil {
				t.Logf("its error: %s: %s", x.Error.Type, x.Error.Message)
			}
			break
		}
		if time.Since(killed) > within {
			t.Fatalf("the killed replica's execution is still %s %v after the kill (seen %v)\nlogs:\n%s",
				x.Status, within, seen, cl.logs(30, sub.ExecutionID, "replica", "executions"))
		}
		time.Sleep(250 * time.Millisecond)
	}
}
