#!/usr/bin/env bash
# Installs what sbx needs on a Debian 12 machine and builds it, then runs
# the make targets given as arguments (scripts/setup.sh run, scripts/setup.sh
# ci). Idempotent and quiet when everything is already there; runs without
# standard input (CI). Needs root: sandboxes need namespaces, cgroups and an
# OCI runtime.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "setup: run as root (sudo $0)" >&2
	exit 1
fi

# Debian packages: the OCI runtime, the template builder's tools, and
# bubblewrap for the benchmark's baseline. btrfs-progs makes the workspace
# image (mkfs.btrfs) whose quotas hold each workspace to its disk size.
pkgs=(runc debootstrap bubblewrap ca-certificates make btrfs-progs)
# Python, pip, setuptools and wheel install the Python client from its path
# (clients/python, no PyPI) for its tests.
pkgs+=(python3 python3-pip python3-setuptools python3-wheel)
# Node.js and npm run the tests that drive sbx with real third-party
# clients (the MCP TypeScript SDK, the E2B SDKs); a machine that already
# has a node of its own keeps it.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	pkgs+=(nodejs npm)
fi
# What only the tests need (the PostgreSQL server, MinIO below) is installed
# when a test target is asked for (ci, test, test-integration): serving
# needs neither.
testing=false
for t in "$@"; do
	case "$t" in ci | test | test-integration) testing=true ;; esac
done
# The PostgreSQL server, for the tests of the PostgreSQL metadata store:
# they run initdb and postgres themselves, in a temporary directory
# (internal/testenv/pgtest), and never use a system cluster.
if $testing; then
	pkgs+=(postgresql)
	# systemd-analyze, for scripts/test-deb.sh to verify the package's unit
	# (the test needs no running systemd).
	pkgs+=(systemd)
	# Chromium, headless, drives the web console in its browser tests
	# (internal/server/console_integration_test.go).
	pkgs+=(chromium)
fi
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Installing a postgresql-NN package creates and starts a "main" cluster
# on port 5432 unless createcluster.conf (which includes createcluster.d)
# says not to: say so before the first install.
if [[ " ${missing[*]} " == *" postgresql "* ]]; then
	mkdir -p /etc/postgresql-common/createcluster.d
	cat >/etc/postgresql-common/createcluster.d/sbx.conf <<-'EOF'
		# Written by sbx scripts/setup.sh: sbx's tests start PostgreSQL clusters of
		# their own and need no system cluster.
		create_main_cluster = false
	EOF
fi
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup: apt-get install ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq </dev/null
	apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
fi

# gVisor's runsc, an optional runtime (oci.Config.Runtime "runsc"). Debian
# 12's own runsc (20221219) has no systrap platform and breaks stat(2); the
# one in bookworm-backports (20240729) works. The backports source is derived
# from the machine's own Debian source (same mirror, same keyring), never
# written by hand. runsc is optional: a failure warns and setup goes on.
runsc_min=0.0~20240729

# debian_source prints "URI<TAB>keyring" of the first entry for suite $1 in
# /etc/apt/sources.list.d/debian.sources (deb822) or /etc/apt/sources.list
# (one-line format); keyring may be empty.
debian_source() {
	local f=/etc/apt/sources.list.d/debian.sources
	if [ -f "$f" ]; then
		awk -v suite="$1" 'BEGIN { RS = ""; FS = "\n" } {
			types = uris = suites = key = ""
			for (i = 1; i <= NF; i++) {
				l = $i
				if (l ~ /^Types:/) types = " " substr(l, 7) " "
				else if (l ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", l); uris = l }
				else if (l ~ /^Suites:/) suites = " " substr(l, 8) " "
				else if (l ~ /^Signed-By:[ \t]*\//) { sub(/^Signed-By:[ \t]*/, "", l); key = l }
			}
			gsub(/\t/, " ", types); gsub(/\t/, " ", suites)
			if (types ~ / deb / && index(suites, " " suite " ") && uris != "") {
				split(uris, u, /[ \t]+/); print u[1] "\t" key; exit
			}
		}' "$f"
	elif [ -f /etc/apt/sources.list ]; then
		awk -v suite="$1" '$1 == "deb" {
			i = 2; opts = ""
			if ($2 ~ /^\[/) { while (i < NF && $i !~ /\]$/) opts = opts " " $(i++); opts = opts " " $(i++) }
			if ($(i + 1) == suite) {
				key = ""
				if (match(opts, /signed-by=[^] ]+/)) key = substr(opts, RSTART + 10, RLENGTH - 10)
				print $i "\t" key; exit
			}
		}' /etc/apt/sources.list
	fi
}

