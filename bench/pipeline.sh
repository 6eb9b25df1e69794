#!/usr/bin/env bash
# Latency of a pipeline of 100 requests on one connection: from the first byte written (all
# 100 requests in one write) to the last answer read, against memcached direct, through
# twemproxy (nutcracker) and through moxi (and moxi with GOMAXPROCS=1), all in front of the
# same memcached, and through two byte relays, the floor of a proxy hop: HAProxy in TCP mode
# with 2 threads, and socat (bench/lib.sh start_relay); and through bench/floor with 1 and 2 event
# loops, a Go forwarder that frames requests and answers and does nothing else, the floor of a
# proxy hop that must know where one request ends, and with -codecs (2 loops), which also
# decodes and encodes each request and answer with moxi's codecs, the floor of moxi's
# own request path; and with -goroutines -codecs, the same work on goroutines parked in Go's
# netpoller as moxi's are instead of event loops, the floor of that path built on goroutines. Cases: 100 text sets, 100 text single-key gets, 100 binary setq and a noop,
# 100 meta sets (ms), 100 meta gets (mg) (twemproxy has neither binary nor meta protocol). Each round runs every case against every target in
# turn, REPS timed repetitions each, one repetition per target in turn (bench/pipeline
# measures), so that the machine's drift weighs on every target alike; prints the median µs over all
# rounds and the ratios moxi/twemproxy (text), moxi/direct and relay/direct.
#
#   bench/pipeline.sh                     # 3 rounds of 200 repetitions
#   ROUNDS=5 REPS=500 N=100 bench/pipeline.sh
#   MOXI_BASE=b200225 bench/pipeline.sh      # also moxi built at that commit, in the same rounds
#
# Everything listens on 127.0.0.1 ports chosen here and is stopped on exit.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-200}
N=${N:-100}
setup ./scripts/install-bench-deps.sh
build_moxi
build_base
go build -o "$work/pipeline" ./bench/pipeline
start_targets
rl=$(freeport); start_relay "$rl" "$mc"
go build -o "$work/floor" ./bench/floor
fl1=$(freeport); spawn "$work/floor" -listen "127.0.0.1:$fl1" -backend "127.0.0.1:$mc" -loops 1
fl2=$(freeport); spawn "$work/floor" -listen "127.0.0.1:$fl2" -backend "127.0.0.1:$mc" -loops 2
flc=$(freeport); spawn "$work/floor" -listen "127.0.0.1:$flc" -backend "127.0.0.1:$mc" -loops 2 -codecs
flg=$(freeport); spawn "$work/floor" -listen "127.0.0.1:$flg" -backend "127.0.0.1:$mc" -goroutines -codecs
waitport "$fl1"; waitport "$fl2"; waitport "$flc"; waitport "$flg"

targets=(direct twemproxy moxi moxi-1thread haproxy relay floor-1loop floor-2loops floor-codecs floor-goroutines)
declare -A port=([direct]=$mc [twemproxy]=$tw [moxi]=$mx [moxi-1thread]=$mx1 [haproxy]=$hp2 [relay]=$rl
	[floor-1loop]=$fl1 [floor-2loops]=$fl2 [floor-codecs]=$flc [floor-goroutines]=$flg)
if [ -n "$mxb" ]; then # MOXI_BASE: moxi at that commit, in the same rounds
	targets+=(moxi-base)
	port[moxi-base]=$mxb
fi
cases=(set get binary ms mg)
declare -A title=([set]="text: $N set" [get]="text: $N get" [binary]="binary: $N setq + noop" [ms]="meta: $N ms" [mg]="meta: $N mg")
# text cases are compared with twemproxy; binary and meta, which it does not speak, with memcached
textcase() { [ "$1" = set ] || [ "$1" = get ]; }

