#!/usr/bin/env bash
# Installs what moxi's tests and benchmarks run against, when missing: memcached,
# libmemcached-tools (memccapable, memcaslap), nutcracker (twemproxy) and promtool (from the
# prometheus package: the deploy test checks and unit-tests deploy/prometheus/alerts.yaml), from Debian.
set -euo pipefail
missing=()
command -v memcached >/dev/null || missing+=(memcached)
{ command -v memccapable >/dev/null && command -v memcaslap >/dev/null; } || missing+=(libmemcached-tools)
command -v nutcracker >/dev/null || [ -x /usr/sbin/nutcracker ] || missing+=(nutcracker)
command -v promtool >/dev/null || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing ${missing[*]}"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
