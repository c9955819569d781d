#!/usr/bin/env bash
# Tests the Debian package end to end (make test-deb; make ci runs it):
#
#  1. builds it (make deb) and installs it with apt-get;
#  2. checks what landed, and that systemd-analyze verify has nothing to say
#     about the unit;
#  3. serves with the unit's own command line, environment and what of its
#     hardening applies without systemd as PID 1 (NoNewPrivileges=,
#     CapabilityBoundingSet=, LimitNOFILE=), in a cgroup of its own as
#     systemd would give it, on a temporary data directory and a free
#     loopback port; waits for GET /healthz; creates a session and runs
#     print(1) through the API with the packaged sbx, and checks that no
#     sandbox process is in the server's cgroup (so that stopping the unit,
#     KillMode=mixed, leaves sandboxes alone);
#  4. stops the server, purges the package, and checks that nothing is
#     left: no package, no /etc/default/sbx, no server, no unit state.
#
# Runs as root without standard input, and is idempotent: it leaves the
# machine as it found it. Packages apt installs for the package's
# dependencies (none after scripts/setup.sh) are purged again; what was
# there before is never touched. If a package named sbx is already installed
# (not by a killed run of this test), the test skips.
#
# The execution uses the python template built in /var/lib/sbx/templates
# (make test-integration builds it; make ci runs that first): building it
# here would take minutes, so without it that step is skipped, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "test-deb: run as root (apt-get, runc)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
exec </dev/null

unit=/lib/systemd/system/sbx.service
templates=/var/lib/sbx/templates
# The PATH systemd gives services.
svc_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# What a run has made, for a later run to undo if this one is killed
# before its own cleanup (SIGKILL): its directories, server, cgroups and
# packages. While it exists, a package named sbx is this test's. In /run:
# gone at a reboot, as is most of what it lists.
marker=/run/sbx-test-deb.run
start=$(date +%s)

log() { echo "test-deb: $*"; }
fail() {
	echo "test-deb: FAIL: $*" >&2
	exit 1
}
installed_list() { dpkg-query -W -f='${db:Status-Status} ${Package}\n' | awk '$1 == "installed" { print $2 }' | sort; }
apt() { apt-get -y -qq -o DPkg::Lock::Timeout=300 "$@" >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; fail "apt-get $*"; }; }
save_run() { printf '%s\n' "tmp $tmp" "state $state" "pid $pid" "cgroups ${cgroups[*]}" "new_pkgs $new_pkgs" >"$marker"; }

st=$(dpkg-query -W -f='${db:Status-Status}' sbx 2>/dev/null || true)
if [ -n "$st" ] && [ "$st" != not-installed ] && [ ! -e "$marker" ]; then
	log "SKIP: a package named sbx is installed on this machine, not by this test; not touching it"
	exit 0
fi

# teardown undoes a run: the one in the variables below.
teardown() {
	local d p id
	set +e
	# The server, if it is still up (a killed run's: only if it is that
	# run's, by its state directory).
	if [ -n "$pid" ] && tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx "SBX_STATE_DIR=$state"; then
		kill -KILL "$pid"
		wait "$pid" 2>/dev/null # this run's: a child to reap
		while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	fi
	# Sandboxes a failed run left, in the server's own runc state.
	if [ -d "$state/runc" ]; then
		for id in $(runc --root "$state/runc" list -q 2>/dev/null); do
			runc --root "$state/runc" delete --force "$id" >/dev/null 2>&1
		done
	fi
	# Mounts under the run's directories (the workspace image, bundles'
	# binds), deepest first, before anything is removed through them.
	findmnt -rn -o TARGET | awk -v a="$tmp/" -v b="$state/" 'index($0, a) == 1 || index($0, b) == 1' |
		sort -r | while read -r d; do umount -l "$d"; done
	for d in "${cgroups[@]}"; do
		# What is left (nothing, unless the run failed) goes back to the
		# root cgroup first.
		while read -r p; do echo "$p" >"$(dirname "$d")/cgroup.procs"; done <"$d/cgroup.procs" 2>/dev/null
		rmdir "$d" 2>/dev/null
	done
	if dpkg-query -W sbx >/dev/null 2>&1; then
		# shellcheck disable=SC2086 # a list
		apt-get purge -y -qq -o DPkg::Lock::Timeout=300 sbx $new_pkgs >"$state.purge.log" 2>&1 || cat "$state.purge.log" >&2
		rm -f "$state.purge.log"
	fi
	rm -rf --one-file-system "$tmp" "$state"
	rm -f "$marker"
}

