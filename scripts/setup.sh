#!/usr/bin/env bash
# Installs what sbx needs on a Debian 12 machine and builds it. Idempotent
# and quiet when everything is already there; runs without standard input
# (CI). Needs root: sandboxes need namespaces, cgroups and an OCI runtime.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "setup: run as root (sudo $0)" >&2
	exit 1
fi

# Debian packages: the OCI runtime, the template builder's tools, and
# bubblewrap for the benchmark's baseline.
pkgs=(runc debootstrap bubblewrap ca-certificates make)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup: apt-get install ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq </dev/null
	apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
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
make --no-print-directory build
