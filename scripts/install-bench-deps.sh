#!/usr/bin/env bash
# Installs what the bench scripts need beyond scripts/install-deps.sh, when missing, from
# Debian: for bench/spymemcached.sh a JDK (javac) and spymemcached (which needs nothing else
# on the classpath: its logging and metrics libraries are only Suggests, loaded when
# configured); socat, the byte relay bench/pipeline.sh and bench/spymemcached.sh measure as
# the floor of a proxy hop; HAProxy, the TCP relay every bench script measures moxi against.
set -euo pipefail
missing=()
command -v javac >/dev/null || missing+=(default-jdk-headless)
dpkg -s libspymemcached-java >/dev/null 2>&1 || missing+=(libspymemcached-java)
command -v socat >/dev/null || missing+=(socat)
command -v haproxy >/dev/null || missing+=(haproxy)
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing ${missing[*]}"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
