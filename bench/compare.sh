#!/usr/bin/env bash
# Throughput of memcached direct, through twemproxy (nutcracker), through HAProxy in TCP mode
# (1 and 2 threads: a byte relay, the floor of a proxy hop here) and through moxi, measured
# with memcaslap in the same run, interleaved round by round so that machine noise hits them
# all alike. Prints the median TPS of each and the ratios of moxi to twemproxy, HAProxy and
# direct, and the CPU each proxy spends per request (user + system time over the run's
# requests).
# The same runs measure bench/floor, a forwarder with no features built as event loops (one
# loop, and two: one a core here), as the floor of what a proxy hop costs on this machine, and
# bench/floor -codecs (two loops), which also decodes and encodes every request and
# answer with moxi's codecs: the floor of moxi's own request path.
#
#   bench/compare.sh                 # 3 rounds of 10 s each, ascii then binary
#   ROUNDS=5 DURATION=20s bench/compare.sh
#   PROFILE=bench/moxi.cpu bench/compare.sh   # also a CPU profile of moxi during one ascii run
#   MOXI_BASE=b200225 bench/compare.sh        # also moxi built at that commit, in the same rounds
#
# Everything listens on 127.0.0.1 ports chosen here and is stopped on exit.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-32}
VALUE=${VALUE:-100}
setup ./scripts/install-bench-deps.sh
build_moxi
build_base
# moxi has an admin port for PROFILE's pprof endpoint.
admin=$(freeport)
start_targets --admin "127.0.0.1:$admin" ${PROFILE:+--pprof}
go build -o "$work/floor" ./bench/floor
fl1=$(freeport); spawn "$work/floor" -listen "127.0.0.1:$fl1" -backend "127.0.0.1:$mc" -loops 1; fl1pid=${pids[-1]}
fl2=$(freeport); spawn "$work/floor" -listen "127.0.0.1:$fl2" -backend "127.0.0.1:$mc" -loops 2; fl2pid=${pids[-1]}
flc=$(freeport); spawn "$work/floor" -listen "127.0.0.1:$flc" -backend "127.0.0.1:$mc" -loops 2 -codecs; flcpid=${pids[-1]}
waitport "$fl1"; waitport "$fl2"; waitport "$flc"

declare -A pidof=([twemproxy]=$twpid [moxi]=$mxpid [moxi-1thread]=$mx1pid [moxi-binary]=$mxpid [moxi-1thread-bin]=$mx1pid
	[haproxy-1thread]=$hp1pid [haproxy-2threads]=$hp2pid [haproxy-1thread-bin]=$hp1pid [haproxy-2threads-bin]=$hp2pid
	[floor-1loop]=$fl1pid [floor-2loops]=$fl2pid [floor-1loop-bin]=$fl1pid [floor-2loops-bin]=$fl2pid
	[floor-codecs]=$flcpid [floor-codecs-bin]=$flcpid
	[moxi-base]=$mxbpid [moxi-base-bin]=$mxbpid)
hz=$(getconf CLK_TCK)

# run NAME PORT [memcaslap flags...]: one memcaslap run, TPS appended to $work/tps.NAME and,
# for a proxy, its CPU µs per request to $work/cpu.NAME.
run() {
	local name=$1 port=$2; shift 2
	local out pid=${pidof[$name]:-} before=0
	[ -z "$pid" ] || before=$(cputicks "$pid")
	out=$(memcaslap -s "127.0.0.1:$port" -T 1 -c "$CONCURRENCY" -t "$DURATION" -X "$VALUE" "$@" 2>&1)
	local tps cpu=""
	tps=$(echo "$out" | sed -n 's/.*TPS: \([0-9]*\).*/\1/p' | tail -1)
	[ -n "$tps" ] || { echo "memcaslap against $name printed no TPS:" >&2; echo "$out" >&2; exit 1; }
	echo "$tps" >> "$work/tps.$name"
	if [ -n "$pid" ]; then
		cpu=$(awk -v t="$(( $(cputicks "$pid") - before ))" -v hz="$hz" -v tps="$tps" -v d="${DURATION%s}" \
			'BEGIN {printf "%.1f", t / hz * 1e6 / (tps * d)}')
		echo "$cpu" >> "$work/cpu.$name"
		cpu="  $cpu µs CPU/request"
	fi
	printf '  %-16s %8s ops/s%s\n' "$name" "$tps" "$cpu"
}

echo "memcaslap -T 1 -c $CONCURRENCY -t $DURATION -X $VALUE, $ROUNDS interleaved rounds; $(nproc) cores"
for r in $(seq "$ROUNDS"); do
	echo "round $r (ascii)"
	run direct "$mc"
	run twemproxy "$tw"
	if [ -n "${PROFILE:-}" ] && [ "$r" = 1 ]; then
		secs=$(( ${DURATION%s} > 2 ? ${DURATION%s} - 2 : 1 ))
		curl -s -o "$PROFILE" "http://127.0.0.1:$admin/debug/pprof/profile?seconds=$secs" &
		prof=$!
		run moxi "$mx"
		wait "$prof"
	else
		run moxi "$mx"
	fi
	[ -z "$mxb" ] || run moxi-base "$mxb"
	run moxi-1thread "$mx1"
	run haproxy-1thread "$hp1"
	run haproxy-2threads "$hp2"
	run floor-1loop "$fl1"
	run floor-2loops "$fl2"
	run floor-codecs "$flc"
done
for r in $(seq "$ROUNDS"); do
	echo "round $r (binary)"
	run direct-binary "$mc" -B
	run moxi-binary "$mx" -B
	[ -z "$mxb" ] || run moxi-base-bin "$mxb" -B
	run moxi-1thread-bin "$mx1" -B
	run haproxy-1thread-bin "$hp1" -B
	run haproxy-2threads-bin "$hp2" -B
	run floor-1loop-bin "$fl1" -B
	run floor-2loops-bin "$fl2" -B
	run floor-codecs-bin "$flc" -B
