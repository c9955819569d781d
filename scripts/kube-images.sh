#!/usr/bin/env bash
# kube-images.sh: build the images `kubectl apply -k deploy/kubernetes`
# runs, as docker-archive tarballs, and import them into the test
# cluster's containerd (scripts/kube.sh up calls it; root, like every
# template build).
#
#   scripts/kube-images.sh [--no-import]
#
# Images (docs/deploy-kubernetes.md):
#   sbx/NAME:HASH-xEXEC  each template of SBX_KUBE_TEMPLATES (default
#                     python), built on the host first if missing; EXEC is
#                     the start of bin/sbx-executor's sha256, the executor
#                     sbx/sbx:dev carries, so the control plane finds it
#   sbx/sbx:dev       sbx, sbx-executor, CA certificates and the template
#                     catalogue (build metadata without rootfs)
#   sbx/postgres:dev  PostgreSQL from Debian's packages (a template build)
#   sbx/minio:dev     the MinIO binary scripts/setup.sh builds
#
# The manifests name the fixed :dev tags, so they need no edit; a tarball
# is rebuilt only when its content key (the hashes of what goes in) has
# changed, and when sbx/sbx:dev changed the sbx Deployment, if there is
# one, is restarted so that its Pods run the new image.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin

OUT=${SBX_KUBE_IMAGES:-/var/lib/sbx-kube/images}
TEMPLATES=${SBX_KUBE_TEMPLATES:-python}
DATA=${SBX_DATA_DIR:-/var/lib/sbx}
MINIO=${SBX_MINIO:-/usr/local/lib/sbx-test/minio}
KUBE_ROOT=${SBX_KUBE_ROOT:-/var/lib/sbx-kube}
TAG=dev
import=true
[ "${1:-}" = --no-import ] && import=false

log() { echo "kube-images: $*" >&2; }
die() {
	log "$*"
	exit 1
}
sha() { sha256sum "$@" | awk '{ print $1 }' | sha256sum | cut -c1-64; }

import_image() { scripts/kube.sh import "$1"; }