# run CASE: one bench/pipeline run against every target of CASE, repetitions alternating
# between them; each target's samples go to $work/CASE.TARGET.
run() {
	local ts=() addrs=() files=() meds i
	for t in "${targets[@]}"; do
		! textcase "$1" && [ "$t" = twemproxy ] && continue
		ts+=("$t"); addrs+=("127.0.0.1:${port[$t]}"); files+=("$work/$1.$t")
	done
	meds=$("$work/pipeline" -addr "$(IFS=,; echo "${addrs[*]}")" -case "$1" -n "$N" -reps "$REPS" \
		-samples "$(IFS=,; echo "${files[*]}")") || { echo "bench/pipeline $1 failed" >&2; exit 1; }
	read -ra meds <<<"$meds"
	for i in "${!ts[@]}"; do
		printf '  %-24s %-13s %9s µs\n' "${title[$1]}" "${ts[$i]}" "${meds[$i]}"
	done
}

verdict() { awk -v r="$1" -v max="$2" 'BEGIN {print (r <= max) ? "met" : "missed"}'; }

echo "pipelines of $N requests on one connection, median µs of $REPS repetitions, $ROUNDS interleaved rounds; $(nproc) cores"
for r in $(seq "$ROUNDS"); do
	echo "round $r"
	for c in "${cases[@]}"; do
		run "$c"
	done
done

echo
echo "median µs over $((ROUNDS * REPS)) pipelines per cell (lower is better); moxi(1proc): GOMAXPROCS=1"
row() { printf '  %-24s %9s %9s %9s %11s %9s %9s %9s %9s %9s %11s %14s %11s %13s %12s %14s %14s %13s %17s\n' "$@"; }
row case direct twemproxy moxi "moxi(1proc)" haproxy relay floor1 floor2 codecs goroutines moxi/twemproxy moxi/direct moxi/haproxy relay/direct floor2/haproxy codecs/haproxy moxi/codecs goroutines/haproxy
goals=()
for c in "${cases[@]}"; do
	d=$(median "$c.direct" %.1f); m=$(median "$c.moxi" %.1f); m1=$(median "$c.moxi-1thread" %.1f); md=$(ratio "$m" "$d")
	rd=$(median "$c.relay" %.1f); hp=$(median "$c.haproxy" %.1f); mh=$(ratio "$m" "$hp")
	t=-; mt=-
	if textcase "$c"; then
		t=$(median "$c.twemproxy" %.1f); mt=$(ratio "$m" "$t")
	fi
	# moxi against the byte relay a proxy hop costs at least: text gets, which moxi batches
	# into one server request, at most 0.6 of its time; every other case at most 1.1 of it.
	goal=1.1
	[ "$c" = get ] && goal=0.6
	goals+=("${title[$c]}: moxi/haproxy $mh <= $goal $(verdict "$mh" "$goal")")
	f1=$(median "$c.floor-1loop" %.1f); f2=$(median "$c.floor-2loops" %.1f); fc=$(median "$c.floor-codecs" %.1f)
	fg=$(median "$c.floor-goroutines" %.1f)
	row "${title[$c]}" "$d" "$t" "$m" "$m1" "$hp" "$rd" "$f1" "$f2" "$fc" "$fg" "$mt" "$md" "$mh" "$(ratio "$rd" "$d")" "$(ratio "$f2" "$hp")" \
		"$(ratio "$fc" "$hp")" "$(ratio "$m" "$fc")" "$(ratio "$fg" "$hp")"
done
echo "targets:"
printf '  %s\n' "${goals[@]}"
if [ -n "$mxb" ]; then
	echo "moxi at $MOXI_BASE (moxi-base) beside this moxi, median µs and / haproxy:"
	for c in "${cases[@]}"; do
		m=$(median "$c.moxi" %.1f); b=$(median "$c.moxi-base" %.1f); hp=$(median "$c.haproxy" %.1f)
		printf '  %-24s moxi %9s (%s)  moxi-base %9s (%s)\n' "${title[$c]}" "$m" "$(ratio "$m" "$hp")" "$b" "$(ratio "$b" "$hp")"
	done
fi