done

d=$(median tps.direct); t=$(median tps.twemproxy); m=$(median tps.moxi); m1=$(median tps.moxi-1thread)
db=$(median tps.direct-binary); mb=$(median tps.moxi-binary); mb1=$(median tps.moxi-1thread-bin)
echo
echo "median ops/s   ascii: direct $d  twemproxy $t  moxi $m  moxi(GOMAXPROCS=1) $m1"
echo "               binary: direct $db  moxi $mb  moxi(GOMAXPROCS=1) $mb1"
echo "ratios         ascii: moxi/twemproxy $(ratio "$m" "$t")  moxi/direct $(ratio "$m" "$d")  twemproxy/direct $(ratio "$t" "$d")"
echo "                      moxi(GOMAXPROCS=1)/twemproxy $(ratio "$m1" "$t")  moxi(GOMAXPROCS=1)/direct $(ratio "$m1" "$d")"
echo "               binary: moxi/direct $(ratio "$mb" "$db")  moxi(GOMAXPROCS=1)/direct $(ratio "$mb1" "$db")"
ct=$(median cpu.twemproxy); cm=$(median cpu.moxi); cm1=$(median cpu.moxi-1thread)
echo "CPU µs/request ascii: twemproxy $ct  moxi $cm  moxi(GOMAXPROCS=1) $cm1;  moxi/twemproxy $(ratio "$cm" "$ct")  moxi(GOMAXPROCS=1)/twemproxy $(ratio "$cm1" "$ct")"
echo "               binary: moxi $(median cpu.moxi-binary)  moxi(GOMAXPROCS=1) $(median cpu.moxi-1thread-bin)"
f1=$(median tps.floor-1loop); f2=$(median tps.floor-2loops); fb1=$(median tps.floor-1loop-bin); fb2=$(median tps.floor-2loops-bin)
cf1=$(median cpu.floor-1loop); cf2=$(median cpu.floor-2loops)
echo "floor (bench/floor: a forwarder with no features, as event loops):"
echo "  ascii: 1 loop $f1 ops/s: /twemproxy $(ratio "$f1" "$t")  /direct $(ratio "$f1" "$d");  2 loops $f2 ops/s: /twemproxy $(ratio "$f2" "$t")  /direct $(ratio "$f2" "$d")"
echo "  binary: 1 loop $fb1 ops/s: /direct $(ratio "$fb1" "$db");  2 loops $fb2 ops/s: /direct $(ratio "$fb2" "$db")"
echo "  CPU µs/request ascii: 1 loop $cf1 ($(ratio "$cf1" "$ct") of twemproxy)  2 loops $cf2 ($(ratio "$cf2" "$ct"))"
fc=$(median tps.floor-codecs); fcb=$(median tps.floor-codecs-bin); cfc=$(median cpu.floor-codecs); cfcb=$(median cpu.floor-codecs-bin)
cfb2=$(median cpu.floor-2loops-bin); cmb=$(median cpu.moxi-binary)
echo "floor -codecs (2 loops: also decodes and encodes with moxi's codecs):"
echo "  ascii $fc ops/s, $cfc µs CPU/request ($(ratio "$cfc" "$cf2") of the floor's);  binary $fcb ops/s, $cfcb µs ($(ratio "$cfcb" "$cfb2") of the floor's)"
echo "  moxi CPU/request / floor -codecs': ascii $(ratio "$cm" "$cfc")  binary $(ratio "$cmb" "$cfcb")"
h1=$(median tps.haproxy-1thread); h2=$(median tps.haproxy-2threads); hb2=$(median tps.haproxy-2threads-bin)
ch1=$(median cpu.haproxy-1thread); ch2=$(median cpu.haproxy-2threads)
echo "HAProxy (TCP mode, a byte relay): ascii 1 thread $h1 ops/s, 2 threads $h2 ops/s; binary 2 threads $hb2 ops/s"
echo "  CPU µs/request ascii: 1 thread $ch1  2 threads $ch2"
echo "  moxi/HAProxy-2threads: ascii throughput $(ratio "$m" "$h2")  binary throughput $(ratio "$mb" "$hb2")  ascii CPU/request $(ratio "$cm" "$ch2")"
echo "  moxi CPU/request / twemproxy's $(ratio "$cm" "$ct")"
[ -z "${PROFILE:-}" ] || echo "moxi CPU profile: $PROFILE (go tool pprof -top $PROFILE)"
if [ -n "$mxb" ]; then
	bm=$(median tps.moxi-base); bmb=$(median tps.moxi-base-bin); cbm=$(median cpu.moxi-base)
	echo "moxi at $MOXI_BASE (moxi-base): ascii $bm ops/s, binary $bmb ops/s, CPU µs/request ascii $cbm"
	echo "  moxi-base/HAProxy-2threads: ascii throughput $(ratio "$bm" "$h2")  binary throughput $(ratio "$bmb" "$hb2")  ascii CPU/request $(ratio "$cbm" "$ch2")"
	echo "  per round, moxi and moxi-base / HAProxy-2threads (ascii throughput, ascii CPU/request):"
	paste "$work/tps.moxi" "$work/tps.moxi-base" "$work/tps.haproxy-2threads" "$work/cpu.moxi" "$work/cpu.moxi-base" "$work/cpu.haproxy-2threads" |
		awk '{printf "    round %d: throughput %.2f %.2f  CPU %.2f %.2f\n", NR, $1/$3, $2/$3, $4/$6, $5/$6}'
fi
