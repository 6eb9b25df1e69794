#!/usr/bin/env bash
# What hot_keys costs: the CPU moxi spends per request, and its throughput, with the hot_keys
# section off (absent), on with its defaults (`hot_keys: {}`: sample 0.01, window 10s,
# min_share 0.01, cache false) and on with `cache: true`. Three moxi in front of one memcached,
# differing only in that section, take memcaslap's load in turn, interleaved round by round
# (the order rotated each round, binary in the reverse of ascii's) so that machine noise hits
# them alike. CPU per request is the moxi's user + system time (/proc/PID/stat) over the
# run's requests. Prints per moxi the median ops/s and CPU µs/request with their min–max over
# the rounds; the on/off ratios of both (the median of the per-round ratios, min–max); the
# noise, the spread of off's own CPU/request across the rounds; and the verdict,
# "CPU per request with hot_keys on ÷ off: X (min–max)", within noise or not.
# memcaslap's keys are spread evenly, so no key reaches min_share (GET /hotkeys stays empty,
# moxi_hotcache_hits_total 0): on+cache measures what cache: true adds to every request with
# no key hot, not hits served from the hot cache.
#
#   bench/hotkeys.sh                          # 5 rounds of 10 s each, ascii and binary
#   ROUNDS=3 DURATION=5s bench/hotkeys.sh
#   CONCURRENCY=64 VALUE=1000 bench/hotkeys.sh  # memcaslap -c and -X (default 32 and 100)
#   WARMUP=0s bench/hotkeys.sh                # no unmeasured warm-up run (default 2s each)
#
# Everything listens on 127.0.0.1 ports chosen here and is stopped on exit.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-32}
VALUE=${VALUE:-100}
WARMUP=${WARMUP:-2s}
setup # scripts/install-deps.sh installs memcached and memcaslap: nothing more is needed
build_moxi
mc=$(freeport); start_memcached "$mc"

# The variants, in the order of round 1, and the hot_keys line of each one's config.
names=(off on on+cache)
declare -A hotkeys=([off]="" [on]="hot_keys: {}" [on+cache]="hot_keys: {cache: true}")
declare -A portof pidof

# start_variant NAME: $work/moxi on a free port with lib.sh's start_moxi config (one pool,
# no admin, no file watching) plus NAME's hot_keys line; start_moxi takes only flags.
start_variant() {
	local name=$1 port
	port=$(freeport)
	cat > "$work/moxi.$port.yaml" <<YAML
listen: 127.0.0.1:$port
admin: ""
watch_config: false
pools:
  main:
    servers: ["127.0.0.1:$mc"]
${hotkeys[$name]}
YAML
	spawn "$work/moxi" --config "$work/moxi.$port.yaml" --log-level warn
	pidof[$name]=${pids[-1]}
	portof[$name]=$port
	waitport "$port"
}
for n in "${names[@]}"; do start_variant "$n"; done
hz=$(getconf CLK_TCK)

# run PROTO NAME [memcaslap flags...]: one memcaslap run against NAME's moxi; its TPS
# appended to $work/tps.PROTO.NAME and its CPU µs per request to $work/cpu.PROTO.NAME.
run() {
	local proto=$1 name=$2; shift 2
	local out pid=${pidof[$name]} before tps cpu
	before=$(cputicks "$pid")
	out=$(memcaslap -s "127.0.0.1:${portof[$name]}" -T 1 -c "$CONCURRENCY" -t "$DURATION" -X "$VALUE" "$@" 2>&1)
	tps=$(echo "$out" | sed -n 's/.*TPS: \([0-9]*\).*/\1/p' | tail -1)
	[ -n "$tps" ] || { echo "memcaslap against $name ($proto) printed no TPS:" >&2; echo "$out" >&2; exit 1; }
	cpu=$(awk -v t="$(( $(cputicks "$pid") - before ))" -v hz="$hz" -v tps="$tps" -v d="${DURATION%s}" \
		'BEGIN {printf "%.2f", t / hz * 1e6 / (tps * d)}')
	echo "$tps" >> "$work/tps.$proto.$name"
	echo "$cpu" >> "$work/cpu.$proto.$name"
	printf '  %-8s %-9s %8s ops/s  %6s µs CPU/request\n' "$proto" "$name" "$tps" "$cpu"
}

