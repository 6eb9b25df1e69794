#!/usr/bin/env bash
# `make demo`: starts three memcached on 127.0.0.1:11401-11403 and moxi in front of them on
# 127.0.0.1:11400 (configs/demo.yaml), says what to try, and stops everything on Ctrl-C.
# Needs memcached (`make deps` installs it) and bin/moxi (`make demo` builds it).
set -euo pipefail
cd "$(dirname "$0")/.."

config=configs/demo.yaml
listen=127.0.0.1:11400
admin=127.0.0.1:9400
ports=(11401 11402 11403)

command -v memcached >/dev/null || { echo "demo: memcached is not installed; run 'make deps' first" >&2; exit 1; }
[ -x bin/moxi ] || { echo "demo: bin/moxi is missing; run 'make demo' (it builds moxi)" >&2; exit 1; }

# in_use reports whether something accepts connections on 127.0.0.1:$1.
in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

for port in "${ports[@]}" "${listen##*:}" "${admin##*:}"; do
	if in_use "$port"; then
		echo "demo: 127.0.0.1:$port is taken (a demo still running?); stop it and try again" >&2
		exit 1
	fi
done

dir=$(mktemp -d)
pids=()
stop() {
	trap - INT TERM EXIT
	echo
	echo "demo: stopping moxi and the memcached"
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap stop EXIT
trap 'exit 0' INT TERM # and EXIT stops everything

user=()
[ "$(id -u)" -ne 0 ] || user=(-u nobody) # memcached refuses to run as root
for port in "${ports[@]}"; do
	memcached "${user[@]}" -l 127.0.0.1 -p "$port" -U 0 -m 64 &
	pids+=($!)
done
bin/moxi --config "$config" --log-level warn 2>"$dir/moxi.log" &
moxi=$!
pids+=("$moxi")

for _ in $(seq 50); do
	in_use "${listen##*:}" && break
	kill -0 "$moxi" 2>/dev/null || { cat "$dir/moxi.log" >&2; exit 1; }
	sleep 0.1
done
in_use "${listen##*:}" || { echo "demo: moxi did not start listening:" >&2; cat "$dir/moxi.log" >&2; exit 1; }

cat <<EOF

moxi is serving on $listen, in front of memcached on 127.0.0.1:${ports[0]}, :${ports[1]} and :${ports[2]}
(config: $config; moxi's log: $dir/moxi.log). In another terminal, try:

  export MEMCACHED_SERVERS=$listen   # the libmemcached tools talk to moxi
  memccp README.md Makefile go.mod    # three keys, named after the files
  memccat Makefile | head -3          # read one back through moxi
  memcstat | head                     # moxi's own counters, in memcached's form

  # which memcached holds each key: ask each one directly
  for p in ${ports[*]}; do for k in README.md Makefile go.mod; do
    memccat --servers=127.0.0.1:\$p \$k >/dev/null 2>&1 && echo "\$k is on :\$p"; done; done

  curl -s $admin/servers              # moxi's view of the servers, up or dead
  curl -s $admin/metrics | grep '^moxi_backend_requests_total'

  # failover: stop one memcached and read again; its keys move to the next server
  kill ${pids[0]}; memccat go.mod Makefile README.md >/dev/null; curl -s $admin/servers

Or with any memcached client: telnet 127.0.0.1 ${listen##*:}, then "set a 0 0 1", "1", "get a".
Ctrl-C stops moxi and the three memcached.
EOF

# Until Ctrl-C (which reaches moxi too: it exits 0), or until moxi fails.
code=0
wait "$moxi" || code=$?
if [ "$code" -ne 0 ]; then
	echo "demo: moxi exited with status $code:" >&2
	cat "$dir/moxi.log" >&2
	exit 1
fi