# image KEY NAME REF BUILD...: builds REF into $OUT/NAME.tar with the
# command BUILD... (which gets the output path last) unless the tarball
# was built from KEY already, then imports it. Sets changed=true when it
# built. REF "-": the build names the image; read it from the tarball.
image() {
	local key=$1 name=$2 ref=$3
	shift 3
	local tar=$OUT/$name.tar
	changed=false
	if [ ! -f "$tar" ] || [ "$(cat "$tar.key" 2>/dev/null)" != "$key" ]; then
		log "building ${ref/#-/$name}"
		rm -f "$tar.key"
		"$@" "$tar.tmp" >&2
		mv "$tar.tmp" "$tar"
		echo "$key" >"$tar.key"
		changed=true
	fi
	if [ "$ref" = - ]; then
		ref=$(tar -xOf "$tar" manifest.json | jq -r '.[0].RepoTags[0]')
		[[ $ref == sbx/* ]] || die "$tar: no sbx/ tag in its manifest"
	fi
	if $import; then
		import_image "$tar"
	fi
	images+=("$ref")
}

# template_hash NAME [spec.json]: builds the template if missing (cached
# by content) and prints its full build hash.
template_hash() {
	local out
	out=$(bin/sbx template build --data-dir "$DATA" "$@") || die "template build $1 failed"
	# "NAME SHORTHASH SIZE UNIT ROOTFS": the rootfs is builds/HASH/rootfs.
	basename "$(dirname "$(awk '{ print $NF }' <<<"$out")")"
}

[ "$(id -u)" = 0 ] || die "run as root (template builds run runc)"
[ -x "$MINIO" ] || die "$MINIO: missing (scripts/setup.sh builds it)"
mkdir -p "$OUT"
images=()

log "make build"
make -s build >&2
exe_key=$(sha bin/sbx-executor)

# The templates sessions run: their images, and their metadata for the
# control plane's catalogue.
catalogue=$(mktemp -d)
trap 'rm -rf "$catalogue"' EXIT
mkdir -p "$catalogue/root/usr/share/sbx/templates/builds" "$catalogue/root/usr/share/sbx/templates/names" \
	"$catalogue/root/etc/ssl/certs" "$catalogue/root/tmp"
chmod 1777 "$catalogue/root/tmp"
for t in $TEMPLATES; do
	hash=$(template_hash "$t")
	[[ $hash =~ ^[0-9a-f]{64}$ ]] || die "template $t: no build hash in the build's output"
	# No --tag: the build names it sbx/NAME:HASH-xEXEC from the executor
	# beside bin/sbx, the one that goes into sbx/sbx:dev below.
	image "$hash-$exe_key" "template-$t" - \
		bin/sbx image build --data-dir "$DATA" --executor bin/sbx-executor --template "$t:$hash" -o
	src=$DATA/templates/builds/$hash
	dst=$catalogue/root/usr/share/sbx/templates/builds/$hash
	mkdir -p "$dst"
	for f in spec.json build.json packages.txt; do
		install -m 0644 "$src/$f" "$dst/$f"
	done
	if [ -f "$DATA/templates/names/$t" ]; then
		install -m 0644 "$DATA/templates/names/$t" "$catalogue/root/usr/share/sbx/templates/names/$t"
	fi
done

# sbx/sbx:dev: a file image, its root the catalogue, the binaries above it.
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$catalogue/root/etc/ssl/certs/ca-certificates.crt"
sbx_key=$(cd "$catalogue/root" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-64)
sbx_key=$sbx_key-$(sha bin/sbx bin/sbx-executor)
image "$sbx_key" sbx "sbx/sbx:$TAG" \
	bin/sbx image build --dir "$catalogue/root" --add bin/sbx:/usr/bin/sbx:755 \
	--add bin/sbx-executor:/usr/bin/sbx-executor:755 --entrypoint /usr/bin/sbx --tag "sbx/sbx:$TAG" -o
sbx_changed=$changed

# sbx/postgres:dev: a template with Debian's postgresql and the
# entrypoint script; the spec is made here so that the script stays a
# file of its own.
spec=$catalogue/postgres.json
jq -n --rawfile entry deploy/kubernetes/images/postgres-entrypoint.sh \
	'{name: "sbx-postgres", packages: ["postgresql"], files: {"/usr/local/bin/sbx-postgres": $entry}}' >"$spec"
pg_hash=$(template_hash sbx-postgres --file "$spec")
[[ $pg_hash =~ ^[0-9a-f]{64}$ ]] || die "template sbx-postgres: no build hash in the build's output"
image "$pg_hash-$exe_key" postgres "sbx/postgres:$TAG" \
	bin/sbx image build --data-dir "$DATA" --template "sbx-postgres:$pg_hash" --tag "sbx/postgres:$TAG" -o

# sbx/minio:dev: the binary alone, above an empty root with /tmp.
mkdir -p "$catalogue/minio/tmp" "$catalogue/minio/data"
chmod 1777 "$catalogue/minio/tmp"
image "$(sha "$MINIO")" minio "sbx/minio:$TAG" \
	bin/sbx image build --dir "$catalogue/minio" --add "$MINIO:/usr/bin/minio:755" \
	--entrypoint /usr/bin/minio --tag "sbx/minio:$TAG" -o

if $import && $sbx_changed && [ -f "$KUBE_ROOT/kubeconfig" ]; then
	kubectl=("$KUBE_ROOT/bin/"*/kubectl --kubeconfig "$KUBE_ROOT/kubeconfig")
	if "${kubectl[@]}" -n sbx get deployment sbx >/dev/null 2>&1; then
		log "sbx/sbx:$TAG changed: restarting the sbx Deployment"
		"${kubectl[@]}" -n sbx rollout restart deployment/sbx >&2
	fi
fi
printf '%s\n' "${images[@]}"
