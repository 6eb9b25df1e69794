#!/usr/bin/env bash
# Throughput of memcached direct, through twemproxy (nutcracker) and through moxi, measured
# with memcaslap in the same run, interleaved round by round so that machine noise hits all
# three alike. Prints the median TPS of each and the ratios moxi/twemproxy and moxi/direct.
#
#   bench/compare.sh                 # 3 rounds of 10 s each, ascii then binary
#   ROUNDS=5 DURATION=20s bench/compare.sh
#   PROFILE=bench/moxi.cpu bench/compare.sh   # also a CPU profile of moxi during one ascii run
#
# Everything listens on 127.0.0.1 ports chosen here and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin"
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-32}
VALUE=${VALUE:-100}
./scripts/install-deps.sh

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

go build -o "$work/moxi" ./cmd/moxi

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

mx=$(freeport); admin=$(freeport)
cat > "$work/moxi.yaml" <<YAML
listen: 127.0.0.1:$mx
admin: 127.0.0.1:$admin
pools:
  bench:
    servers: [127.0.0.1:$mc]
YAML
"$work/moxi" --config "$work/moxi.yaml" --log-level warn ${PROFILE:+--pprof} & pids+=($!)
waitport "$mx"

# The same moxi limited to one OS thread (GOMAXPROCS=1), as twemproxy is: on a small host
# shared with the load generator and memcached it avoids cross-thread wake-ups.
mx1=$(freeport)
sed "s/^listen: .*/listen: 127.0.0.1:$mx1/; /^admin:/d" "$work/moxi.yaml" > "$work/moxi1.yaml"
GOMAXPROCS=1 "$work/moxi" --config "$work/moxi1.yaml" --admin "" --log-level warn & pids+=($!)
waitport "$mx1"

# run NAME PORT [memcaslap flags...]: one memcaslap run, TPS appended to $work/NAME.
run() {
	local name=$1 port=$2; shift 2
	local out
	out=$(memcaslap -s "127.0.0.1:$port" -T 1 -c "$CONCURRENCY" -t "$DURATION" -X "$VALUE" "$@" 2>&1)
	local tps
	tps=$(echo "$out" | sed -n 's/.*TPS: \([0-9]*\).*/\1/p' | tail -1)
	[ -n "$tps" ] || { echo "memcaslap against $name printed no TPS:" >&2; echo "$out" >&2; exit 1; }
	echo "$tps" >> "$work/tps.$name"
	printf '  %-16s %8s ops/s\n' "$name" "$tps"
}

median() { sort -n "$work/tps.$1" | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }

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
	run moxi-1thread "$mx1"
done
for r in $(seq "$ROUNDS"); do
	echo "round $r (binary)"
	run direct-binary "$mc" -B
	run moxi-binary "$mx" -B
	run moxi-1thread-bin "$mx1" -B
done

d=$(median direct); t=$(median twemproxy); m=$(median moxi); m1=$(median moxi-1thread)
db=$(median direct-binary); mb=$(median moxi-binary); mb1=$(median moxi-1thread-bin)
echo
echo "median ops/s   ascii: direct $d  twemproxy $t  moxi $m  moxi(GOMAXPROCS=1) $m1"
echo "               binary: direct $db  moxi $mb  moxi(GOMAXPROCS=1) $mb1"
echo "ratios         ascii: moxi/twemproxy $(ratio "$m" "$t")  moxi/direct $(ratio "$m" "$d")  twemproxy/direct $(ratio "$t" "$d")"
echo "                      moxi(GOMAXPROCS=1)/twemproxy $(ratio "$m1" "$t")  moxi(GOMAXPROCS=1)/direct $(ratio "$m1" "$d")"
echo "               binary: moxi/direct $(ratio "$mb" "$db")  moxi(GOMAXPROCS=1)/direct $(ratio "$mb1" "$db")"
[ -z "${PROFILE:-}" ] || echo "moxi CPU profile: $PROFILE (go tool pprof -top $PROFILE)"
