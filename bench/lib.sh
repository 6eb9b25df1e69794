# Process orchestration shared by the bench scripts, which source it: a temp dir and the
# processes they start, all stopped on exit; memcached, twemproxy (nutcracker), HAProxy and
# moxi in front of it on free 127.0.0.1 ports; the median and ratio of the results.
# shellcheck shell=bash

work=
pids=()

# setup [INSTALLER...]: moves to the repository root, puts go and nutcracker on PATH, runs
# scripts/install-deps.sh and then each INSTALLER, and makes $work, a temp dir; on exit every
# process started with spawn is killed and $work removed.
# shellcheck disable=SC2120 # INSTALLERs are optional
setup() {
	cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit
	export PATH="$PATH:/usr/local/go/bin:/usr/sbin"
	local installer
	for installer in ./scripts/install-deps.sh "$@"; do "$installer"; done
	work=$(mktemp -d)
	trap cleanup EXIT
}

# cleanup: the EXIT trap set by setup.
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}

# spawn COMMAND...: runs COMMAND in the background, to be killed on exit.
spawn() { "$@" & pids+=($!); }

# freeport: prints a TCP port free on 127.0.0.1 now.
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# waitport PORT: waits up to 5 s for 127.0.0.1:PORT to accept a connection, else exits.
waitport() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

# build_moxi: builds $work/moxi. Others may be editing moxi while this runs: a build that
# fails is retried for a minute.
build_moxi() {
	local try
	for try in $(seq 6); do
		go build -o "$work/moxi" ./cmd/moxi && return 0
		[ "$try" -lt 6 ] || { echo "moxi does not build" >&2; exit 1; }
		sleep 10
	done
}

# build_base: when MOXI_BASE names a commit (the starting point of a change), builds moxi
# at that commit into $work/moxi-base, which start_targets then runs beside this one
# ("moxi-base", on $mxb), so that a change is measured against where it started in one run.
build_base() {
	[ -n "${MOXI_BASE:-}" ] || return 0
	git worktree add -q --detach "$work/base-src" "$MOXI_BASE"
	(cd "$work/base-src" && go build -o "$work/moxi-base" ./cmd/moxi)
	git worktree remove --force "$work/base-src"
}

# start_memcached PORT: memcached on 127.0.0.1:PORT, UDP off, 1 GiB, 4 threads.
start_memcached() {
	spawn memcached -u nobody -l 127.0.0.1 -p "$1" -U 0 -m 1024 -t 4
	waitport "$1"
}

# start_twemproxy PORT BACKEND: nutcracker on 127.0.0.1:PORT in front of memcached on BACKEND.
start_twemproxy() {
	local stats
	stats=$(freeport)
	cat > "$work/nutcracker.yml" <<YAML
bench:
  listen: 127.0.0.1:$1
  hash: md5
  distribution: ketama
  timeout: 2000
  servers:
   - 127.0.0.1:$2:1
YAML
	spawn nutcracker -c "$work/nutcracker.yml" -s "$stats" -a 127.0.0.1 -o "$work/nutcracker.log"
	waitport "$1"
}

# start_moxi PORT BACKEND [FLAG...]: $work/moxi (or $MOXI_BIN) on 127.0.0.1:PORT with one pool, memcached on
# BACKEND; no admin (unless a FLAG asks for it), no file watching.
start_moxi() {
	local port=$1 backend=$2
	shift 2
	cat > "$work/moxi.$port.yaml" <<YAML
listen: 127.0.0.1:$port
admin: ""
watch_config: false
pools:
  main:
    servers: ["127.0.0.1:$backend"]
YAML
	spawn "${MOXI_BIN:-$work/moxi}" --config "$work/moxi.$port.yaml" --log-level warn "$@"
	waitport "$port"
}

# start_relay PORT BACKEND: socat relaying each connection to 127.0.0.1:PORT to BACKEND, byte
# for byte (a process per connection): a proxy hop with no work in it at all, the floor of
# what one costs a client that keeps one connection.
start_relay() {
	spawn socat "TCP-LISTEN:$1,bind=127.0.0.1,reuseaddr,fork,nodelay" "TCP:127.0.0.1:$2,nodelay"
	waitport "$1"
}

# start_haproxy PORT BACKEND THREADS: HAProxy in TCP mode on 127.0.0.1:PORT with THREADS
# threads, relaying each connection to BACKEND byte for byte: it parses and routes nothing,
# and on a host this small it is the floor of what a proxy hop costs.
start_haproxy() {
	cat > "$work/haproxy.$1.cfg" <<CFG
global
	nbthread $3
	maxconn 4096
defaults
	mode tcp
	timeout connect 5s
	timeout client 1h
	timeout server 1h
listen memcached
	bind 127.0.0.1:$1
	server memcached 127.0.0.1:$2
CFG
	spawn haproxy -db -q -f "$work/haproxy.$1.cfg"
	waitport "$1"
}

# start_targets [FLAG...]: memcached on port $mc, twemproxy in front of it on $tw, moxi on $mx
# (with FLAGs) and on $mx1 the same moxi limited to one OS thread (GOMAXPROCS=1), as twemproxy
# is: on a small host shared with the load generator and memcached it avoids cross-thread
# wake-ups; and HAProxy with 1 and 2 threads on $hp1 and $hp2. Needs build_moxi first.
# shellcheck disable=SC2120 # FLAGs are optional
# Their process ids: $twpid, $mxpid, $mx1pid, $hp1pid, $hp2pid. With build_base's moxi-base,
# that too on $mxb ($mxbpid).
start_targets() {
	mc=$(freeport); start_memcached "$mc"
	tw=$(freeport); start_twemproxy "$tw" "$mc"; twpid=${pids[-1]}
	hp1=$(freeport); start_haproxy "$hp1" "$mc" 1; hp1pid=${pids[-1]}
	hp2=$(freeport); start_haproxy "$hp2" "$mc" 2; hp2pid=${pids[-1]}
	mx=$(freeport); start_moxi "$mx" "$mc" "$@"; mxpid=${pids[-1]}
	mx1=$(freeport); GOMAXPROCS=1 start_moxi "$mx1" "$mc"; mx1pid=${pids[-1]}
	mxb= mxbpid=
	if [ -x "$work/moxi-base" ]; then
		mxb=$(freeport); MOXI_BIN="$work/moxi-base" start_moxi "$mxb" "$mc"; mxbpid=${pids[-1]}
	fi
}

# cputicks PID: the user and system CPU time PID has used, in clock ticks (CLK_TCK).
cputicks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# median FILE [FORMAT]: the median of the numbers in $work/FILE, one a line, printed with
# awk's printf FORMAT (by default %s, as awk prints a number).
median() { sort -n "$work/$1" | awk -v f="${2:-%s}" '{a[NR]=$1} END {printf f, (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# ratio A B: A/B to two decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }
