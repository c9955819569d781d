//go:build integration

package app_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/execution"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
)

// The kube-only subtests of the replica suite (TestReplicasKubernetes):
// what happens to sandbox Pods outside sbx. A Pod is deleted by an
// operator or evicted by its node, and outlives the replica that made
// it; the workspace is its checkpoint in the bucket, which every
// completed call brings up to date (kube.Volumes).

// sweepEvery is internal/session's: how often the leader looks for the
// sandboxes of dead replicas that no record names.
const sweepEvery = time.Minute

// podOf returns the one running sandbox of session sid, or fails t.
func (cl *cluster) podOf(t *testing.T, sid string) runtime.Info {
	t.Helper()
	sbs := cl.sandboxesOf(t, sid)
	if len(sbs) != 1 || sbs[0].State != runtime.StateRunning {
		t.Fatalf("session %s has sandboxes %s, want 1 running\nlogs:\n%s", sid, describe(sbs), cl.logs(20, sid))
	}
	return sbs[0]
}

// deletePod deletes sandbox id's Pod from outside sbx, as `kubectl delete
// pod --force --grace-period=0` does, and waits until the API server no
// longer has it and its executor no longer answers: the API forgets a
// force-deleted Pod at once, while the kubelet stops its container a
// moment later, and a call in between still reaches it (which the
// session must tell apart: testPodDeletedRunning).
func (cl *cluster) deletePod(t *testing.T, id string) {
	t.Helper()
	waitGone(t, cl.deletePodObject(t, id))
}

