#!/usr/bin/env bash
# kube-net-check.sh: what a deployment needs of the test cluster's
# network and storage, checked on the running cluster (scripts/kube.sh up;
# scripts/kube-test.sh runs it): ClusterIPs from a Pod and from the host,
# the API server from a Pod through the kubernetes Service, cluster DNS,
# the pids limit, a volume of the default StorageClass, and the
# NetworkPolicies of deploy/kubernetes enforced: a sandbox reaches no other
# sandbox, no Pod in sbx, not the API server nor DNS; only Pods labelled
# as sbx's reach its executor port. Leaves no Pod of its own behind; it
# applies deploy/kubernetes's NetworkPolicies (the namespace sbx it makes
# is deleted again if it made it). Root.
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT=/var/lib/sbx-kube
k() { "$ROOT/bin/kubectl" --kubeconfig "$ROOT/kubeconfig" "$@"; }
fail() {
	echo "kube-net-check: FAIL: $*" >&2
	exit 1
}
say() { echo "kube-net-check: $*" >&2; }
set -E
trap 'say "failed: line $LINENO: $BASH_COMMAND"' ERR

IMAGE=sbx.test/probe:1
SB=sbx-sandboxes
made_sbx=false
k get namespace sbx >/dev/null 2>&1 || made_sbx=true
cleanup() {
	k -n $SB delete pod nc-sandbox-a nc-sandbox-b --ignore-not-found --wait=false >/dev/null 2>&1 || true
	k -n sbx delete pod nc-sbx nc-postgres nc-other nc-volume --ignore-not-found --wait=false >/dev/null 2>&1 || true
	k -n sbx delete service nc-sbx nc-postgres --ignore-not-found >/dev/null 2>&1 || true
	k -n sbx delete pvc nc-volume --ignore-not-found --wait=false >/dev/null 2>&1 || true
	if $made_sbx; then k delete namespace sbx --ignore-not-found --timeout=120s >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

tar=$(mktemp --suffix .tar)
scripts/kube.sh image scripts/kube/probe $IMAGE "$tar"
scripts/kube.sh import "$tar" 2>/dev/null
rm -f "$tar"
$made_sbx && k create namespace sbx >/dev/null

# pod NS NAME LABELS PORT: a probe Pod serving PORT.
pod() {
	k -n "$1" apply -f - >/dev/null <<-END
		apiVersion: v1
		kind: Pod
		metadata:
		  name: $2
		  labels: {$3}
		spec:
		  terminationGracePeriodSeconds: 0
		  containers:
		  - name: probe
		    image: $IMAGE
		    imagePullPolicy: Never
		    args: [serve, "$4"]
		    securityContext:
		      runAsUser: 65534
		      runAsNonRoot: true
		      allowPrivilegeEscalation: false
		      readOnlyRootFilesystem: true
		      capabilities: {drop: [ALL]}
	END
}
pod $SB nc-sandbox-a "app.kubernetes.io/managed-by: sbx, app.kubernetes.io/component: sandbox" 7071
pod $SB nc-sandbox-b "app.kubernetes.io/managed-by: sbx, app.kubernetes.io/component: sandbox" 7071
pod sbx nc-sbx "app.kubernetes.io/name: sbx" 7070
pod sbx nc-postgres "app.kubernetes.io/name: postgres" 5432
pod sbx nc-other "app.kubernetes.io/name: other" 7070
k -n sbx apply -f - >/dev/null <<-END
	apiVersion: v1
	kind: Service
	metadata: {name: nc-sbx}
	spec:
	  selector: {app.kubernetes.io/name: sbx}
	  ports: [{port: 7070}]
	---
	apiVersion: v1
	kind: Service
	metadata: {name: nc-postgres}
	spec:
	  selector: {app.kubernetes.io/name: postgres}
	  ports: [{port: 5432}]
END
k -n $SB wait --for=condition=Ready pod/nc-sandbox-a pod/nc-sandbox-b --timeout=120s >/dev/null
k -n sbx wait --for=condition=Ready pod/nc-sbx pod/nc-postgres pod/nc-other --timeout=120s >/dev/null
podip() { k -n "$1" get pod "$2" -o jsonpath='{.status.podIP}'; }
A=$(podip $SB nc-sandbox-a)
B=$(podip $SB nc-sandbox-b)
PG=$(podip sbx nc-postgres)
SBX=$(podip sbx nc-sbx)
SBX_SVC=$(k -n sbx get service nc-sbx -o jsonpath='{.spec.clusterIP}')
PG_SVC=$(k -n sbx get service nc-postgres -o jsonpath='{.spec.clusterIP}')

# probe NS POD ARGS...: the probe inside a Pod.
probe() {
	local ns=$1 p=$2
	shift 2
	k -n "$ns" exec "$p" -- /probe "$@" 2>&1
}
open_() { probe "$@" >/dev/null || fail "$2: probe ${*:3}: refused, want open: $(probe "$@")"; }
closed() {
	local out
	if out=$(probe "$@"); then fail "$2: probe ${*:3}: $out, want closed"; fi
	return 0
}
# host ADDR PORT: the host's own TCP connection; prints the first line.
host() { timeout 5 bash -c "exec 3<>/dev/tcp/$1/$2 && head -1 <&3"; }

policies=deploy/kubernetes/base/network-policies.yaml
if ! k -n $SB get networkpolicy default-deny >/dev/null 2>&1; then
	# Without the policies a sandbox reaches the other: the closed checks
	# below fail for the policies, not for the probe.
	open_ $SB nc-sandbox-a dial "$B:7071"
	say "without policies a sandbox reaches another (as it should)"
fi
k apply -f $policies >/dev/null
# kube-router applies policies asynchronously: wait until the first one
# holds, then check everything once.
for ((i = 0; i < 60; i++)); do
	probe $SB nc-sandbox-a dial "$B:7071" >/dev/null || break
	sleep 1
done

# Services: a ClusterIP from the host and from a Pod.
[[ "$(host "$SBX_SVC" 7070)" == "probe nc-sbx 7070" ]] || fail "host cannot reach the ClusterIP $SBX_SVC:7070"
open_ sbx nc-sbx dial "$PG_SVC:5432"
# The API server from a Pod, with its service-account token, through
# https://kubernetes.default.svc at 10.0.0.1.
[ "$(probe sbx nc-sbx api)" = 200 ] || fail "GET /api from a Pod: $(probe sbx nc-sbx api)"
# DNS: Service names from a Pod.
got=$(probe sbx nc-sbx lookup kubernetes.default.svc.cluster.local) || true
[ "$got" = 10.0.0.1 ] || fail "DNS: kubernetes.default.svc.cluster.local: $got"
got=$(probe sbx nc-sbx lookup nc-postgres.sbx.svc) || true
[ "$got" = "$PG_SVC" ] || fail "DNS: nc-postgres.sbx.svc: $got"
say "ClusterIPs from the host and a Pod, GET /api from a Pod, DNS: ok"

# NetworkPolicies. Allowed: sbx's Pods to the executor port, sbx to
# PostgreSQL, the host (the node) to a sandbox.
open_ sbx nc-sbx dial "$A:7071"
open_ sbx nc-sbx dial "$PG:5432"
[[ "$(host "$A" 7071)" == "probe nc-sandbox-a 7071" ]] || fail "the host cannot reach a sandbox's executor port"
# Refused: a sandbox to anything; anything but sbx to a sandbox or
# PostgreSQL.
closed $SB nc-sandbox-a dial "$B:7071"
closed $SB nc-sandbox-a dial "$PG:5432"
closed $SB nc-sandbox-a dial "$PG_SVC:5432"
closed $SB nc-sandbox-a dial "$SBX:7070"
closed $SB nc-sandbox-a dial 10.0.0.1:443
closed $SB nc-sandbox-a dial 10.244.0.1:6443
closed $SB nc-sandbox-a dial 10.244.0.1:10250
closed $SB nc-sandbox-a lookup kubernetes.default.svc.cluster.local
closed sbx nc-other dial "$A:7071"
closed sbx nc-other dial "$PG:5432"
closed sbx nc-postgres dial "$A:7071"
say "NetworkPolicies enforced: a sandbox reaches nothing; only sbx reaches a sandbox's 7071"

# The pids limit of a Pod's cgroup.
uid=$(k -n sbx get pod nc-sbx -o jsonpath='{.metadata.uid}')
pids=$(find /sys/fs/cgroup -maxdepth 5 -type d -name "pod$uid" 2>/dev/null | while read -r d; do cat "$d/pids.max" 2>/dev/null || true; done | head -1)
[ "$pids" = 256 ] || fail "a Pod's pids.max is '$pids', want 256"
say "pids.max of a Pod: $pids"

# A claim of the default StorageClass binds, is writable by uid 1000
# (the stores' uid), and its volume is Available again after the claim
# is deleted.
k -n sbx apply -f - >/dev/null <<-END
	apiVersion: v1
	kind: PersistentVolumeClaim
	metadata: {name: nc-volume}
	spec:
	  accessModes: [ReadWriteOnce]
	  resources: {requests: {storage: 1Gi}}
	---
	apiVersion: v1
	kind: Pod
	metadata: {name: nc-volume}
	spec:
	  terminationGracePeriodSeconds: 0
	  securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000}
	  containers:
	  - name: probe
	    image: $IMAGE
	    imagePullPolicy: Never
	    args: [serve, "8080"]
	    volumeMounts: [{name: data, mountPath: /data}]
	  volumes:
	  - name: data
	    persistentVolumeClaim: {claimName: nc-volume}
END
k -n sbx wait --for=condition=Ready pod/nc-volume --timeout=120s >/dev/null || fail "the volume Pod did not start"
probe sbx nc-volume write /data/probe >/dev/null || fail "uid 1000 cannot write its volume: $(probe sbx nc-volume write /data/probe)"
pv=$(k -n sbx get pvc nc-volume -o jsonpath='{.spec.volumeName}')
k -n sbx delete pod nc-volume --wait=true >/dev/null
k -n sbx delete pvc nc-volume --wait=true >/dev/null
for ((i = 0; i < 60; i++)); do
	[ "$(k get pv "$pv" -o jsonpath='{.status.phase}')" = Available ] && break
	sleep 1
done
[ "$(k get pv "$pv" -o jsonpath='{.status.phase}')" = Available ] || fail "volume $pv not Available again after its claim went"
[ -z "$(ls -A "$(k get pv "$pv" -o jsonpath='{.spec.local.path}')")" ] || fail "volume $pv kept the last claim's data"
say "volume $pv: bound, written by uid 1000, emptied and Available again"
say "PASS"
