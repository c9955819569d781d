#!/usr/bin/env bash
# The test of scripts/kube.sh: up (twice: the second must change nothing),
# a Pod of a locally built image gets Ready and an IP the host reaches,
# then down, and the machine is as it was before up: no process, mount,
# cgroup, link, iptables chain, directory or kernel setting of the cluster
# remains. Root; refuses to run while a cluster is up (others may be
# using it). Leaves the cached binaries in place.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBE=scripts/kube.sh
ROOT=/var/lib/sbx-kube
KUBECTL=$ROOT/bin/kubectl
NS=sbx-sandboxes
fail() {
	echo "kube-test: FAIL: $*" >&2
	exit 1
}
say() { echo "kube-test: $*" >&2; }
set -E
trap 'say "failed: line $LINENO: $BASH_COMMAND"' ERR

[ "$(id -u)" = 0 ] || fail "run as root"
if $KUBE status >/dev/null 2>&1; then
	fail "a cluster is up; others may be using it (scripts/kube.sh down first)"
fi
# A half-made cluster (an up that failed) is cleaned first: the baseline
# must be the machine without the cluster.
$KUBE down

# traces prints what the cluster may leave on the machine, one line each;
# the baseline is taken the same way, so the machine's other work (runc
# sandboxes of parallel tests) does not count.
traces() {
	local t
	for t in filter nat mangle raw; do
		command -v iptables >/dev/null && iptables -t $t -S 2>/dev/null | grep -E 'KUBE-|CNI-' | sed "s/^/iptables $t: /" || true
		command -v ip6tables >/dev/null && ip6tables -t $t -S 2>/dev/null | grep -E 'KUBE-|CNI-' | sed "s/^/ip6tables $t: /" || true
	done
	ip -o link show | awk -F': ' '{print "link: " $2}' | grep -E 'sbxkube|cni|veth' || true
	command -v ipset >/dev/null && { ipset list -n 2>/dev/null | grep -E '^(KUBE-|kube-router)' | sed 's/^/ipset: /' || true; }
	ip -4 addr show 2>/dev/null | grep -E 'inet 10\.244\.0\.1/' | sed 's/^/address: /' || true
	awk '{print "mount: " $5}' /proc/self/mountinfo | grep -E '/var/lib/kubelet|/var/lib/sbx-kube|/run/sbx-kube|/run/netns/cni-|/var/lib/cni' || true
	find /sys/fs/cgroup -maxdepth 3 -type d \( -name 'kubepods*' -o -name 'burstable' -o -name 'besteffort' \) 2>/dev/null | sed 's/^/cgroup: /'
	for t in /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/sbx-kube \
		$ROOT/containerd $ROOT/etcd $ROOT/pki $ROOT/kubeconfig $ROOT/pids $ROOT/volumes /opt/containerd /opt/cni \
		/etc/kubernetes /etc/cni /var/lib/containerd /run/containerd /var/lib/etcd; do
		[ -e "$t" ] && echo "path: $t"
	done
	for t in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops \
		kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward \
		net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables net.netfilter.nf_conntrack_max; do
		echo "sysctl: $t=$(sysctl -n $t)"
	done
	# Processes whose command line names the cluster's directories.
	local p
	for p in /proc/[0-9]*; do
		{ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qE '/var/lib/sbx-kube|/run/sbx-kube|kube.sh volumes-loop' &&
			echo "process: $({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | cut -c1-80)"
	done
	return 0
}

before=$(mktemp)
after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
traces | sort >"$before"

start=$SECONDS
SBX_KUBE_NO_IMAGES=1 $KUBE up
say "up took $((SECONDS - start)) s"
pids=$(cat $ROOT/pids/*.pid | sort | tr '\n' ' ')
SBX_KUBE_NO_IMAGES=1 $KUBE up
[ "$(cat $ROOT/pids/*.pid | sort | tr '\n' ' ')" = "$pids" ] || fail "a second up restarted processes"
$KUBE status >/dev/null || fail "status is not 0 after up"
[ "$(stat -c %a $ROOT/kubeconfig)" = 600 ] || fail "the admin kubeconfig is readable by others"

image=$(mktemp --suffix .tar)
$KUBE image scripts/kube/hello sbx.test/hello:1 "$image"
$KUBE import "$image"
rm -f "$image"
$KUBECTL --kubeconfig $ROOT/kubeconfig -n $NS apply -f - >/dev/null <<-'EOF'
	apiVersion: v1
	kind: Pod
	metadata:
	  name: hello
	spec:
	  terminationGracePeriodSeconds: 0
	  automountServiceAccountToken: false
	  enableServiceLinks: false
	  containers:
	  - name: hello
	    image: sbx.test/hello:1
	    imagePullPolicy: Never
	    securityContext:
	      runAsUser: 65534
	      runAsNonRoot: true
	      allowPrivilegeEscalation: false
	      readOnlyRootFilesystem: true
	      capabilities: {drop: [ALL]}
	    resources:
	      limits: {memory: 64Mi, cpu: 200m}
	EOF
$KUBECTL --kubeconfig $ROOT/kubeconfig -n $NS wait --for=condition=Ready pod/hello --timeout=120s >/dev/null ||
	fail "the hello Pod did not get Ready"
ip=$($KUBECTL --kubeconfig $ROOT/kubeconfig -n $NS get pod hello -o jsonpath='{.status.podIP}')
[[ $ip == 10.244.0.* ]] || fail "pod IP $ip is not in 10.244.0.0/24"
got=$(curl -sS --max-time 10 "http://$ip:8080/") || fail "the host cannot reach the Pod at $ip:8080"
[ "$got" = "hello from hello" ] || fail "the Pod answered '$got'"
say "host reached the Pod at $ip:8080"

# The network a deployment needs (scripts/kube-net-check.sh): Services,
# DNS, the API server from a Pod, and the NetworkPolicies enforced.
scripts/kube-net-check.sh

# The node's default namespace is left alone: nothing of the test in it.
[ -z "$($KUBECTL --kubeconfig $ROOT/kubeconfig -n default get pods -o name)" ] || fail "Pods left in default"

$KUBE down
traces | sort >"$after"
if ! diff -u "$before" "$after"; then
	fail "down left the traces above"
fi
[ -x $ROOT/bin/kubectl ] || fail "down removed the cached binaries"
$KUBE status >/dev/null && fail "status is 0 after down"
$KUBE down # idempotent
say "PASS"