install_runsc() {
	local have codename src uri key list=/etc/apt/sources.list.d/sbx-backports.sources
	have=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)
	if [ -n "$have" ] && dpkg --compare-versions "$have" ge "$runsc_min"; then
		return 0
	fi
	codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
	[ -n "$codename" ] || { echo "no VERSION_CODENAME in /etc/os-release" >&2; return 1; }
	if ! grep -qsE "^[^#]*[[:space:]]${codename}-backports([[:space:]]|$)" /etc/apt/sources.list \
		/etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; then
		src=$(debian_source "$codename")
		uri=${src%%$'\t'*}
		key=${src#*$'\t'}
		[ -n "$uri" ] || { echo "no Debian $codename entry in debian.sources or sources.list to derive backports from" >&2; return 1; }
		echo "setup: adding ${codename}-backports from $uri ($list)"
		{
			echo "# Written by sbx scripts/setup.sh from the machine's Debian $codename source."
			echo "Types: deb"
			echo "URIs: $uri"
			echo "Suites: ${codename}-backports"
			echo "Components: main"
			if [ -n "$key" ]; then echo "Signed-By: $key"; fi
		} >"$list" || return 1
	fi
	echo "setup: apt-get install -t ${codename}-backports runsc"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq </dev/null || return 1
	apt-get install -y -qq --no-install-recommends -t "${codename}-backports" runsc </dev/null >/dev/null || return 1
	have=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)
	dpkg --compare-versions "${have:-0}" ge "$runsc_min" || { echo "runsc $have is older than $runsc_min" >&2; return 1; }
}
if ! install_runsc; then
	echo "setup: warning: runsc (gVisor) was not installed; sbx works without it (runc is the default)" >&2
fi

# Go: the machine's toolchain (go.mod names the minimum version).
if ! command -v go >/dev/null; then
	if [ -x /usr/local/go/bin/go ]; then
		export PATH=$PATH:/usr/local/go/bin
	else
		echo "setup: Go is not installed (need the version in go.mod, at /usr/local/go or in PATH)" >&2
		exit 1
	fi
fi
go mod download
# staticcheck for make lint, pinned, from the Go module proxy.
staticcheck_version=v0.8.2
if [ "$("$(go env GOPATH)/bin/staticcheck" -version 2>/dev/null | awk '{print $NF}' | tr -d '()')" != "${staticcheck_version#v}" ]; then
	echo "setup: go install staticcheck@$staticcheck_version"
	GOFLAGS= go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
fi
# MinIO: a real S3 API for the tests of the S3 blob store
# (internal/testenv/miniotest), built from the Go module proxy at a pinned
# version into /usr/local/lib/sbx-test/minio, and again only when that
# version changes (about 2.5 minutes on two cores). MinIO is AGPL-licensed:
# tests run it as a separate process; no sbx package imports it and sbx does
# not ship it. The proxy has only pseudo-versions of github.com/minio/minio;
# this one's go.mod asks for go 1.24.
minio_version=v0.0.0-20260212201848-7aac2a2c5b7c
minio_dir=/usr/local/lib/sbx-test
if $testing && [ "$(go version -m "$minio_dir/minio" 2>/dev/null | awk '$1 == "mod" && $2 == "github.com/minio/minio" { print $3 }')" != "$minio_version" ]; then
	echo "setup: go install github.com/minio/minio@$minio_version (for the S3 tests)"
	mkdir -p "$minio_dir"
	if ! out=$(GOFLAGS= CGO_ENABLED=0 GOBIN="$minio_dir" go install -trimpath "github.com/minio/minio@$minio_version" 2>&1); then
		echo "$out" >&2
		echo "setup: building MinIO failed" >&2
		exit 1
	fi
fi
make --no-print-directory build
if [ $# -gt 0 ]; then
	exec make --no-print-directory "$@"
fi
