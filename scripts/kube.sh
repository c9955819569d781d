#!/usr/bin/env bash
# A one-node Kubernetes on this machine, for the kubernetes runtime's tests
# (docs/kubernetes.md says how it is made and why each odd setting).
#
#   scripts/kube.sh up            build or reuse the binaries, start the cluster, wait until a Pod runs
#   scripts/kube.sh status        versions, paths, state; exit 0 only when the node is Ready
#   scripts/kube.sh import FILE.. import docker-archive/OCI tarballs into the node's containerd
#   scripts/kube.sh down          stop everything, remove every trace; keep the cached binaries
#   scripts/kube.sh down --purge  the same, and remove the binaries and the build caches too
#   scripts/kube.sh image DIR TAG OUT  a docker-archive of one of scripts/kube's Go programs
#
# Root, no standard input, idempotent. Everything comes from Debian and the
# Go module proxy: no image registry is ever contacted (Pods must use
# imagePullPolicy Never or IfNotPresent).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

K8S_VERSION=v1.34.4
# Staging modules (k8s.io/api, client-go, ...) are tagged v0.MINOR.PATCH.
K8S_STAGING_VERSION=v0.34.4
ETCD_VERSION=v3.6.4
# The add-ons, each built with `go install MODULE@VERSION` and cached by
# version: kube-router only as the NetworkPolicy controller (the one engine
# the module proxy serves that works with this kernel's iptables and
# ipset; the nftables ones need NFT_QUEUE), CoreDNS as the cluster DNS.
KUBE_ROUTER_VERSION=v2.1.0
COREDNS_VERSION=v1.14.7
ROUTER_BIN=/var/lib/sbx-kube/bin/kube-router-$KUBE_ROUTER_VERSION/kube-router
DNS_BIN=/var/lib/sbx-kube/bin/coredns-$COREDNS_VERSION/coredns
PAUSE_IMAGE=registry.k8s.io/pause:3.10

ROOT=/var/lib/sbx-kube
BIN=$ROOT/bin/$K8S_VERSION-etcd-$ETCD_VERSION
LOGS=$ROOT/logs
PIDS=$ROOT/pids
PKI=$ROOT/pki
ETC=$ROOT/etc
RUN=/run/sbx-kube
CTR_SOCK=$RUN/containerd/containerd.sock
KUBECONFIG_ADMIN=$ROOT/kubeconfig
BRIDGE=sbxkube0
POD_CIDR=10.244.0.0/24
# The bridge's own address, the Pods' gateway: the API server listens
# there (not on loopback, which Pods cannot reach; not on the host's
# other interfaces), so the kubernetes Service (10.0.0.1) leads to it.
GATEWAY=10.244.0.1
SERVICE_CIDR=10.0.0.0/24
DNS_IP=10.0.0.10
API=https://$GATEWAY:6443
# Pids per Pod: a fork bomb in a sandbox stops there. Kubernetes has no
# per-Pod figure, so this is the sandboxes' (sbx's default for a sandbox,
# runtime.DefaultResources.PIDs, is 256) and it holds every Pod of the
# node: PostgreSQL's hundred-odd backends and the Go servers' threads fit.
# A bomb of 1024 spinning processes in a sandbox's one-CPU quota starved
# its executor past its run's timeout on this 2-core machine under load;
# at 256 the runtime contract's fork-bomb test passes.
# The kernel's pid_max here is 32768: the sandbox quota's 100 Pods fit.
POD_PIDS_LIMIT=256
# Static PersistentVolumes of the default StorageClass: directories
# under $VOLUMES, owned by the uid the manifests' stores run as.
STORAGE_CLASS=sbx-local
VOLUMES=$ROOT/volumes
VOLUME_COUNT=4
VOLUME_SIZE=50Gi
VOLUME_UID=1000
SANDBOX_NAMESPACE=sbx-sandboxes
# The kernel settings the kubelet (setupKernelTunables) and the CNI bridge
# plugin (isGateway turns on forwarding) change; up saves them, down puts
# them back.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
	kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
	net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables net.netfilter.nf_conntrack_max)
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
# Start order; down stops them in reverse.
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy kube-router volumes)

export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin

log() { echo "kube: $*" >&2; }
# set -e alone stops without a word: say where.
set -E
trap 'log "failed: line $LINENO: $BASH_COMMAND"' ERR
die() {
	log "$*"
	exit 1
}

node_name() { hostname | tr '[:upper:]' '[:lower:]'; }

install_packages() {
	local pkgs=(containerd containernetworking-plugins openssl iptables ipset) missing=() p
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return
	log "apt-get install ${missing[*]}"
	apt-get update -qq </dev/null
	# policy-rc.d 101: Debian's containerd unit is not started on machines
	# with an init; the cluster runs a containerd of its own.
	local policy=/usr/sbin/policy-rc.d made_policy=false
	if [ ! -e $policy ]; then
		printf '#!/bin/sh\nexit 101\n' >$policy
		chmod 755 $policy
		made_policy=true
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null ||
		{
			$made_policy && rm -f $policy
			return 1
		}
	$made_policy && rm -f $policy
	return 0
}

