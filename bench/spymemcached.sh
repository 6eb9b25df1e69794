#!/usr/bin/env bash
# A Java service's load (bench/java/SpyLoad.java): one spymemcached client, one connection
# that pipelines the operations of THREADS threads, each setting one of its own keys and
# getting it back, against memcached direct, through twemproxy (nutcracker, text only) and
# through moxi (and moxi with GOMAXPROCS=1), and through two byte relays, the floor of a
# proxy hop (HAProxy in TCP mode with 2 threads, and socat: bench/lib.sh start_relay), and
# bench/floor (2 loops) and bench/floor -codecs, all in front of the same memcached; text
# protocol (DefaultConnectionFactory) and binary (BinaryConnectionFactory), interleaved over
# ROUNDS rounds. Prints the median ops/s and get p50 latency of each, the ratios
# moxi/twemproxy, moxi/direct and moxi/HAProxy, and the errors and wrong answers (a get that did not return
# the value its thread had just set); any wrong answer makes it exit 1.
#
#   bench/spymemcached.sh                  # 3 rounds of 5 s (after 1 s of warm-up) each
#   ROUNDS=5 DURATION=10 THREADS=16 WARMUP=1 VALUE=100 bench/spymemcached.sh
#   MOXI_BASE=b200225 bench/spymemcached.sh   # also moxi built at that commit, in the same rounds
#
# Everything listens on 127.0.0.1 ports chosen here and is stopped on exit.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
THREADS=${THREADS:-16}
WARMUP=${WARMUP:-1}
VALUE=${VALUE:-100}
setup ./scripts/install-bench-deps.sh
build_moxi
build_base
# spymemcached needs no other jar: its logging and metrics libraries load only when configured.
jar=$(dpkg -L libspymemcached-java | grep '/usr/share/java/spymemcached\.jar$')
javac -d "$work/classes" -cp "$jar" bench/java/SpyLoad.java
start_targets
rl=$(freeport); start_relay "$rl" "$mc"
go build -o "$work/floor" ./bench/floor
fl2=$(freeport); spawn "$work/floor" -listen "127.0.0.1:$fl2" -backend "127.0.0.1:$mc" -loops 2
flc=$(freeport); spawn "$work/floor" -listen "127.0.0.1:$flc" -backend "127.0.0.1:$mc" -loops 2 -codecs
waitport "$fl2"; waitport "$flc"

declare -A port=([direct]=$mc [twemproxy]=$tw [moxi]=$mx [moxi-1thread]=$mx1 [haproxy]=$hp2 [relay]=$rl
	[floor-2loops]=$fl2 [floor-codecs]=$flc)

