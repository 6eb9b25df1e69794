#!/usr/bin/env bash
# What idle client connections cost: CONNS connections that each send one get and then stay
# open, held against memcached directly, twemproxy (nutcracker) and moxi (plain TCP, and TLS
# apart: moxi-tls) in the same run, interleaved round by round, each a fresh process. Per connection: the growth of each
# server's resident memory after SETTLE, and moxi's live heap (after a collection) and
# goroutines; then every held connection speaks again and must be answered. A probe
# connection's get p99 without and with the held connections shows what they cost others.
#
#   bench/held.sh                     # 3 rounds of 10,000 connections, 10 s settle
#   CONNS=100000 bench/held.sh        # needs ulimit -n above CONNS here and in the servers
#   MOXI_BASE=1bc1ffb bench/held.sh   # also moxi built at that commit, in the same rounds
#
# More than about 28,000 connections to one port need more source addresses: SOURCES lists
# loopback addresses to connect from (127.0.0.1 through 127.0.0.4 by default).
# Everything listens on 127.0.0.1 ports chosen here and is stopped on exit.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-10000}
SETTLE=${SETTLE:-10s}
SOURCES=${SOURCES:-127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4}
setup ./scripts/install-bench-deps.sh
build_moxi
build_base
go build -o "$work/held" ./bench/held
if [ "$(ulimit -Hn)" -le "$CONNS" ]; then
	echo "ulimit -n is $(ulimit -Hn) here: $CONNS connections need more (LimitNOFILE, docs/operating.md)" >&2
	exit 1
fi
ulimit -n "$(ulimit -Hn)"

mc=$(freeport); start_memcached "$mc"

# A certificate for moxi's TLS listener (moxi-tls).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=127.0.0.1 \
	-addext subjectAltName=IP:127.0.0.1 -keyout "$work/tls.key" -out "$work/tls.crt" 2>/dev/null

# start_held_moxi PORT ADMIN [TLS]: moxi (or $MOXI_BIN) in front of memcached, taking CONNS
# and more; with TLS (any word) its listener is TLS.
start_held_moxi() {
	local tls=""
	[ -z "${3:-}" ] || tls="tls: {cert: $work/tls.crt, key: $work/tls.key}"
	cat >"$work/moxi.$1.yaml" <<YAML
listen: 127.0.0.1:$1
$tls
admin: 127.0.0.1:$2
watch_config: false
limits: {max_connections: $((CONNS + 1000))}
pools:
  main:
    servers: ["127.0.0.1:$mc"]
YAML
	spawn "${MOXI_BIN:-$work/moxi}" --config "$work/moxi.$1.yaml" --log-level warn --pprof
	waitport "$1"
}

# start_target NAME: a fresh process of NAME, so that each round measures from its start;
# sets port, pid and admin.
start_target() {
	port=$(freeport) admin=
	case $1 in
	memcached) spawn memcached -u nobody -l 127.0.0.1 -p "$port" -U 0 -m 64 -t 4 -c $((CONNS + 1000)); waitport "$port" ;;
	twemproxy) start_twemproxy "$port" "$mc" ;;
	moxi) admin=$(freeport); start_held_moxi "$port" "$admin" ;;
	moxi-tls) admin=$(freeport); start_held_moxi "$port" "$admin" tls ;;
	moxi-base) admin=$(freeport); MOXI_BIN="$work/moxi-base" start_held_moxi "$port" "$admin" ;;
	esac
	pid=${pids[-1]}
}

targets=(memcached twemproxy moxi moxi-tls)
[ -x "$work/moxi-base" ] && targets+=(moxi-base)
for round in $(seq "$ROUNDS"); do
	for t in "${targets[@]}"; do
		start_target "$t"
		out=$("$work/held" -addr "127.0.0.1:$port" -pid "$pid" -conns "$CONNS" -settle "$SETTLE" \
			-sources "$SOURCES" ${admin:+-admin "127.0.0.1:$admin"} $([ "$t" = moxi-tls ] && echo -tls))
		kill "$pid"
		echo "round $round $t: $out"
		for field in rss_kb_per_conn heap_kb_per_conn probe_p99_us; do
			v=$(tr ' ' '\n' <<<"$out" | grep -A1 -x "$field" | tail -1 || true)
			[ -n "$v" ] && echo "${v%%→*}" >>"$work/$t.$field.before" && echo "${v##*→}" >>"$work/$t.$field"
		done
	done
done

echo
echo "median of $ROUNDS rounds, $CONNS connections each sending one get then idle for $SETTLE:"
for t in "${targets[@]}"; do
	printf '%-10s RSS %s KB/conn' "$t" "$(median "$t.rss_kb_per_conn" %.2f)"
	[ -s "$work/$t.heap_kb_per_conn" ] && printf ', live heap %s KB/conn' "$(median "$t.heap_kb_per_conn" %.2f)"
	printf ', probe p99 %s µs with them (%s without)\n' "$(median "$t.probe_p99_us" %.0f)" "$(median "$t.probe_p99_us.before" %.0f)"
done