# build_binaries builds the six binaries from the Go module proxy in a
# throwaway module, once per version: the result is cached in $BIN.
build_binaries() {
	local c missing=false
	for c in "${COMPONENTS[@]}"; do [ -x "$BIN/$c" ] || missing=true; done
	if $missing; then
		local start=$SECONDS
		local mod=$ROOT/build
		export GOCACHE=$ROOT/cache/go-build GOMODCACHE=$ROOT/cache/mod GOFLAGS=-mod=mod GOTOOLCHAIN=local
		rm -rf "$mod"
		mkdir -p "$mod" "$BIN.tmp"
		log "building Kubernetes $K8S_VERSION and etcd $ETCD_VERSION from the Go module proxy (cold: about 6 minutes)"
		# The staging modules are replaced by ./staging paths in
		# k8s.io/kubernetes's go.mod; a module that requires it must replace
		# each with its published version.
		local kmod
		kmod=$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
		[ -f "$kmod" ] || die "cannot download k8s.io/kubernetes@$K8S_VERSION"
		{
			echo "// Generated by scripts/kube.sh: the throwaway module that builds the test cluster's binaries."
			echo "module sbx-kube-build"
			echo
			echo "go 1.24"
			echo
			echo "require ("
			echo "	k8s.io/kubernetes $K8S_VERSION"
			echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
			echo ")"
			echo
			echo "replace ("
			sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/[a-z0-9-]*$#\t\1 => \1 '"$K8S_STAGING_VERSION"'#p' "$kmod"
			echo ")"
		} >"$mod/go.mod"
		[ "$(grep -c ' => ' "$mod/go.mod")" -gt 20 ] || die "found no staging replacements in $kmod"
		cat >"$mod/tools.go" <<-'EOF'
			//go:build tools

			// Package tools makes the module require the commands it builds.
			package tools

			import (
				_ "go.etcd.io/etcd/server/v3"
				_ "k8s.io/kubernetes/cmd/kube-apiserver"
				_ "k8s.io/kubernetes/cmd/kube-controller-manager"
				_ "k8s.io/kubernetes/cmd/kube-proxy"
				_ "k8s.io/kubernetes/cmd/kube-scheduler"
				_ "k8s.io/kubernetes/cmd/kubectl"
				_ "k8s.io/kubernetes/cmd/kubelet"
			)
		EOF
		(cd "$mod" && go mod tidy -e >/dev/null 2>&1 || true)
		# kubectl refuses a server whose version it cannot parse: stamp both
		# version packages like the release build does.
		local minor=${K8S_VERSION#v1.}
		minor=${minor%%.*}
		local ld="-s -w" pkg
		for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
			ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
			ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
		done
		(
			cd "$mod"
			# Static binaries, nice: the machine's two cores are shared.
			CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "$ld" -o "$BIN.tmp/" \
				k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
				k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet \
				k8s.io/kubernetes/cmd/kube-proxy
			CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$BIN.tmp/etcd" go.etcd.io/etcd/server/v3
		)
		rm -rf "$BIN"
		mv "$BIN.tmp" "$BIN"
		log "built in $((SECONDS - start)) s"
	fi
	ln -sfn "$BIN/kubectl" "$ROOT/bin/kubectl"
	build_addon kube-router "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
	build_addon coredns "github.com/coredns/coredns@$COREDNS_VERSION"
}

# build_addon NAME PKG@VERSION: go install into $ROOT/bin/NAME-VERSION,
# once per version.
build_addon() {
	local name=$1 pkg=$2 dir
	dir=$ROOT/bin/$name-${pkg##*@}
	[ -x "$dir/$name" ] && return
	local start=$SECONDS
	log "building $pkg from the Go module proxy"
	rm -rf "$dir.tmp"
	mkdir -p "$dir.tmp"
	(
		export GOCACHE=$ROOT/cache/go-build GOMODCACHE=$ROOT/cache/mod GOFLAGS= GOTOOLCHAIN=local
		cd "$dir.tmp"
		CGO_ENABLED=0 GOBIN=$dir.tmp nice -n 10 go install -trimpath -ldflags "-s -w" "$pkg"
	)
	[ -x "$dir.tmp/$name" ] || die "building $pkg made no $name"
	rm -rf "$dir"
	mv "$dir.tmp" "$dir"
	log "built $name in $((SECONDS - start)) s"
}

# make_image writes a docker-archive tarball (what `docker save` writes:
# manifest.json, the image config, one layer tar) of one static binary as
# the entrypoint: enough for `ctr images import`. Usage: make_image TAG BINARY OUT.
make_image() {
	local tag=$1 binary=$2 out=$3 dir
	dir=$(mktemp -d)
	mkdir "$dir/rootfs"
	install -m 755 "$binary" "$dir/rootfs/$(basename "$binary")"
	tar -C "$dir/rootfs" --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$dir/layer.tar" .
	local diff cfg name
	diff=$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)
	name=$(basename "$binary")
	printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/%s"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
		"$name" "$diff" >"$dir/config.json"
	cfg=$(sha256sum "$dir/config.json" | cut -d' ' -f1)
	mv "$dir/config.json" "$dir/$cfg.json"
	mkdir "$dir/$diff"
	mv "$dir/layer.tar" "$dir/$diff/layer.tar"
	printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cfg" "$tag" "$diff" >"$dir/manifest.json"
	tar -C "$dir" --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$out" manifest.json "$cfg.json" "$diff"
	rm -rf "$dir"
}

# build_go_image builds one of scripts/kube's programs statically and
# writes its image. Usage: build_go_image DIR TAG OUT.
build_go_image() {
	local dir=$1 tag=$2 out=$3 tmp
	tmp=$(mktemp -d)
	(cd "$REPO" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/$(basename "$dir")" "./$dir")
	make_image "$tag" "$tmp/$(basename "$dir")" "$out"
	rm -rf "$tmp"
}

write_pki() {
	# The marker names what the certificates were made for: a change of
	# addresses or components makes them again.
	local want="v2 $GATEWAY"
	[ "$(cat "$PKI/done" 2>/dev/null)" = "$want" ] && return
	rm -rf "$PKI"
	mkdir -p "$PKI"
	chmod 700 "$PKI"
	local node
	node=$(node_name)
	(
		cd "$PKI"
		openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj /CN=sbx-kube-ca 2>/dev/null
		# sign NAME SUBJECT [SANS]
		sign() {
			local ext
			ext=$(mktemp)
			{
				echo "basicConstraints=CA:FALSE"
				echo "keyUsage=digitalSignature,keyEncipherment"
				echo "extendedKeyUsage=serverAuth,clientAuth"
				[ -n "${3:-}" ] && echo "subjectAltName=$3"
			} >"$ext"
			openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
			openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 3650 -extfile "$ext" 2>/dev/null
			rm -f "$1.csr" "$ext"
		}
		sign apiserver /CN=kube-apiserver \
			"IP:$GATEWAY,IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
		sign admin "/O=system:masters/CN=sbx-kube-admin"
		sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
		sign controller-manager /CN=system:kube-controller-manager
		sign scheduler /CN=system:kube-scheduler
		sign kube-proxy /CN=system:kube-proxy
		sign kube-router /CN=system:kube-router
		sign kubelet "/O=system:nodes/CN=system:node:$node" "DNS:$node,IP:127.0.0.1"
		openssl genrsa -out sa.key 2048 2>/dev/null
		openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
		echo "$want" >done
	)
}

# kubeconfig NAME: a kubeconfig with the certificates inline, so that it
# can be copied anywhere.
kubeconfig() {
	local name=$1 out=$2
	cat >"$out.tmp" <<-EOF
		apiVersion: v1
		kind: Config
		clusters:
		- name: sbx-kube
		  cluster:
		    server: $API
		    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
		users:
		- name: $name
		  user:
		    client-certificate-data: $(base64 -w0 "$PKI/$name.crt")
		    client-key-data: $(base64 -w0 "$PKI/$name.key")
		contexts:
		- name: sbx-kube
		  context:
		    cluster: sbx-kube
		    user: $name
		current-context: sbx-kube
	EOF
	chmod 600 "$out.tmp"
	mv "$out.tmp" "$out"
}

write_config() {
	mkdir -p "$ETC/cni" "$ROOT/cni" "$RUN"
	kubeconfig admin "$KUBECONFIG_ADMIN"
	kubeconfig controller-manager "$ETC/controller-manager.kubeconfig"
	kubeconfig scheduler "$ETC/scheduler.kubeconfig"
	kubeconfig kubelet "$ETC/kubelet.kubeconfig"
	kubeconfig kube-proxy "$ETC/kube-proxy.kubeconfig"
	kubeconfig kube-router "$ETC/kube-router.kubeconfig"
	# restrict_oom_score_adj: root here may lack CAP_SYS_RESOURCE, and a
	# negative oom_score_adj then fails every container ("can't get final
	# child's PID from pipe"). The opt plugin's path and the disabled
	# snapshotters keep containerd out of /opt and of file systems it need
	# not probe.
	cat >"$ETC/containerd.toml" <<-EOF
		version = 2
		root = "$ROOT/containerd"
		state = "$RUN/containerd"
		disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
		[grpc]
		  address = "$CTR_SOCK"
		[ttrpc]
		  address = "$RUN/containerd/containerd.sock.ttrpc"
		[plugins."io.containerd.internal.v1.opt"]
		  path = "$ROOT/opt"
		[plugins."io.containerd.grpc.v1.cri"]
		  sandbox_image = "$PAUSE_IMAGE"
		  restrict_oom_score_adj = true
		  enable_cdi = false
		  [plugins."io.containerd.grpc.v1.cri".cni]
		    bin_dir = "/usr/lib/cni"
		    conf_dir = "$ETC/cni"
		  [plugins."io.containerd.grpc.v1.cri".containerd]
		    snapshotter = "overlayfs"
		    default_runtime_name = "runc"
		    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
		      runtime_type = "io.containerd.runc.v2"
		      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
		        BinaryName = "$(command -v runc)"
		        SystemdCgroup = false
	EOF
	# isGateway puts 10.244.0.1 on the bridge: the host reaches every Pod
	# IP directly (the control plane's tests dial pod IP:port). ipMasq
	# false: nothing in iptables. The IPAM state lives under $ROOT.
	cat >"$ETC/cni/10-sbx-kube.conflist" <<-EOF
		{
		  "cniVersion": "0.4.0",
		  "name": "sbx-kube",
		  "plugins": [
		    {
		      "type": "bridge",
		      "bridge": "$BRIDGE",
		      "isGateway": true,
		      "ipMasq": false,
		      "hairpinMode": true,
		      "ipam": {
		        "type": "host-local",
		        "dataDir": "$ROOT/cni",
		        "ranges": [[{"subnet": "$POD_CIDR"}]],
		        "routes": [{"dst": "0.0.0.0/0"}]
		      }
		    },
		    {"type": "loopback"}
		  ]
		}
	EOF
	# cgroupfs: there is no systemd here. failSwapOn/failCgroupV1 false:
	# the machine may have swap and has cgroup v1. Low eviction thresholds
	# and image GC at 100%: a busy shared disk must not evict the tests'
	# Pods or delete the imported images, which cannot be pulled again.
	cat >"$ETC/kubelet.yaml" <<-EOF
		apiVersion: kubelet.config.k8s.io/v1beta1
		kind: KubeletConfiguration
		cgroupDriver: cgroupfs
		failSwapOn: false
		failCgroupV1: false
		address: 0.0.0.0
		healthzBindAddress: 127.0.0.1
		healthzPort: 10248
		readOnlyPort: 0
		authentication:
		  anonymous:
		    enabled: false
		  webhook:
		    enabled: true
		  x509:
		    clientCAFile: $PKI/ca.crt
		authorization:
		  mode: Webhook
		evictionHard:
		  memory.available: "50Mi"
		  nodefs.available: "1%"
		  nodefs.inodesFree: "1%"
		  imagefs.available: "1%"
		imageGCHighThresholdPercent: 100
		imageGCLowThresholdPercent: 99
		serializeImagePulls: false
		resolvConf: /etc/resolv.conf
		clusterDNS: [$DNS_IP]
		clusterDomain: cluster.local
		podPidsLimit: $POD_PIDS_LIMIT
	EOF
}

running() {
	local pid
	[ -f "$PIDS/$1.pid" ] || return 1
	pid=$(cat "$PIDS/$1.pid")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

# start NAME CMD...: in the background, in a session of its own (it
# outlives this script and CI's process group), logging to $LOGS/NAME.log.
start() {
	local name=$1
	shift
	running "$name" && return
	mkdir -p "$LOGS" "$PIDS"
	setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$PIDS/$name.pid"
}

# wait_for WHAT SECONDS CMD...: until CMD succeeds.
wait_for() {
	local what=$1 limit=$2 i
	shift 2
	for ((i = 0; i < limit * 2; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	die "$what not ready after ${limit}s (logs in $LOGS)"
}

kubectl_() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

save_sysctls() {
	[ -f "$ROOT/sysctl.saved" ] && return
	local s
	for s in "${SYSCTLS[@]}"; do
		echo "$s=$(sysctl -n "$s")"
	done >"$ROOT/sysctl.saved.tmp"
	mv "$ROOT/sysctl.saved.tmp" "$ROOT/sysctl.saved"
}

node_ready() {
	kubectl_ get node "$(node_name)" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

cmd_up() {
	local start_time=$SECONDS
	install_packages
	mkdir -p "$ROOT/bin"
	build_binaries
	write_pki
	save_sysctls
	write_config
	local node
	node=$(node_name)
	ensure_bridge

	start etcd "$BIN/etcd" --name sbx-kube --data-dir "$ROOT/etcd" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster sbx-kube=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
	wait_for etcd 60 curl -sf http://127.0.0.1:2381/health

	start kube-apiserver "$BIN/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
		--bind-address "$GATEWAY" --advertise-address "$GATEWAY" --secure-port 6443 \
		--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
		--client-ca-file "$PKI/ca.crt" \
		--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types InternalIP,Hostname \
		--service-account-issuer https://kubernetes.default.svc \
		--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
		--service-cluster-ip-range "$SERVICE_CIDR" --authorization-mode Node,RBAC \
		--allow-privileged=true --enable-priority-and-fairness=false
	wait_for kube-apiserver 120 kubectl_ get --raw /readyz
	apply_rbac

	start kube-controller-manager "$BIN/kube-controller-manager" \
		--kubeconfig "$ETC/controller-manager.kubeconfig" \
		--authentication-kubeconfig "$ETC/controller-manager.kubeconfig" \
		--authorization-kubeconfig "$ETC/controller-manager.kubeconfig" \
		--bind-address 127.0.0.1 --use-service-account-credentials \
		--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
		--cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
		--service-cluster-ip-range "$SERVICE_CIDR" --leader-elect=false \
		--allocate-node-cidrs --cluster-cidr "$POD_CIDR" --node-cidr-mask-size 24
	start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$ETC/scheduler.kubeconfig" \
		--authentication-kubeconfig "$ETC/scheduler.kubeconfig" \
		--authorization-kubeconfig "$ETC/scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false

	start containerd containerd --config "$ETC/containerd.toml"
	wait_for containerd 60 ctr --address "$CTR_SOCK" version
	import_pause

	start kubelet "$BIN/kubelet" --config "$ETC/kubelet.yaml" --kubeconfig "$ETC/kubelet.kubeconfig" \
		--container-runtime-endpoint "unix://$CTR_SOCK" --hostname-override "$node" \
		--tls-cert-file "$PKI/kubelet.crt" --tls-private-key-file "$PKI/kubelet.key"
	wait_for "node $node" 120 node_ready

	# Services: iptables rules, ClusterIPs reached from Pods and from the
	# host. NodePorts only on the bridge's address, never on the host's
	# other interfaces. The conntrack settings are left as they are.
	start kube-proxy "$BIN/kube-proxy" --kubeconfig "$ETC/kube-proxy.kubeconfig" \
		--hostname-override "$node" --proxy-mode iptables --cluster-cidr "$POD_CIDR" \
		--nodeport-addresses "$GATEWAY/32" --metrics-bind-address 127.0.0.1:10249 \
		--healthz-bind-address 127.0.0.1:10256 --conntrack-max-per-core 0 \
		--conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0
	wait_for kube-proxy 60 curl -sf http://127.0.0.1:10256/healthz
	# NetworkPolicies: kube-router's firewall alone (iptables and ipset);
	# routing and service proxying are the bridge's and kube-proxy's.
	start kube-router "$ROUTER_BIN" --kubeconfig "$ETC/kube-router.kubeconfig" \
		--hostname-override "$node" --run-firewall=true --run-router=false \
		--run-service-proxy=false --enable-cni=false --enable-ipv6=false \
		--service-cluster-ip-range "$SERVICE_CIDR" --health-port 0 --metrics-port 0
	# Its health port would listen on every interface: off; ready is when
	# its chains are in place.
	wait_for kube-router 60 iptables -S KUBE-ROUTER-FORWARD
	start volumes "$REPO/scripts/kube.sh" volumes-loop
	make_volumes
	start_dns

	kubectl_ get namespace "$SANDBOX_NAMESPACE" >/dev/null 2>&1 || kubectl_ create namespace "$SANDBOX_NAMESPACE" >/dev/null
	# Pods are refused until their namespace's default service account
	# exists (the controller manager makes it).
	wait_for "service accounts" 60 kubectl_ -n default get serviceaccount default
	wait_for "service accounts" 60 kubectl_ -n "$SANDBOX_NAMESPACE" get serviceaccount default
	smoke_pod
	if [ "${SBX_KUBE_NO_IMAGES:-}" != 1 ]; then
		log "building and importing the deployment's images (scripts/kube-images.sh)"
		"$REPO/scripts/kube-images.sh" >/dev/null
	fi
	log "up in $((SECONDS - start_time)) s: kubectl $ROOT/bin/kubectl, kubeconfig $KUBECONFIG_ADMIN"
}

# ensure_bridge makes the Pods' bridge with its gateway address before
# the API server binds there (the CNI plugin takes the bridge as it finds
# it).
ensure_bridge() {
	ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
	ip -4 addr show dev "$BRIDGE" | grep -q "inet $GATEWAY/" || ip addr add "$GATEWAY/${POD_CIDR#*/}" dev "$BRIDGE"
	ip link set "$BRIDGE" up
}

# apply_rbac gives the policy controller what it watches (kube-proxy's
# user has system:node-proxier already).
apply_rbac() {
	kubectl_ apply -f - >/dev/null <<-EOF
		apiVersion: rbac.authorization.k8s.io/v1
		kind: ClusterRole
		metadata:
		  name: sbx-kube:kube-router
		rules:
		- apiGroups: [""]
		  resources: [namespaces, pods, services, nodes, endpoints]
		  verbs: [get, list, watch]
		- apiGroups: [networking.k8s.io]
		  resources: [networkpolicies]
		  verbs: [get, list, watch]
		- apiGroups: [discovery.k8s.io]
		  resources: [endpointslices]
		  verbs: [get, list, watch]
		---
		apiVersion: rbac.authorization.k8s.io/v1
		kind: ClusterRoleBinding
		metadata:
		  name: sbx-kube:kube-router
		roleRef:
		  apiGroup: rbac.authorization.k8s.io
		  kind: ClusterRole
		  name: sbx-kube:kube-router
		subjects:
		- apiGroup: rbac.authorization.k8s.io
		  kind: User
		  name: system:kube-router
	EOF
}

# make_volumes makes the default StorageClass and its static local
# PersistentVolumes, one directory each, owned by the stores' uid (a
# local volume's ownership is what the directory has).
make_volumes() {
	local i
	kubectl_ apply -f - >/dev/null <<-EOF
		apiVersion: storage.k8s.io/v1
		kind: StorageClass
		metadata:
		  name: $STORAGE_CLASS
		  annotations:
		    storageclass.kubernetes.io/is-default-class: "true"
		provisioner: kubernetes.io/no-provisioner
		volumeBindingMode: WaitForFirstConsumer
		reclaimPolicy: Retain
	EOF
	for ((i = 0; i < VOLUME_COUNT; i++)); do
		if [ ! -d "$VOLUMES/pv-$i" ]; then
			install -d -m 0770 -o "$VOLUME_UID" -g "$VOLUME_UID" "$VOLUMES/pv-$i"
		fi
		kubectl_ get pv "sbx-kube-pv-$i" >/dev/null 2>&1 && continue
		kubectl_ apply -f - >/dev/null <<-EOF
			apiVersion: v1
			kind: PersistentVolume
			metadata:
			  name: sbx-kube-pv-$i
			spec:
			  capacity: {storage: $VOLUME_SIZE}
			  accessModes: [ReadWriteOnce]
			  persistentVolumeReclaimPolicy: Retain
			  storageClassName: $STORAGE_CLASS
			  volumeMode: Filesystem
			  local: {path: $VOLUMES/pv-$i}
			  nodeAffinity:
			    required:
			      nodeSelectorTerms:
			      - matchExpressions:
			        - {key: kubernetes.io/hostname, operator: In, values: [$(node_name)]}
		EOF
	done
}

# reclaim empties the volumes whose claims are gone and makes them
# Available again: what the Delete policy would do with a provisioner.
# Without it a deployment applied and deleted twice would use up the
# volumes.
reclaim() {
	local pv dir
	for pv in $(kubectl_ get pv -o jsonpath='{range .items[?(@.status.phase=="Released")]}{.metadata.name}{" "}{.spec.storageClassName}{"\n"}{end}' 2>/dev/null | awk -v c="$STORAGE_CLASS" '$2 == c { print $1 }'); do
		dir=$(kubectl_ get pv "$pv" -o jsonpath='{.spec.local.path}')
		case $dir in "$VOLUMES"/pv-[0-9]*) ;; *) continue ;; esac
		rm -rf "$dir"
		install -d -m 0770 -o "$VOLUME_UID" -g "$VOLUME_UID" "$dir"
		kubectl_ patch pv "$pv" --type json -p '[{"op":"remove","path":"/spec/claimRef"}]' >/dev/null &&
			log "volumes: $pv emptied and Available again"
	done
}

# start_dns runs CoreDNS in kube-system behind the kube-dns Service
# ($DNS_IP, the kubelet's clusterDNS), from an image of its binary.
start_dns() {
	local tag=sbx-kube/coredns:$COREDNS_VERSION
	if ! ctr --address "$CTR_SOCK" -n k8s.io images ls -q | grep -qx "docker.io/$tag"; then
		local tar
		tar=$(mktemp --suffix .tar)
		make_image "$tag" "$DNS_BIN" "$tar"
		ctr --address "$CTR_SOCK" -n k8s.io images import --no-unpack "$tar" >/dev/null
		rm -f "$tar"
	fi
	kubectl_ apply -f - >/dev/null <<-EOF
		apiVersion: v1
		kind: ServiceAccount
		metadata: {name: coredns, namespace: kube-system}
		---
		apiVersion: rbac.authorization.k8s.io/v1
		kind: ClusterRole
		metadata: {name: sbx-kube:coredns}
		rules:
		- apiGroups: [""]
		  resources: [services, pods, namespaces]
		  verbs: [list, watch]
		- apiGroups: [discovery.k8s.io]
		  resources: [endpointslices]
		  verbs: [list, watch]
		---
		apiVersion: rbac.authorization.k8s.io/v1
		kind: ClusterRoleBinding
		metadata: {name: sbx-kube:coredns}
		roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: sbx-kube:coredns}
		subjects:
		- {kind: ServiceAccount, name: coredns, namespace: kube-system}
		---
		apiVersion: v1
		kind: ConfigMap
		metadata: {name: coredns, namespace: kube-system}
		data:
		  Corefile: |
		    .:1053 {
		        errors
		        ready :8181
		        kubernetes cluster.local in-addr.arpa ip6.arpa {
		            pods insecure
		            fallthrough in-addr.arpa ip6.arpa
		        }
		        forward . /etc/resolv.conf
		        cache 30
		    }
		---
		apiVersion: apps/v1
		kind: Deployment
		metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
		spec:
		  replicas: 1
		  selector: {matchLabels: {k8s-app: kube-dns}}
		  template:
		    metadata: {labels: {k8s-app: kube-dns}}
		    spec:
		      serviceAccountName: coredns
		      dnsPolicy: Default
		      terminationGracePeriodSeconds: 1
		      containers:
		      - name: coredns
		        image: $tag
		        imagePullPolicy: Never
		        args: [-conf, /etc/coredns/Corefile]
		        ports:
		        - {name: dns, containerPort: 1053, protocol: UDP}
		        - {name: dns-tcp, containerPort: 1053, protocol: TCP}
		        readinessProbe:
		          httpGet: {path: /ready, port: 8181}
		          periodSeconds: 2
		        securityContext:
		          runAsUser: 65534
		          runAsNonRoot: true
		          allowPrivilegeEscalation: false
		          readOnlyRootFilesystem: true
		          capabilities: {drop: [ALL]}
		        resources:
		          limits: {memory: 128Mi}
		          requests: {cpu: 50m, memory: 32Mi}
		        volumeMounts:
		        - {name: config, mountPath: /etc/coredns, readOnly: true}
		      volumes:
		      - name: config
		        configMap: {name: coredns}
		---
		apiVersion: v1
		kind: Service
		metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
		spec:
		  clusterIP: $DNS_IP
		  selector: {k8s-app: kube-dns}
		  ports:
		  - {name: dns, port: 53, targetPort: 1053, protocol: UDP}
		  - {name: dns-tcp, port: 53, targetPort: 1053, protocol: TCP}
	EOF
	wait_for "CoreDNS" 120 kubectl_ -n kube-system wait --for=condition=Available deployment/coredns --timeout=1s
}

import_pause() {
	if ctr --address "$CTR_SOCK" -n k8s.io images ls -q | grep -qx "$PAUSE_IMAGE"; then
		return
	fi
	local tar
	tar=$(mktemp --suffix .tar)
	build_go_image scripts/kube/pause "$PAUSE_IMAGE" "$tar"
	ctr --address "$CTR_SOCK" -n k8s.io images import --no-unpack "$tar" >/dev/null
	rm -f "$tar"
}

# smoke_pod runs a Pod of the pause image to the end: up returns only when
# the node can run Pods (the default service account exists, the sandbox
# starts, the network gives it an IP).
smoke_pod() {
	kubectl_ -n default delete pod sbx-kube-smoke --ignore-not-found --wait=true >/dev/null
	kubectl_ -n default apply -f - >/dev/null <<-EOF
		apiVersion: v1
		kind: Pod
		metadata:
		  name: sbx-kube-smoke
		spec:
		  terminationGracePeriodSeconds: 0
		  automountServiceAccountToken: false
		  containers:
		  - name: pause
		    image: $PAUSE_IMAGE
		    imagePullPolicy: Never
	EOF
	wait_for "smoke Pod" 120 kubectl_ -n default wait --for=condition=Ready pod/sbx-kube-smoke --timeout=1s
	kubectl_ -n default delete pod sbx-kube-smoke --wait=true >/dev/null
}

cmd_import() {
	[ $# -gt 0 ] || die "import: name the tarballs"
	running containerd || die "import: the cluster is not up (scripts/kube.sh up)"
	local f
	for f in "$@"; do
		[ -f "$f" ] || die "import: $f: no such file"
		ctr --address "$CTR_SOCK" -n k8s.io images import "$f" >/dev/null
		log "imported $f"
	done
}

cmd_status() {
	local d ok=true
	echo "kubernetes $K8S_VERSION, etcd $ETCD_VERSION"
	echo "binaries   $BIN$([ -x "$BIN/kubelet" ] || echo ' (not built)')"
	echo "kubectl    $ROOT/bin/kubectl"
	echo "kubeconfig $KUBECONFIG_ADMIN"
	echo "logs       $LOGS"
	for d in "${DAEMONS[@]}"; do
		if running "$d"; then
			echo "$d: running (pid $(cat "$PIDS/$d.pid"))"
		else
			echo "$d: stopped"
			ok=false
		fi
	done
	if $ok && node_ready; then
		echo "node $(node_name): Ready"
		return 0
	fi
	echo "node $(node_name): not Ready"
	exit 1
}

stop_pid() {
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 40; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.25
	done
	kill -KILL "$pid" 2>/dev/null || true
	for ((i = 0; i < 40; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.25
	done
}

# our_shims lists the containerd shims of this cluster's containerd: the
# shims outlive containerd, and each names its containerd's socket.
our_shims() {
	local p
	for p in /proc/[0-9]*; do
		# A process may end between the glob and the read.
		{ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q -- "-address $CTR_SOCK " && echo "${p#/proc/}"
	done
	return 0
}

# unmount_under PREFIX...: every mount at or below the prefixes, deepest
# first.
unmount_under() {
	local m p
	for p in "$@"; do
		# grep finds nothing when nothing is mounted: not an error.
		{ awk '{print $5}' /proc/self/mountinfo | grep -E "^${p}(/|$)" || true; } | sort -r | while read -r m; do
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
		done
	done
}

remove_iptables_chains() {
	local ipt table chain rule
	for ipt in iptables ip6tables; do
		command -v $ipt >/dev/null || continue
		for table in filter nat mangle raw; do
			$ipt -t $table -S >/dev/null 2>&1 || continue
			# Rules that jump to the kubelet's chains, then the chains.
			{ $ipt -t $table -S | grep -E '^-A .* -j KUBE-' || true; } | sed 's/^-A /-D /' | while read -r rule; do
				eval "$ipt -t $table $rule" || true
			done
			$ipt -t $table -S | sed -n 's/^-N \(KUBE-[A-Z0-9-]*\)$/\1/p' | while read -r chain; do
				$ipt -t $table -F "$chain" || true
				$ipt -t $table -X "$chain" || true
			done
		done
	done
}

cmd_down() {
	local purge=false
	[ "${1:-}" = --purge ] && purge=true
	local i d pid
	# The kubelet first (it would restart containers), then the
	# containers, then the rest.
	for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
		d=${DAEMONS[i]}
		if [ "$d" = containerd ] && running containerd; then
			local ns=k8s.io c
			for c in $(ctr --address "$CTR_SOCK" -n $ns tasks ls -q 2>/dev/null); do
				ctr --address "$CTR_SOCK" -n $ns tasks kill -s KILL "$c" >/dev/null 2>&1 || true
			done
			for c in $(ctr --address "$CTR_SOCK" -n $ns tasks ls -q 2>/dev/null); do
				ctr --address "$CTR_SOCK" -n $ns tasks delete -f "$c" >/dev/null 2>&1 || true
			done
		fi
		if [ -f "$PIDS/$d.pid" ]; then
			pid=$(cat "$PIDS/$d.pid")
			[ -n "$pid" ] && stop_pid "$pid"
			rm -f "$PIDS/$d.pid"
		fi
	done
	for pid in $(our_shims); do
		# A shim's children are the containers: kill the whole session.
		kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
	done
	# Give the kernel a moment to tear down killed containers before the
	# mounts and cgroups go.
	for ((i = 0; i < 20; i++)); do [ -z "$(our_shims)" ] && break; sleep 0.25; done

	unmount_under /var/lib/kubelet "$ROOT/containerd" "$RUN" /run/netns/cni-[^/]* /var/run/netns/cni-[^/]*
	local f
	for f in /run/netns/cni-*; do
		[ -e "$f" ] || continue
		umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null || true
		rm -f "$f"
	done
	rm -rf /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni "$RUN" \
		"$ROOT/containerd" "$ROOT/opt" "$ROOT/etcd" "$ROOT/cni" "$ROOT/etc" "$ROOT/pki" "$ROOT/logs" "$ROOT/pids" \
		"$KUBECONFIG_ADMIN"
	# The kubelet's QoS cgroups, in every hierarchy, deepest first.
	local h
	for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods.slice /sys/fs/cgroup/kubepods.slice; do
		[ -d "$h" ] && { find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true; }
	done
	ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
	remove_iptables_chains
	# kube-router's ipsets, once no rule uses them.
	if command -v ipset >/dev/null; then
		{ ipset list -n 2>/dev/null | grep -E '^(KUBE-|kube-router)' || true; } | while read -r set; do
			ipset destroy "$set" 2>/dev/null || true
		done
	fi
	rm -rf "$VOLUMES"
	if [ -f "$ROOT/sysctl.saved" ]; then
		while IFS= read -r line; do sysctl -qw "$line" || true; done <"$ROOT/sysctl.saved"
		rm -f "$ROOT/sysctl.saved"
	fi
	if $purge; then
		[ -d "$ROOT/cache/mod" ] && chmod -R u+w "$ROOT/cache/mod"
		rm -rf "$ROOT"
		log "down: everything removed, binaries too"
	else
		rm -rf "$ROOT/build"
		log "down: cluster removed; binaries kept in $ROOT/bin (down --purge removes them)"
	fi
}

main() {
	[ "$(id -u)" = 0 ] || die "run as root"
	case "${1:-}" in
	up) cmd_up ;;
	down)
		shift
		cmd_down "$@"
		;;
	status) cmd_status ;;
	build)
		# build: the binaries alone (CI may build before it needs them).
		mkdir -p "$ROOT/bin"
		build_binaries
		;;
	image)
		# image DIR TAG OUT: one of scripts/kube's Go programs as a
		# docker-archive tarball (scripts/kube-test.sh's test image).
		[ $# -eq 4 ] || die "usage: $0 image DIR TAG OUT"
		build_go_image "$2" "$3" "$4"
		;;
	import)
		shift
		cmd_import "$@"
		;;
	volumes-loop)
		# The volumes daemon that up starts: reclaim, every few seconds.
		while sleep 5; do reclaim; done
		;;
	*)
		echo "usage: $0 up|down [--purge]|status|import FILE..." >&2
		exit 2
		;;
	esac
}

# One line: bash has read all of it before it runs, so editing this file
# while it runs (a build takes minutes) cannot change what it does.
main "$@"; exit