# run PROTOCOL TARGET: one SpyLoad run; its ops/s, get p50, errors and wrong answers are
# appended to $work/{ops_per_s,get_p50_us,errors,wrong}.PROTOCOL.TARGET.
run() {
	local proto=$1 target=$2 out
	# SpyLoad stops its load after WARMUP+DURATION s; the timeout bounds a hung JVM.
	out=$(timeout $((WARMUP + DURATION + 60)) java -cp "$work/classes:$jar" SpyLoad \
		"127.0.0.1:${port[$target]}" "$proto" "$THREADS" "$DURATION" "$WARMUP" "$VALUE") ||
		{ echo "SpyLoad $proto against $target failed" >&2; exit 1; }
	field() { echo "$out" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
	for f in ops_per_s get_p50_us errors wrong; do field "$f" >> "$work/$f.$proto.$target"; done
	printf '  %-7s %-13s %8s ops/s  get p50 %5s µs  p99 %6s µs  errors %s  wrong %s\n' "$proto" "$target" \
		"$(field ops_per_s)" "$(field get_p50_us)" "$(field get_p99_us)" "$(field errors)" "$(field wrong)"
}

sum() { awk '{s += $1} END {print s + 0}' "$work/$1"; }
# ops PROTOCOL.TARGET: the median ops/s.
ops() { median "ops_per_s.$1" %.0f; }

text=(direct twemproxy moxi moxi-1thread haproxy relay floor-2loops floor-codecs)
binary=(direct moxi moxi-1thread haproxy relay floor-2loops floor-codecs)
if [ -n "$mxb" ]; then # MOXI_BASE: moxi at that commit, in the same rounds
	port[moxi-base]=$mxb
	text+=(moxi-base)
	binary+=(moxi-base)
fi
echo "spymemcached: 1 client, $THREADS threads of set-then-get, ${DURATION}s (after ${WARMUP}s warm-up), $VALUE-byte values," \
	"$ROUNDS interleaved rounds; $(nproc) cores"
for r in $(seq "$ROUNDS"); do
	echo "round $r"
	for t in "${text[@]}"; do run text "$t"; done
	for t in "${binary[@]}"; do run binary "$t"; done
done

echo
echo "median over $ROUNDS rounds (ops/s: a set and a get are two operations); moxi(1proc): GOMAXPROCS=1"
row() { printf '  %-7s %-13s %9s %12s %8s %8s\n' "$@"; }
row proto target ops/s "get p50 µs" errors wrong
wrongs=0
for proto in text binary; do
	declare -n targets=$proto
	for t in "${targets[@]}"; do
		w=$(sum "wrong.$proto.$t")
		wrongs=$((wrongs + w))
		row "$proto" "${t/moxi-1thread/moxi(1proc)}" "$(ops "$proto.$t")" \
			"$(median "get_p50_us.$proto.$t" %.0f)" "$(sum "errors.$proto.$t")" "$w"
	done
done
echo "ratios (ops/s)"
echo "  text:   moxi/twemproxy $(ratio "$(ops text.moxi)" "$(ops text.twemproxy)")" \
	" moxi/direct $(ratio "$(ops text.moxi)" "$(ops text.direct)")" \
	" moxi(1proc)/twemproxy $(ratio "$(ops text.moxi-1thread)" "$(ops text.twemproxy)")"
echo "  binary: moxi/direct $(ratio "$(ops binary.moxi)" "$(ops binary.direct)")" \
	" moxi(1proc)/direct $(ratio "$(ops binary.moxi-1thread)" "$(ops binary.direct)")"
echo "  moxi/HAProxy (2 threads, TCP mode): text $(ratio "$(ops text.moxi)" "$(ops text.haproxy)")" \
	" binary $(ratio "$(ops binary.moxi)" "$(ops binary.haproxy)")"
echo "  bench/floor (2 loops)/HAProxy: text $(ratio "$(ops text.floor-2loops)" "$(ops text.haproxy)")" \
	" binary $(ratio "$(ops binary.floor-2loops)" "$(ops binary.haproxy)");" \
	" bench/floor -codecs/HAProxy: text $(ratio "$(ops text.floor-codecs)" "$(ops text.haproxy)")" \
	" binary $(ratio "$(ops binary.floor-codecs)" "$(ops binary.haproxy)")"
echo "  relay (socat, no work at all): text relay/twemproxy $(ratio "$(ops text.relay)" "$(ops text.twemproxy)")" \
	" text relay/direct $(ratio "$(ops text.relay)" "$(ops text.direct)")" \
	" binary relay/direct $(ratio "$(ops binary.relay)" "$(ops binary.direct)")"
if [ -n "$mxb" ]; then
	echo "  moxi at $MOXI_BASE (moxi-base)/HAProxy: text $(ratio "$(ops text.moxi-base)" "$(ops text.haproxy)")" \
		" binary $(ratio "$(ops binary.moxi-base)" "$(ops binary.haproxy)")"
fi
if [ "$wrongs" -gt 0 ]; then
	echo "FAIL: $wrongs wrong answers (a get that did not return the value its thread had just set)" >&2
	exit 1
fi
