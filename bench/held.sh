#!/usr/bin/env bash
# What idle client connections cost: CONNS connections that each send one get and then stay
# open, held against memcached directly, twemproxy (nutcracker) and moxi (plain TCP, and TLS
# apart) in the same run, interleaved round by round. Per connection: the growth of each
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
direct=$(freeport); spawn memcached -u nobody -l 127.0.0.1 -p "$direct" -U 0 -m 64 -t 4 -c $((CONNS + 1000)); directpid=${pids[-1]}; waitport "$direct"
tw=$(freeport); start_twemproxy "$tw" "$mc"; twpid=${pids[-1]}
# start_held_moxi PORT ADMIN: moxi (or $MOXI_BIN) in front of memcached, taking CONNS and more.
start_held_moxi() {
	cat >"$work/moxi.$1.yaml" <<YAML
listen: 127.0.0.1:$1
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
mxadmin=$(freeport)
mx=$(freeport); start_held_moxi "$mx" "$mxadmin"; mxpid=${pids[-1]}
targets=(memcached twemproxy moxi)
declare -A addr=([memcached]=$direct [twemproxy]=$tw [moxi]=$mx)
declare -A pidof=([memcached]=$directpid [twemproxy]=$twpid [moxi]=$mxpid)
declare -A adminof=([moxi]=$mxadmin)
if [ -x "$work/moxi-base" ]; then
	mxbadmin=$(freeport)
	mxb=$(freeport); MOXI_BIN="$work/moxi-base" start_held_moxi "$mxb" "$mxbadmin"
	targets+=(moxi-base); addr[moxi-base]=$mxb; pidof[moxi-base]=${pids[-1]}; adminof[moxi-base]=$mxbadmin
fi

for round in $(seq "$ROUNDS"); do
	for t in "${targets[@]}"; do
		out=$("$work/held" -addr "127.0.0.1:${addr[$t]}" -pid "${pidof[$t]}" -conns "$CONNS" -settle "$SETTLE" \
			-sources "$SOURCES" ${adminof[$t]:+-admin "127.0.0.1:${adminof[$t]}"})
		echo "round $round $t: $out"
		for field in rss_kb_per_conn heap_kb_per_conn probe_p99_us answered_again; do
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
