#!/usr/bin/env bash
# Builds the Debian package of sbx, OUTDIR/sbx_DEBVERSION_amd64.deb, from the
# binaries `make build` leaves in bin/ and the files beside this script.
# `make deb` runs it; the last line it prints is the package's path.
#
#   packaging/deb/build.sh VERSION [OUTDIR]     (OUTDIR default: bin)
#
# VERSION is the Makefile's (git describe --always --dirty). A Debian
# version starts with a digit and, without a Debian revision, has no "-":
#
#   v1.2.3              1.2.3
#   v1.2.3-4-gabc1234   1.2.3+4+gabc1234   (after 1.2.3, before 1.2.4)
#   v1.2.3-rc1          1.2.3~rc1          (before 1.2.3)
#   abc1234 (no tag)    0.0~git20261127075350+abc1234
#   ...-dirty           ...+dirty
#   dev (no git)        0.0~dev
#
# An untagged build carries its commit's time (UTC), so that untagged
# builds sort in commit order and every release sorts after them.
#
# No debhelper: the staging tree is assembled here and packed with
# dpkg-deb --root-owner-group (every file root's, without fakeroot). File
# times are the commit's, so the same commit makes the same package.
set -euo pipefail
cd "$(dirname "$0")/../.."

version=${1:?usage: packaging/deb/build.sh VERSION [OUTDIR]}
out=${2:-bin}
here=packaging/deb
maintainer=${DEB_MAINTAINER:-sbx authors <sbx@localhost>}

# Sandboxes' seccomp filter is x86-64 only (internal/seccomp), and so is
# the package.
for b in bin/sbx bin/sbx-executor; do
	[ -x "$b" ] || { echo "build.sh: $b is missing (make build)" >&2; exit 1; }
	# The ELF header's machine field: 0x3e is x86-64.
	[ "$(od -An -tx2 -j18 -N2 "$b" | tr -d ' ')" = 003e ] || {
		echo "build.sh: $b is not an x86-64 binary; the package is amd64 only" >&2
		exit 1
	}
done

epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)
# A release tag is v1..., or 1.2...; an abbreviated hash may start with a
# digit too (0eaec4d), but has no dot.
if [[ $version =~ ^v[0-9] || $version =~ ^[0-9]+\.[0-9] ]]; then
	debversion=${version#v}
elif [ "$version" = dev ]; then
	debversion=0.0~dev
else
	debversion=0.0~git$(date -u -d "@$epoch" +%Y%m%d%H%M%S)+$version
fi
debversion=${debversion/-rc/\~rc}
debversion=${debversion//-/+}
if ! [[ $debversion =~ ^[0-9][A-Za-z0-9.+~]*$ ]]; then
	echo "build.sh: cannot make a Debian version of $version (got $debversion)" >&2
	exit 1
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
install -d -m 0755 "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" \
	"$root/etc/default" "$root/usr/share/doc/sbx" "$root/usr/share/sbx/grafana"

# sbx finds sbx-executor beside its own binary (internal/runtime/oci,
# findExecutor): both in /usr/bin, no flag needed.
install -m 0755 bin/sbx bin/sbx-executor "$root/usr/bin/"
install -m 0644 "$here/sbx.service" "$root/lib/systemd/system/sbx.service"
# 0600: the file may hold API keys and store passwords.
install -m 0600 "$here/default" "$root/etc/default/sbx"
install -m 0644 "$here/copyright" "$root/usr/share/doc/sbx/copyright"
gzip -9n <README.md >"$root/usr/share/doc/sbx/README.md.gz"
install -m 0644 deploy/grafana/sbx.json "$root/usr/share/sbx/grafana/sbx.json"
cat <<EOF | gzip -9n >"$root/usr/share/doc/sbx/changelog.gz"
sbx ($debversion) unstable; urgency=medium

  * Built from $version.

 -- $maintainer  $(date -u -R -d "@$epoch")
EOF
chmod 0644 "$root"/usr/share/doc/sbx/*.gz

install -m 0755 "$here/postinst" "$here/prerm" "$here/postrm" "$root/DEBIAN/"
echo /etc/default/sbx >"$root/DEBIAN/conffiles"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
# runc runs the sandboxes (1.1: OCI spec 1.0.2, idmapped mounts); debootstrap
# builds templates, verifying the archive with gpgv and Debian's keyring
# (without them it goes on unverified); mkfs.btrfs makes the workspace
# image; ca-certificates for HTTPS mirrors and S3. runsc is optional, and
# Debian 12's own (20221219) lacks the systrap platform sbx uses: Suggests,
# so that apt never pulls that one in.
cat >"$root/DEBIAN/control" <<EOF
Package: sbx
Version: $debversion
Architecture: amd64
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: runc (>= 1.1), debootstrap, gpgv, debian-archive-keyring, btrfs-progs, ca-certificates
Suggests: runsc (>= 0.0~20240729)
Section: admin
Priority: optional
Description: sandboxes for AI agents' code, behind an HTTP API
 sbx runs the code AI agents write in isolated Linux sandboxes (OCI
 containers under runc, or gVisor's runsc) that answer fast enough for a
 live conversation: sessions that keep their files between calls, warm
 pools, hibernation, snapshots, API keys and tenants with limits, metrics,
 and compatibility with the E2B SDKs.
 .
 The package installs sbx and the in-sandbox executor, the sbx service
 (not enabled: see /etc/default/sbx, then systemctl enable --now sbx) and
 a Grafana dashboard in /usr/share/sbx/grafana.
EOF
find "$root" -exec touch -h -d "@$epoch" {} +

mkdir -p "$out"
deb=$out/sbx_${debversion}_amd64.deb
# zstd (dpkg 1.21.18, Debian 12): 0.2 s here, where gzip takes 5 s and xz
# 12 s for a package a quarter smaller.
SOURCE_DATE_EPOCH=$epoch dpkg-deb --root-owner-group -Zzstd --build "$root" "$deb" >/dev/null
echo "$deb"
