#!/usr/bin/env bash
# Installs what moxi's tests and benchmarks run against, when missing: memcached,
# libmemcached-tools (memccapable, memcaslap), nutcracker (twemproxy), promtool (from the
# prometheus package: the deploy test checks and unit-tests deploy/prometheus/alerts.yaml),
# pymemcache with pytest (its integration suite) and spymemcached with a JDK (the Java client
# test/authclients_test.go compiles and runs), from Debian;
# and kustomize, which the deploy test renders deploy/kubernetes with.
set -euo pipefail
missing=()
command -v memcached >/dev/null || missing+=(memcached)
{ command -v memccapable >/dev/null && command -v memcaslap >/dev/null; } || missing+=(libmemcached-tools)
command -v nutcracker >/dev/null || [ -x /usr/sbin/nutcracker ] || missing+=(nutcracker)
command -v promtool >/dev/null || missing+=(prometheus)
# pymemcache's integration suite (test/pymemcache_test.go) runs under the system's python3.
/usr/bin/python3 -c 'import pymemcache, pytest' 2>/dev/null || missing+=(python3-pymemcache python3-pytest)
# spymemcached (test/authclients_test.go compiles test/testdata/spyauth/SpyAuth.java against
# the jar, which needs no other); the machine's image has a JDK, installed here when missing.
{ command -v java >/dev/null && command -v javac >/dev/null; } || missing+=(default-jdk-headless)
[ -f /usr/share/java/spymemcached.jar ] || missing+=(libspymemcached-java)
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing ${missing[*]}"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Debian has no kustomize package, so it is built from its Go module (about 30s on a new
# machine) into Go's bin directory, where test/deploy_kubernetes_test.go looks when it is not
# on PATH. Not a dependency in go.mod: only the tests run it. v5.8.2 is the newest that builds
# with the Go in go.mod (1.26); v5.8.3 wants 1.27.
kustomize_version=v5.8.2
PATH=$PATH:/usr/local/go/bin
gobin=$(go env GOBIN)
gobin=${gobin:-$(go env GOPATH | cut -d: -f1)/bin}
if ! command -v kustomize >/dev/null && [ ! -x "$gobin/kustomize" ]; then
	echo "installing kustomize $kustomize_version into $gobin"
	GOBIN=$gobin go install "sigs.k8s.io/kustomize/kustomize/v5@$kustomize_version"
fi
