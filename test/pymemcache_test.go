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

// runPymemcache runs pymemcache's integration suite against addr — only the tests ids, when
// given — and returns each test's outcome (PASSED, FAILED, ERROR), by test id.
func runPymemcache(t *testing.T, addr string, ids ...string) map[string]string {
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
	// The paths come first: pytest finds the suite's conftest.py, which adds --server and
	// --port, from them.
	args := []string{"-m", "pytest"}
	if len(ids) == 0 {
		args = append(args, pymemcacheTests, "-k", "not tls")
	}
	for _, id := range ids {
		args = append(args, pymemcacheTests+"::"+id)
	}
	args = append(args, "--server", host, "--port", port, "-q", "-rA", "-p", "no:cacheprovider")
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", args...)
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
	if (len(ids) == 0 && len(outcomes) < 40) || (len(ids) > 0 && len(outcomes) != len(ids)) {
		t.Fatalf("pymemcache's suite against %s ran %d tests:\n%s", addr, len(outcomes), out)
	}
	return outcomes
}

// TestPymemcache runs pymemcache's integration suite (its Client, PooledClient and
// HashClient) against memcached, then through moxi in front of a plain pool, a pool with
// replicas: 2 and a pool of three zones, and wants the same outcome for every test: all passed. A test that fails
// through moxi runs once more, alone: test_touch sets a key with a TTL of 1 s and touches
// it, and memcached's clock moves in whole seconds, so on a loaded machine the key can
// expire between the two (seen once, in a CI run beside another).
func TestPymemcache(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	mcs := cluster(t, 3)
	want := runPymemcache(t, mcs[0].Addr)
	for id, outcome := range want {
		if outcome != "PASSED" {
			t.Errorf("memcached: %s %s", id, outcome)
		}
	}
	as := addrs(mcs)
	for name, cfg := range map[string]string{
		"plain pool":      poolConfig("", as...),
		"replicated pool": poolConfig("    replicas: 2\n", as...),
		"zoned pool":      zonesConfig("b", "    timeout: 2s\n", []string{as[0]}, []string{as[1]}, []string{as[2]}),
	} {
		t.Run(name, func(t *testing.T) {
			moxi := startMoxi(t, "--config", writeConfig(t, cfg))
			got := runPymemcache(t, moxi.addr)
			var again []string
			for _, id := range slices.Sorted(maps.Keys(want)) {
				if got[id] != want[id] {
					again = append(again, id)
				}
			}
			if len(again) > 0 {
				t.Logf("run again, alone: %v", again)
				maps.Copy(got, runPymemcache(t, moxi.addr, again...))
			}
			for _, id := range slices.Sorted(maps.Keys(want)) {
				if got[id] != want[id] {
					t.Errorf("%s: %s through moxi, %s on memcached", id, got[id], want[id])
				}
			}
		})
	}
}