# A run that was killed: undo it first.
if [ -e "$marker" ]; then
	log "undoing what a killed run left"
	tmp='' state='' pid='' new_pkgs='' cgroups=()
	while read -r k v; do
		case $k in
		tmp | state | pid | new_pkgs) printf -v "$k" %s "$v" ;;
		cgroups) read -ra cgroups <<<"$v" ;;
		esac
	done <"$marker"
	[[ $tmp == /var/tmp/sbx-test-deb.* && $state == /run/sbx-test-deb.* ]] || fail "$marker names unexpected directories: $tmp $state"
	(teardown)
fi

tmp=$(mktemp -d /var/tmp/sbx-test-deb.XXXXXX)
chmod 0755 "$tmp" # apt reads the package as _apt
state=$(mktemp -d /run/sbx-test-deb.XXXXXX)
pid=
cgroups=()
new_pkgs=
save_run
trap 'rc=$?; teardown; exit $rc' EXIT
trap 'exit 130' INT TERM

# 1. Build and install.
deb=$(make --no-print-directory -s deb DEBDIR="$tmp" | tail -n 1)
[ -f "$deb" ] || fail "make deb made no package ($deb)"
log "installing $(basename "$deb")"
before=$(installed_list)
apt install --no-install-recommends "$(realpath "$deb")"
new_pkgs=$(comm -13 <(echo "$before") <(installed_list) | grep -vx sbx | tr '\n' ' ' || true)
save_run
if [ -n "$new_pkgs" ]; then
	log "apt installed dependencies too, to purge at the end: $new_pkgs"
fi

# 2. What landed.
for f in /usr/bin/sbx /usr/bin/sbx-executor; do
	[ -x "$f" ] || fail "$f is missing or not executable"