# minmax FILE [FORMAT]: the least and greatest numbers in $work/FILE, as "MIN–MAX".
minmax() { sort -n "$work/$1" | awk -v f="${2:-%s}" 'NR == 1 {lo = $1} {hi = $1} END {printf f "–" f, lo, hi}'; }

# ratios KIND PROTO NAME: the per-round ratios of NAME's KIND (tps or cpu) to off's, one a
# line, into $work/ratio.KIND.PROTO.NAME.
ratios() { paste "$work/$1.$2.$3" "$work/$1.$2.off" | awk '{printf "%.4f\n", $1 / $2}' > "$work/ratio.$1.$2.$3"; }

echo "memcaslap -T 1 -c $CONCURRENCY -t $DURATION -X $VALUE, $ROUNDS interleaved rounds; $(nproc) cores"
echo "moxi: off (no hot_keys), on (hot_keys: {}), on+cache (hot_keys: {cache: true}); one memcached"
if [ "${WARMUP%s}" != 0 ]; then
	echo "warm-up, not measured: $WARMUP through each moxi"
	for n in "${names[@]}"; do
		memcaslap -s "127.0.0.1:${portof[$n]}" -T 1 -c "$CONCURRENCY" -t "$WARMUP" -X "$VALUE" >/dev/null 2>&1
	done
fi
for r in $(seq "$ROUNDS"); do
	# Round r starts at the variant r-1 places along (round-robin); binary runs in the reverse
	# of ascii's order, so that no variant is always first or always follows the same one.
	order=()
	for i in "${!names[@]}"; do order+=("${names[(i + r - 1) % ${#names[@]}]}"); done
	echo "round $r: ${order[*]} (ascii), then the reverse (binary)"
	for n in "${order[@]}"; do run ascii "$n"; done
	for ((i = ${#order[@]} - 1; i >= 0; i--)); do run binary "${order[i]}" -B; done
done

echo
for proto in ascii binary; do
	echo "$proto: median over $ROUNDS rounds (min–max)"
	for n in "${names[@]}"; do
		printf '  %-9s %8s ops/s (%s)  %6s µs CPU/request (%s)\n' "$n" \
			"$(median "tps.$proto.$n" %.0f)" "$(minmax "tps.$proto.$n")" \
			"$(median "cpu.$proto.$n" %.2f)" "$(minmax "cpu.$proto.$n" %.2f)"
	done
	for n in on on+cache; do
		ratios cpu "$proto" "$n"; ratios tps "$proto" "$n"
		printf '  %s/off: CPU per request %s (%s)  throughput %s (%s)  [per-round ratios: median (min–max)]\n' "$n" \
			"$(median "ratio.cpu.$proto.$n" %.3f)" "$(minmax "ratio.cpu.$proto.$n" %.3f)" \
			"$(median "ratio.tps.$proto.$n" %.3f)" "$(minmax "ratio.tps.$proto.$n" %.3f)"
	done
	# The noise: how far off's own CPU/request moved across the rounds, as a share of its median.
	noise=$(sort -n "$work/cpu.$proto.off" | awk '{a[NR] = $1} END {m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.3f", (a[NR] - a[1]) / m}')
	echo "  noise: off's own CPU/request across the rounds $(minmax "cpu.$proto.off" %.2f) µs, a spread of $(awk -v n="$noise" 'BEGIN {printf "%.1f", n * 100}')% of its median"
	for n in on on+cache; do
		x=$(median "ratio.cpu.$proto.$n" %.3f)
		within=$(awk -v x="$x" -v n="$noise" 'BEGIN {d = x - 1; if (d < 0) d = -d; print (d <= n) ? "within noise of off" : "outside the noise of off"}')
		label="hot_keys on"; [ "$n" = on ] || label="hot_keys on with cache"
		echo "  CPU per request with $label ÷ off: $x ($(minmax "ratio.cpu.$proto.$n" %.3f)) [$proto, interleaved]: $within"
	done
	echo
done
