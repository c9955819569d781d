#!/bin/sh
# The sbx/postgres image's entrypoint (scripts/kube-images.sh builds the
# image as a template with packages [postgresql]; this file is the
# template's /usr/local/bin/sbx-postgres). It runs as uid 1000, the only
# non-root owner a template image has, so the data directory is a
# directory of the volume that this user makes and owns: initdb refuses a
# data directory it does not own.
set -eu
: "${PGDATA:?PGDATA names the data directory}"
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD comes from a Secret}"
user=${POSTGRES_USER:-sbx}
db=${POSTGRES_DB:-sbx}
for name in "$user" "$db"; do
	case $name in
	'' | [!a-z_]* | *[!a-z0-9_]*) echo "sbx-postgres: $name: want [a-z_][a-z0-9_]*" >&2; exit 2 ;;
	esac
done
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	umask 077
	pw=$(mktemp)
	# The password never appears on a command line (ps shows those).
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pw"
	"$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pw" --encoding=UTF8 --locale=C.UTF-8 \
		--auth-local=scram-sha-256 --auth-host=scram-sha-256
	rm -f "$pw"
	# Only the Pod network reaches the port (the NetworkPolicy lets in
	# the sbx Pods alone), and every connection needs the password.
	printf 'host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
	if [ "$db" != postgres ]; then
		echo "CREATE DATABASE \"$db\" OWNER \"$user\"" | "$bin/postgres" --single -D "$PGDATA" postgres >/dev/null
	fi
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp
