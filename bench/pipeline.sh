#!/usr/bin/env bash
# Latency of a pipeline of 100 requests on one connection: from the first byte written (all
# 100 requests in one write) to the last answer read, against memcached direct, through
# twemproxy (nutcracker) and through moxi (and moxi with GOMAXPROCS=1), all in front of the
# same memcached. Cases: 100 text sets, 100 text single-key gets, 100 binary setq and a noop
# (twemproxy has no binary protocol). Each round runs every case against every target in
# turn, REPS timed repetitions each (bench/pipeline measures); prints the median µs over all
# rounds and the ratios moxi/twemproxy (text) and moxi/direct.
#
#   bench/pipeline.sh                     # 3 rounds of 200 repetitions
#   ROUNDS=5 REPS=500 N=100 bench/pipeline.sh
#
# Everything listens on 127.0.0.1 ports chosen here and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin"
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-200}
N=${N:-100}
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

# Others may be editing moxi while this runs: a build that fails is retried for a minute.
for try in $(seq 6); do
	go build -o "$work/moxi" ./cmd/moxi && break
	[ "$try" -lt 6 ] || { echo "moxi does not build" >&2; exit 1; }
	sleep 10
done
go build -o "$work/pipeline" ./bench/pipeline

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

# moxi.yaml PORT: one pool, the same memcached; no admin, no file watching.
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

targets=(direct twemproxy moxi moxi-1thread)
declare -A port=([direct]=$mc [twemproxy]=$tw [moxi]=$mx [moxi-1thread]=$mx1)
cases=(set get binary)
declare -A title=([set]="text: $N set" [get]="text: $N get" [binary]="binary: $N setq + noop")

# run CASE TARGET: one bench/pipeline run; its samples go to $work/CASE.TARGET.
run() {
	local med
	med=$("$work/pipeline" -addr "127.0.0.1:${port[$2]}" -case "$1" -n "$N" -reps "$REPS" -samples "$work/$1.$2") ||
		{ echo "bench/pipeline $1 against $2 failed" >&2; exit 1; }
	printf '  %-24s %-13s %9s µs\n' "${title[$1]}" "$2" "$med"
}

median() { sort -n "$work/$1" | awk '{a[NR]=$1} END {printf "%.1f", (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }
verdict() { awk -v r="$1" -v max="$2" 'BEGIN {print (r <= max) ? "met" : "missed"}'; }

echo "pipelines of $N requests on one connection, median µs of $REPS repetitions, $ROUNDS interleaved rounds; $(nproc) cores"
for r in $(seq "$ROUNDS"); do
	echo "round $r"
	for c in "${cases[@]}"; do
		for t in "${targets[@]}"; do
			[ "$c" = binary ] && [ "$t" = twemproxy ] && continue
			run "$c" "$t"
		done
	done
done

echo
echo "median µs over $((ROUNDS * REPS)) pipelines per cell (lower is better); moxi(1proc): GOMAXPROCS=1"
row() { printf '  %-24s %9s %9s %9s %11s %14s %11s\n' "$@"; }
row case direct twemproxy moxi "moxi(1proc)" moxi/twemproxy moxi/direct
goals=()
for c in "${cases[@]}"; do
	d=$(median "$c.direct"); m=$(median "$c.moxi"); m1=$(median "$c.moxi-1thread"); md=$(ratio "$m" "$d")
	if [ "$c" = binary ]; then
		t=-; mt=-
		goals+=("${title[$c]}: moxi/direct $md <= 2 $(verdict "$md" 2)")
	else
		t=$(median "$c.twemproxy"); mt=$(ratio "$m" "$t")
		goals+=("${title[$c]}: moxi/twemproxy $mt <= 1.2 $(verdict "$mt" 1.2)")
	fi
	row "${title[$c]}" "$d" "$t" "$m" "$m1" "$mt" "$md"
done
echo "targets:"
printf '  %s\n' "${goals[@]}"
