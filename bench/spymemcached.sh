#!/usr/bin/env bash
# A Java service's load (bench/java/SpyLoad.java): one spymemcached client, one connection
# that pipelines the operations of THREADS threads, each setting one of its own keys and
# getting it back, against memcached direct, through twemproxy (nutcracker, text only) and
# through moxi (and moxi with GOMAXPROCS=1), all in front of the same memcached; text
# protocol (DefaultConnectionFactory) and binary (BinaryConnectionFactory), interleaved over
# ROUNDS rounds. Prints the median ops/s and get p50 latency of each, the ratios
# moxi/twemproxy and moxi/direct, and the errors and wrong answers (a get that did not return
# the value its thread had just set); any wrong answer makes it exit 1.
#
#   bench/spymemcached.sh                  # 3 rounds of 5 s (after 1 s of warm-up) each
#   ROUNDS=5 DURATION=10 THREADS=16 WARMUP=1 VALUE=100 bench/spymemcached.sh
#
# Everything listens on 127.0.0.1 ports chosen here and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin"
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
THREADS=${THREADS:-16}
WARMUP=${WARMUP:-1}
VALUE=${VALUE:-100}
./scripts/install-deps.sh
./scripts/install-bench-deps.sh

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
waitport() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

# Others may be editing moxi while this runs: a build that fails is retried for a minute.
for try in $(seq 6); do
	go build -o "$work/moxi" ./cmd/moxi && break
	[ "$try" -lt 6 ] || { echo "moxi does not build" >&2; exit 1; }
	sleep 10
done
# spymemcached needs no other jar: its logging and metrics libraries load only when configured.
jar=$(dpkg -L libspymemcached-java | grep '/usr/share/java/spymemcached\.jar$')
javac -d "$work/classes" -cp "$jar" bench/java/SpyLoad.java

mc=$(freeport); memcached -u nobody -l 127.0.0.1 -p "$mc" -U 0 -m 1024 -t 4 & pids+=($!)
waitport "$mc"

tw=$(freeport); twstats=$(freeport)
cat > "$work/nutcracker.yml" <<YAML
bench:
  listen: 127.0.0.1:$tw
  hash: md5
  distribution: ketama
  timeout: 2000
  servers:
   - 127.0.0.1:$mc:1
YAML
nutcracker -c "$work/nutcracker.yml" -s "$twstats" -a 127.0.0.1 -o "$work/nutcracker.log" & pids+=($!)
waitport "$tw"

# moxiconf PORT: one pool, the same memcached; no admin, no file watching.
moxiconf() {
	cat <<YAML
listen: 127.0.0.1:$1
admin: ""
watch_config: false
pools:
  main:
    servers: ["127.0.0.1:$mc"]
YAML
}
mx=$(freeport); moxiconf "$mx" > "$work/moxi.yaml"
"$work/moxi" --config "$work/moxi.yaml" --log-level warn & pids+=($!)
waitport "$mx"
mx1=$(freeport); moxiconf "$mx1" > "$work/moxi1.yaml"
GOMAXPROCS=1 "$work/moxi" --config "$work/moxi1.yaml" --log-level warn & pids+=($!)
waitport "$mx1"

declare -A port=([direct]=$mc [twemproxy]=$tw [moxi]=$mx [moxi-1thread]=$mx1)

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
median() { sort -n "$work/$1" | awk '{a[NR]=$1} END {printf "%.0f", (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }

text=(direct twemproxy moxi moxi-1thread)
binary=(direct moxi moxi-1thread)
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
		row "$proto" "${t/moxi-1thread/moxi(1proc)}" "$(median "ops_per_s.$proto.$t")" \
			"$(median "get_p50_us.$proto.$t")" "$(sum "errors.$proto.$t")" "$w"
	done
done
echo "ratios (ops/s)"
echo "  text:   moxi/twemproxy $(ratio "$(median ops_per_s.text.moxi)" "$(median ops_per_s.text.twemproxy)")" \
	" moxi/direct $(ratio "$(median ops_per_s.text.moxi)" "$(median ops_per_s.text.direct)")" \
	" moxi(1proc)/twemproxy $(ratio "$(median ops_per_s.text.moxi-1thread)" "$(median ops_per_s.text.twemproxy)")"
echo "  binary: moxi/direct $(ratio "$(median ops_per_s.binary.moxi)" "$(median ops_per_s.binary.direct)")" \
	" moxi(1proc)/direct $(ratio "$(median ops_per_s.binary.moxi-1thread)" "$(median ops_per_s.binary.direct)")"
if [ "$wrongs" -gt 0 ]; then
	echo "FAIL: $wrongs wrong answers (a get that did not return the value its thread had just set)" >&2
	exit 1
fi