done
[ -f "$unit" ] || fail "$unit is missing"
[ -f /usr/share/sbx/grafana/sbx.json ] || fail "the Grafana dashboard is missing"
[ "$(stat -c '%a %U' /etc/default/sbx)" = "600 root" ] || fail "/etc/default/sbx is not root's, mode 0600"
dpkg-query -W -f='${Conffiles}\n' sbx | grep -q '^ /etc/default/sbx ' || fail "/etc/default/sbx is not a conffile"
dpkg --verify sbx || fail "dpkg --verify sbx: installed files differ from the package's"
want=$(dpkg-deb -f "$deb" Version)
got=$(/usr/bin/sbx version)
v=${got#sbx }
v=${v#v}
[[ $want == *"${v//-/+}" ]] || fail "sbx version says $got; the package is $want"
if [ -e /etc/systemd/system/multi-user.target.wants/sbx.service ]; then
	fail "installing the package enabled sbx.service; the admin enables it"
fi

if command -v systemd-analyze >/dev/null; then
	# Offline, systemd-analyze verify loads the unit and its dependencies;
	# only what it says of this unit counts (other units of the machine
	# may have warnings of their own).
	out=$(systemd-analyze verify "$unit" 2>&1) || true
	if grep -i sbx <<<"$out"; then
		fail "systemd-analyze verify $unit complains (above)"
	fi
	log "systemd-analyze verify: nothing to say about sbx.service"
	exposure=$(systemd-analyze security --offline=yes "$unit" 2>/dev/null | tail -n 1 || true)
	log "systemd-analyze security: ${exposure#-> }"
elif [ -n "${CI:-}" ]; then
	fail "systemd-analyze is missing (Debian package systemd)"
else
	log "SKIP systemd-analyze verify: systemd-analyze is missing"
fi

# 3. Serve as the unit does. Its environment: Environment=, then
# /etc/default/sbx over it (EnvironmentFile= wins), then this test's
# overrides of the file's variables.
declare -A vars
unit_value() { sed -n "s/^$1=//p" "$unit"; }
read -ra words <<<"$(unit_value Environment)"
for kv in "${words[@]}"; do
	[[ $kv == *=* && $kv != *[\"\']* ]] || fail "cannot read Environment=$kv"
	vars[${kv%%=*}]=${kv#*=}
done
[ "$(unit_value EnvironmentFile)" = -/etc/default/sbx ] || fail "the unit's EnvironmentFile= is not -/etc/default/sbx"
while IFS= read -r line; do
	[[ $line =~ ^[[:space:]]*([#\;].*)?$ ]] && continue
	[[ $line =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || fail "/etc/default/sbx: cannot read: $line"
	k=${BASH_REMATCH[1]} v=${BASH_REMATCH[2]}
	if [[ $v =~ ^\"(.*)\"$ || $v =~ ^\'(.*)\'$ ]]; then v=${BASH_REMATCH[1]}; fi
	vars[$k]=$v
done </etc/default/sbx
[ "${vars[SBX_ADDR]}" = 127.0.0.1:7070 ] || fail "the default SBX_ADDR is ${vars[SBX_ADDR]}, not 127.0.0.1:7070"
# Port 0: the kernel picks a free one; the server logs which.
vars[SBX_ADDR]=127.0.0.1:0
vars[SBX_DATA_DIR]=$tmp/data
vars[SBX_STATE_DIR]=$state
# The machine's built templates (nothing is built: --prebuild=), and a
# small workspace image.
vars[SBX_OPTS]="${vars[SBX_OPTS]} --template-dir=$templates --prebuild= --workspace-image-size=1"

# ExecStart= as systemd expands it: ${VAR} within a word is that one word;
# $VAR alone as a word is split at whitespace into zero or more words.
# Anything else ($ elsewhere, quotes, specifiers, prefixes) is refused, so
# that a change to the unit cannot pass by being misread here.
argv=()
read -ra words <<<"$(unit_value ExecStart)"
for w in "${words[@]}"; do
	if [[ $w =~ ^\$([A-Za-z_][A-Za-z0-9_]*)$ ]]; then
		read -ra split <<<"${vars[${BASH_REMATCH[1]}]:-}"
		argv+=("${split[@]}")
		continue
	fi
	while [[ $w =~ \$\{([A-Za-z_][A-Za-z0-9_]*)\} ]]; do
		w=${w/"${BASH_REMATCH[0]}"/"${vars[${BASH_REMATCH[1]}]:-}"}
	done
	[[ $w != *[\$%\"\'\\]* ]] || fail "cannot expand the ExecStart= word $w"
	argv+=("$w")
done
[ "${argv[0]:-}" = /usr/bin/sbx ] || fail "ExecStart= does not run /usr/bin/sbx: ${argv[*]}"

# The hardening that applies without systemd: no_new_privs, the bounding
# set and the descriptor limit, read from the unit.
nofile=$(unit_value LimitNOFILE)
[[ $nofile =~ ^[0-9]+:[0-9]+$ ]] || fail "the unit has no LimitNOFILE=SOFT:HARD"
if ! prlimit --nofile="$nofile" true 2>/dev/null; then
	# systemd sets it as PID 1; this shell may not raise its hard limit
	# (no CAP_SYS_RESOURCE here, in a container, say).
	nofile=${nofile%:*}:$(ulimit -Hn)
	log "cannot raise the descriptor limit to LimitNOFILE=$(unit_value LimitNOFILE) here: serving with $nofile"
fi
wrap=(prlimit --nofile="$nofile" setpriv)
[ "$(unit_value NoNewPrivileges)" = yes ] && wrap+=(--no-new-privs)
caps=$(unit_value CapabilityBoundingSet)
if [ -n "$caps" ]; then
	[[ $caps == "~"* ]] || fail "CapabilityBoundingSet= is not a ~ list; the test applies only those"
	drop=$(tr ' ' '\n' <<<"${caps#\~}" | sed -n 's/^CAP_\(.*\)/-\L\1/p' | paste -sd,)
	wrap+=(--bounding-set "$drop")
fi
[[ ${wrap[*]} == *--no-new-privs*--bounding-set* ]] || fail "the unit lost NoNewPrivileges= or CapabilityBoundingSet=; the test expects both"

# A cgroup of the server's own, as the unit's: in the cgroup2 hierarchy
# systemd tracks services by, and in its name=systemd v1 one on a legacy
# or hybrid host.
for root in /sys/fs/cgroup /sys/fs/cgroup/unified /sys/fs/cgroup/systemd; do
	if [ -f "$root/cgroup.procs" ] && { [ -f "$root/cgroup.controllers" ] || [ "$root" = /sys/fs/cgroup/systemd ]; }; then
		d=$root/sbx-test-deb.$$
		mkdir -p "$d"
		cgroups+=("$d")
	fi
done
[ ${#cgroups[@]} -gt 0 ] || fail "no cgroup hierarchy to put the server in"
save_run

envv=()
for k in "${!vars[@]}"; do envv+=("$k=${vars[$k]}"); done
log "serving: ${argv[*]}"
# shellcheck disable=SC2016 # $$ and $@ are the inner shell's
env -i PATH="$svc_path" "${envv[@]}" sh -c '
	for d in '"${cgroups[*]}"'; do echo $$ >"$d/cgroup.procs"; done
	umask 022
	exec "$@"' sh "${wrap[@]}" -- "${argv[@]}" 2>"$tmp/server.log" &
pid=$!
save_run

url=
for _ in $(seq 600); do
	url=$(grep -o '"url":"http://[^"]*"' "$tmp/server.log" | head -n 1 | cut -d'"' -f4 || true)
	[ -n "$url" ] && break
	kill -0 "$pid" 2>/dev/null || { cat "$tmp/server.log" >&2; fail "the server exited"; }
	sleep 0.1
done
[ -n "$url" ] || { cat "$tmp/server.log" >&2; fail "the server did not start serving in 60 s"; }
port=${url##*:}
grep -q '^NoNewPrivs:[[:space:]]*1' "/proc/$pid/status" || fail "the server runs without no_new_privs"

# GET /healthz over bash's /dev/tcp: no HTTP client needed.
status=
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
read -r _ status _ <&3 || true
exec 3<&-
[ "$status" = 200 ] || fail "GET /healthz: $status, want 200"
log "GET $url/healthz: 200"

sbx() { env -i PATH="$svc_path" /usr/bin/sbx "$@" --server "$url"; }
if [ ! -d "$templates" ] || env -i PATH="$svc_path" /usr/bin/sbx template ls --data-dir "${templates%/templates}" | awk '$1 == "python" && $2 == "-" { f = 1 } END { exit !f }'; then
	log "SKIP the execution: the python template is not built in $templates (make test-integration builds it; here it would take minutes)"
else
	sbx session create --id test-deb --template python >/dev/null || { cat "$tmp/server.log" >&2; fail "sbx session create"; }
	out=$(sbx exec test-deb -c 'print(1)') || { echo "$out" >&2; cat "$tmp/server.log" >&2; fail "sbx exec"; }
	if ! grep -q '"status": *"completed"' <<<"$out" || ! grep -q '"stdout": *"1\\n"' <<<"$out"; then
		fail "print(1) did not print 1: $out"
	fi
	log "print(1) through the API, in a sandbox of the packaged server: completed, stdout 1"
	# The sandbox is up. Only the server may be in the server's cgroup:
	# what else is there, systemd kills when the unit stops.
	for d in "${cgroups[@]}"; do
		others=$(grep -vx "$pid" "$d/cgroup.procs" || true)
		if [ -n "$others" ]; then
			for p in $others; do echo "  $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" >&2; done
			fail "processes other than the server are in its cgroup $d: stopping the unit would kill them"
		fi
	done
	log "no sandbox process is in the server's cgroup"
	sbx session rm test-deb >/dev/null || fail "sbx session rm"
fi

# 4. Stop (SIGTERM, as KillMode=mixed sends the main process), purge, and
# check that nothing is left.
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || { cat "$tmp/server.log" >&2; fail "the server exited $rc on SIGTERM"; }
for d in "${cgroups[@]}"; do
	[ -z "$(cat "$d/cgroup.procs")" ] || fail "processes outlived the server in $d: $(cat "$d/cgroup.procs")"
done
log "the server stopped on SIGTERM, and left nothing in its cgroup"

# shellcheck disable=SC2086 # a list
apt purge sbx $new_pkgs
st=$(dpkg-query -W -f='${db:Status-Status}' sbx 2>/dev/null || true)
[ -z "$st" ] || [ "$st" = not-installed ] || fail "sbx is $st after the purge"
for f in /etc/default/sbx "$unit" /usr/bin/sbx /usr/bin/sbx-executor /usr/share/sbx /usr/share/doc/sbx \
	/etc/systemd/system/multi-user.target.wants/sbx.service /etc/systemd/system/sbx.service \
	/var/lib/systemd/deb-systemd-helper-enabled/sbx.service.dsh-also /var/lib/systemd/deb-systemd-helper-masked/sbx.service; do
	if [ -e "$f" ] || [ -L "$f" ]; then fail "$f is left after the purge"; fi
done
log "purged; nothing left ($(($(date +%s) - start)) s)"
