package test

import (
	"context"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// pymemcacheTests is the integration suite of Debian's python3-pymemcache (3.5.2), which
// scripts/install-deps.sh installs with pytest for the system's python3; its TLS test
// needs a TLS server and is left out.
const pymemcacheTests = "/usr/lib/python3/dist-packages/pymemcache/test/test_integration.py"

// runPymemcache runs pymemcache's integration suite against addr and returns each test's
// outcome (PASSED, FAILED, ERROR), by test id.
func runPymemcache(t *testing.T, addr string) map[string]string {
	t.Helper()
	if _, err := os.Stat(pymemcacheTests); err != nil {
		t.Fatalf("pymemcache's tests: %v: run `make deps` (or `make test`, which installs python3-pymemcache)", err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", "-m", "pytest", pymemcacheTests, "--server", host, "--port", port,
		"-q", "-rA", "-p", "no:cacheprovider", "-k", "not tls")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, _ := cmd.CombinedOutput() // failing tests exit 1: the outcomes say which
	outcomes := make(map[string]string)
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "PASSED" || f[0] == "FAILED" || f[0] == "ERROR") {
			_, id, _ := strings.Cut(f[1], "::")
			outcomes[id] = f[0]
		}
	}
	if len(outcomes) < 40 {
		t.Fatalf("pymemcache's suite against %s ran %d tests:\n%s", addr, len(outcomes), out)
	}
	return outcomes
}

// TestPymemcache runs pymemcache's integration suite (its Client, PooledClient and
// HashClient) against memcached, then through moxi in front of a plain pool and a pool with
// replicas: 2, and wants the same outcome for every test: all passed.
func TestPymemcache(t *testing.T) {
	mcs := cluster(t, 3)
	want := runPymemcache(t, mcs[0].Addr)
	for id, outcome := range want {
		if outcome != "PASSED" {
			t.Errorf("memcached: %s %s", id, outcome)
		}
	}
	for name, settings := range map[string]string{"plain pool": "", "replicated pool": "    replicas: 2\n"} {
		t.Run(name, func(t *testing.T) {
			moxi := startMoxi(t, "--config", writeConfig(t, poolConfig(settings, addrs(mcs)...)))
			got := runPymemcache(t, moxi.addr)
			for _, id := range slices.Sorted(maps.Keys(want)) {
				if got[id] != want[id] {
					t.Errorf("%s: %s through moxi, %s on memcached", id, got[id], want[id])
				}
			}
		})
	}
}