// waitGone waits until nothing answers at addr, a deleted Pod's executor.
func waitGone(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("the executor of a deleted pod still answers at %s a minute later", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deletePodObject force-deletes sandbox id's Pod and waits until the API
// server no longer has it; it returns the executor's address the Pod had.
func (cl *cluster) deletePodObject(t *testing.T, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods := cl.kube.Client.CoreV1().Pods(cl.kube.Namespace)
	name := kube.PodName(id)
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	addr := net.JoinHostPort(p.Status.PodIP, "7071")
	zero := int64(0)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("deleting pod %s: %v", name, err)
	}
	for {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			t.Logf("pod %s (sandbox %s) deleted", name, id)
			return addr
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s still there a minute after its forced delete: %v", name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// replicaNamed returns the index of the live replica whose name
// (host/pid/random, the sbx.replica label of the sandboxes it makes) is
// name, or -1.
func (cl *cluster) replicaNamed(name string) int {
	parts := strings.Split(name, "/")
	if len(parts) != 3 {
		return -1
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil {
		return -1
	}
	for i := range cl.reps {
		if r := cl.rep(i); r.alive() && r.cmd.Process.Pid == pid {
			return i
		}
	}
	return -1
}

// plantFiles writes a file by upload (through replica up) and one by code
// (through replica code), and returns what a reading of both answers.
func (cl *cluster) plantFiles(t *testing.T, sid string, up, code int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data := make([]byte, 300<<10+17)
	rand.Read(data)
	if _, err := cl.c(up).Upload(ctx, sid, client.UploadOptions{Path: "in/up.bin"}, client.UploadFile{Name: "up.bin", Reader: bytes.NewReader(data)}); err != nil {
		t.Fatalf("upload through replica %d: %v\nlogs:\n%s", up, err, cl.logs(20, sid))
	}
	mark := token()
	cl.exec(t, code, sid, api.ExecuteRequest{Code: fmt.Sprintf(
		"import os\nos.makedirs('/workspace/out', exist_ok=True)\nopen('/workspace/out/code.txt', 'w').write(%q)\nopen('/tmp/pod-mark', 'w').write('here')", mark)})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]) + " " + mark
}

// readFilesCode answers what plantFiles wrote, and whether /tmp (the
// Pod's own, not the workspace) still has its mark.
const readFilesCode = `
import hashlib, os
up = hashlib.sha256(open('/workspace/in/up.bin', 'rb').read()).hexdigest()
return {"files": up + " " + open('/workspace/out/code.txt').read(), "tmp": os.path.exists('/tmp/pod-mark')}
`

type readFiles struct {
	Files string `json:"files"`
	Tmp   bool   `json:"tmp"`
}

func (cl *cluster) readFiles(t *testing.T, i int, sid string) readFiles {
	t.Helper()
	x := cl.exec(t, i, sid, api.ExecuteRequest{Code: readFilesCode})
	var got readFiles
	if err := json.Unmarshal(x.ReturnValue, &got); err != nil {
		t.Fatalf("reading the files through replica %d: %v: %s", i, err, x.ReturnValue)
	}
	return got
}

// newPod checks that session sid runs in one Pod that is not old.
func (cl *cluster) newPod(t *testing.T, sid string, old runtime.Info) runtime.Info {
	t.Helper()
	now := cl.podOf(t, sid)
	if now.ID == old.ID && now.CreatedAt.Equal(old.CreatedAt) {
		t.Errorf("session %s still names sandbox %s, whose Pod was deleted", sid, old.ID)
	}
	return now
}

// testPodDeleted: a sandbox Pod deleted from outside (forced, no grace)
// between two executions: the next call, through any replica, gets a new
// Pod with every file a completed call wrote (an upload and a file
// written by code).
func (cl *cluster) testPodDeleted(t *testing.T) {
	cl.ensureAll(t)
	sid := "pod-deleted-" + token()
	cl.create(t, 0, api.CreateSessionRequest{SessionID: sid})
	want := cl.plantFiles(t, sid, 1, 2)
	old := cl.podOf(t, sid)
	cl.deletePod(t, old.ID)

	got := cl.readFiles(t, 0, sid)
	if got.Files != want {
		t.Errorf("after the Pod's delete, through replica 0: files %q, want %q\nlogs:\n%s", got.Files, want, cl.logs(30, sid))
	}
	if got.Tmp {
		t.Errorf("after the Pod's delete, /tmp still has the old Pod's mark: the call ran in the old Pod")
	}
	cl.newPod(t, sid, old)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b bytes.Buffer
	if _, err := cl.c(1).Download(ctx, sid, "in/up.bin", &b); err != nil {
		t.Errorf("download through replica 1 from the new Pod: %v", err)
	} else if sum := sha256.Sum256(b.Bytes()); !strings.HasPrefix(want, hex.EncodeToString(sum[:])) {
		t.Errorf("download through replica 1 from the new Pod: %d bytes that are not the upload", b.Len())
	}
	if _, err := cl.c(2).DeleteSession(ctx, sid); err != nil {
		t.Error(err)
	}
}

// testPodAndReplicaKilled: the same with the replica that made the Pod
// killed too: a surviving replica's next call gets a new Pod with the
// files.
func (cl *cluster) testPodAndReplicaKilled(t *testing.T) {
	cl.ensureAll(t)
	sid := "pod-and-replica-" + token()
	cl.create(t, 0, api.CreateSessionRequest{SessionID: sid})
	want := cl.plantFiles(t, sid, 2, 1)
	old := cl.podOf(t, sid)
	maker := cl.replicaNamed(old.Labels[sandbox.LabelReplica])
	if maker < 0 {
		t.Fatalf("sandbox %s names replica %q, which is none of the live ones", old.ID, old.Labels[sandbox.LabelReplica])
	}
	t.Logf("replica %d made sandbox %s; it dies with its Pod", maker, old.ID)
	cl.stop(t, maker, syscall.SIGKILL)
	cl.deletePod(t, old.ID)

	other := (maker + 1) % 3
	got := cl.readFiles(t, other, sid)
	if got.Files != want || got.Tmp {
		t.Errorf("after the Pod's delete and its maker's kill, through replica %d: %+v, want files %q in a new Pod\nlogs:\n%s",
			other, got, want, cl.logs(30, sid))
	}
	cl.newPod(t, sid, old)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cl.c(other).DeleteSession(ctx, sid); err != nil {
		t.Error(err)
	}
}

// testPodDeletedMidExecution: a Pod's end while it runs code (an
// eviction, or a forced delete): the execution fails with the
// sandbox-lost error, the next call works in a new Pod, and the files are
// as of the last completed call: what the lost execution wrote is gone
// with its Pod.
func (cl *cluster) testPodDeletedMidExecution(t *testing.T) {
	cl.ensureAll(t)
	sid := "pod-evicted-" + token()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl.create(t, 0, api.CreateSessionRequest{SessionID: sid})
	want := cl.plantFiles(t, sid, 1, 0)
	sub, err := cl.c(2).Submit(ctx, sid, api.ExecuteRequest{Code: "open('/workspace/partial.txt', 'w').write('lost')\n" +
		"print('written', flush=True)\nimport time\ntime.sleep(120)", Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	// Delete the Pod once the code has written its file.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		x, err := cl.c(1).GetResult(ctx, sub.ExecutionID, false, 0)
		if err == nil && x.Status == api.ExecRunning && strings.Contains(x.Stdout, "written") {
			break
		}
		if err == nil && x.Status != api.ExecRunning && x.Status != api.ExecPending && x.Status != api.ExecSubmitted || time.Now().After(deadline) {
			t.Fatalf("the long execution never showed it wrote its file: %s", describeExec(x, err))
		}
	}
	old := cl.podOf(t, sid)
	cl.deletePod(t, old.ID)

	x, err := cl.c(0).GetResult(ctx, sub.ExecutionID, true, 90*time.Second)
	if err != nil || x.Status != api.ExecFailed || x.Error == nil || x.Error.Type != execution.ErrTypeSandboxLost {
		t.Errorf("the execution whose Pod was deleted: %s; want failed with %s\nlogs:\n%s",
			describeExec(x, err), execution.ErrTypeSandboxLost, cl.logs(30, sid, sub.ExecutionID))
	}

	got := cl.readFiles(t, 1, sid)
	if got.Files != want || got.Tmp {
		t.Errorf("after the Pod's delete mid-execution, through replica 1: %+v, want files %q in a new Pod", got, want)
	}
	x = cl.exec(t, 2, sid, api.ExecuteRequest{Code: "import os\nreturn os.path.exists('/workspace/partial.txt')"})
	if string(x.ReturnValue) != "false" {
		t.Errorf("the lost execution's file is in the workspace (exists: %s): the files are not as of the last completed call", x.ReturnValue)
	}
	cl.newPod(t, sid, old)
	if _, err := cl.c(0).DeleteSession(ctx, sid); err != nil {
		t.Error(err)
	}
}

// testOrphans: sandbox Pods that no session names are collected by the
// leader, and only by it: one that a replica killed before it recorded
// the start made (here made by the test with that replica's labels) and
// one made by hand with sbx's labels naming a replica that never lived.
// One labelled with a live replica's name (a start it has not recorded
// yet) stays, and so does the killed replica's Pod that a session names:
// the next call through another replica adopts it.
func (cl *cluster) testOrphans(t *testing.T) {
	cl.ensureAll(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lead, holder := cl.leader(t, leaderTTL+2*reapInterval)
	victim := (lead + 1) % 3
	survivor := (lead + 2) % 3
	t.Logf("the leader is replica %d (%s); replica %d makes a sandbox and dies", lead, holder, victim)

	sid := "orphans-" + token()
	cl.create(t, victim, api.CreateSessionRequest{SessionID: sid})
	cl.exec(t, victim, sid, api.ExecuteRequest{Code: "open('/tmp/pod-mark', 'w').write('here')"})
	named := cl.podOf(t, sid)
	if m := cl.replicaNamed(named.Labels[sandbox.LabelReplica]); m != victim {
		t.Fatalf("sandbox %s of the session executed through replica %d names replica %d (%q)", named.ID, victim, m, named.Labels[sandbox.LabelReplica])
	}

	// Pods with the labels of the session's, as a replica makes them,
	// but for the session and the replica.
	orphan := func(what, replica string) runtime.Info {
		t.Helper()
		id := "orphan-" + what + "-" + token()
		labels := maps.Clone(named.Labels)
		labels[sandbox.LabelSession] = id
		labels[sandbox.LabelReplica] = replica
		info, err := cl.rt.Create(ctx, runtime.Spec{ID: id, Image: named.Image, Volume: "default/" + id, Labels: labels})
		if err != nil {
			t.Fatalf("making the %s orphan: %v", what, err)
		}
		return *info
	}
	dead := orphan("dead", named.Labels[sandbox.LabelReplica])
	parts := strings.Split(holder, "/")
	byHand := orphan("byhand", parts[0]+"/999999999/00000000")
	peer := orphan("peer", holder)
	cl.stop(t, victim, syscall.SIGKILL)
	killed := time.Now()

	// The dead replica's lease lapses, then the leader's next sweep
	// collects the two orphans.
	within := replicaTTL + sweepEvery + leaderTTL + 30*time.Second
	gone := func(id string) bool {
		_, err := cl.rt.Inspect(ctx, id)
		return err != nil
	}
	for !gone(dead.ID) || !gone(byHand.ID) {
		if time.Since(killed) > within {
			t.Fatalf("%v after the kill, the orphans are not all collected (dead replica's gone: %v, by hand gone: %v)\nlogs:\n%s",
				within, gone(dead.ID), gone(byHand.ID), cl.logs(30, "orphan", "sweep"))
		}
		time.Sleep(time.Second)
	}
	t.Logf("orphans collected %.1fs after the kill", time.Since(killed).Seconds())
	// By the leader, and no one else.
	for _, id := range []string{dead.ID, byHand.ID} {
		by := cl.logs(10, id)
		if strings.Count(by, "\n") == 0 || strings.Contains(by, "no log lines") {
			t.Errorf("no replica says it destroyed %s", id)
			continue
		}
		for _, line := range strings.Split(strings.TrimRight(by, "\n"), "\n") {
			if strings.Contains(line, "destroy") && !strings.HasPrefix(strings.TrimSpace(line), fmt.Sprintf("r%d.", lead)) {
				t.Errorf("a replica that does not lead destroyed %s: %s", id, line)
			}
		}
	}
	if gone(peer.ID) {
		t.Errorf("the Pod labelled with the live leader's name (a start it has not recorded yet) was destroyed\nlogs:\n%s", cl.logs(10, peer.ID))
	}
	if gone(named.ID) {
		t.Errorf("the dead replica's Pod that session %s names was destroyed\nlogs:\n%s", sid, cl.logs(10, named.ID))
	}

	// The session's Pod is adopted, not replaced: /tmp has its mark.
	x := cl.exec(t, survivor, sid, api.ExecuteRequest{Code: "import os\nreturn os.path.exists('/tmp/pod-mark')"})
	if string(x.ReturnValue) != "true" {
		t.Errorf("through replica %d after replica %d's death, the session runs in a new Pod: the one it names was not adopted", survivor, victim)
	}
	if _, err := cl.c(survivor).DeleteSession(ctx, sid); err != nil {
		t.Error(err)
	}
	if err := cl.rt.Destroy(ctx, peer.ID); err != nil {
		t.Error(err)
	}
}

// conversationCode answers what a run of a conversation reads of its own
// temp area and whether it reaches conversation c1's.
const conversationCode = `
import os
def read(p):
    try:
        return open(p).read()
    except OSError as e:
        return type(e).__name__
return {"own": read('/workspace/uploads/temparea/notes.txt'), "c1": read('/workspace/uploads/c1/temparea/notes.txt')}
`

// testConversations: conversation temp areas in Pods (the executor's
// podviews.go), through the API: each conversation's code reads its own
// uploads at uploads/temparea and not another's, through any replica, and
// so again in the new Pod after the first one is deleted.
func (cl *cluster) testConversations(t *testing.T) {
	cl.ensureAll(t)
	sid := "conversations-" + token()
	cl.create(t, 0, api.CreateSessionRequest{SessionID: sid})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, conv := range []string{"c1", "c2"} {
		if _, err := cl.c(i).Upload(ctx, sid, client.UploadOptions{ConversationID: conv},
			client.UploadFile{Name: "notes.txt", Reader: strings.NewReader("notes of " + conv)}); err != nil {
			t.Fatalf("upload to %s: %v\nlogs:\n%s", conv, err, cl.logs(20, sid))
		}
	}
	check := func(when string) {
		t.Helper()
		for i, conv := range []string{"c1", "c2"} {
			x := cl.exec(t, 2-i, sid, api.ExecuteRequest{Code: conversationCode, ConversationID: conv})
			var got map[string]string
			if err := json.Unmarshal(x.ReturnValue, &got); err != nil {
				t.Fatalf("%s: %v: %s", when, err, x.ReturnValue)
			}
			wantC1 := "notes of c1"
			if conv != "c1" {
				wantC1 = "PermissionError"
			}
			if got["own"] != "notes of "+conv || got["c1"] != wantC1 {
				t.Errorf("%s: conversation %s read %v", when, conv, got)
			}
		}
	}
	check("first Pod")
	old := cl.podOf(t, sid)
	cl.deletePod(t, old.ID)
	check("after the Pod's delete")
	cl.newPod(t, sid, old)
	if _, err := cl.c(1).DeleteSession(ctx, sid); err != nil {
		t.Error(err)
	}
}

// testPodDeletedRunning: a call right after a Pod's forced delete, while
// its container may still run (the API forgets the Pod at once, the
// kubelet stops the container a moment later). Whichever it reaches, an
// execution reported completed has its file kept: one that ran in the
// dying container, whose writes could not be checkpointed, is reported
// lost instead.
func (cl *cluster) testPodDeletedRunning(t *testing.T) {
	cl.ensureAll(t)
	sid := "pod-deleted-running-" + token()
	cl.create(t, 0, api.CreateSessionRequest{SessionID: sid})
	cl.exec(t, 1, sid, api.ExecuteRequest{Code: "print('warm')"})
	old := cl.podOf(t, sid)
	addr := cl.deletePodObject(t, old.ID)
	mark := token()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	x, err := cl.c(1).Execute(ctx, sid, api.ExecuteRequest{Code: fmt.Sprintf("open('/workspace/late.txt', 'w').write(%q)", mark)})
	waitGone(t, addr)
	got := cl.exec(t, 2, sid, api.ExecuteRequest{Code: "import os\nreturn open('/workspace/late.txt').read() if os.path.exists('/workspace/late.txt') else None"})
	switch {
	case err == nil && x.Status == api.ExecCompleted:
		t.Logf("the write reached a live sandbox")
		if string(got.ReturnValue) != strconv.Quote(mark) {
			t.Errorf("an execution reported completed wrote late.txt, which now reads %s\nlogs:\n%s", got.ReturnValue, cl.logs(30, sid))
		}
	case err == nil && x.Error != nil && x.Error.Type == execution.ErrTypeSandboxLost:
		t.Logf("the write reached the dying container and was reported lost: %s", x.Error.Message)
	default:
		t.Errorf("the write: %s\nlogs:\n%s", describeExec(x, err), cl.logs(30, sid))
	}
	if _, err := cl.c(0).DeleteSession(ctx, sid); err != nil {
		t.Error(err)
	}
}
