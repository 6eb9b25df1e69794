#!/usr/bin/env bash
# Installs what bench/spymemcached.sh needs beyond scripts/install-deps.sh, when missing: a
# JDK (javac) and spymemcached, from Debian. spymemcached needs nothing else on the
# classpath: its logging and metrics libraries are only Suggests, loaded when configured.
set -euo pipefail
missing=()
command -v javac >/dev/null || missing+=(default-jdk-headless)
dpkg -s libspymemcached-java >/dev/null 2>&1 || missing+=(libspymemcached-java)
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing ${missing[*]}"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
