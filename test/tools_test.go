package test

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestLibmemcachedTools runs libmemcached's everyday tools against moxi, embedded and in
// front of three memcached, and against builds stamped with build strings that are not a
// release number: the tools parse "version" as major.minor.patch numbers, and an answer
// starting with a name, or with a number made of a build string ("0.0.0 moxi/dev"), made
// them exit 1 ("strtol() failed to parse major version").
func TestLibmemcachedTools(t *testing.T) {
	t.Parallel() // child tools' exit codes and output, nothing timed: beside the waiting checks
	memcstat := requireBinary(t, "memcstat")
	memcping := requireBinary(t, "memcping")
	servers := cluster(t, 3)
	type target struct {
		name string
		bin  string // "" is the suite's moxi
		args []string
	}
	targets := []target{
		{"embedded", "", nil},
		{"three servers", "", []string{"--config", writeConfig(t, poolConfig("", addrs(servers)...))}},
	}
	for _, build := range []string{"", "dev", "main", "a1b2c3d"} {
		bin := filepath.Join(t.TempDir(), "moxi")
		out, err := exec.Command("go", "build", "-ldflags", "-X main.version="+build, "-o", bin, "../cmd/moxi").CombinedOutput()
		if err != nil {
			t.Fatalf("go build -X main.version=%s: %v\n%s", build, err, out)
		}
		targets = append(targets, target{name: fmt.Sprintf("build %q", build), bin: bin})
	}
	for _, tc := range targets {
		t.Run(tc.name, func(t *testing.T) {
			var moxi *process
			if tc.bin == "" {
				moxi = startMoxi(t, tc.args...)
			} else {
				moxi = startMoxiBin(t, tc.bin, tc.args...)
			}
			servers := "--servers=" + moxi.addr
			run := func(bin string, args ...string) string {
				t.Helper()
				out, err := exec.Command(bin, append(args, servers)...).CombinedOutput()
				if err != nil {
					t.Errorf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
				}
				return string(out)
			}
			for _, args := range [][]string{nil, {"--binary"}} {
				out := run(memcstat, args...)
				if !regexp.MustCompile(`(?m)^\s+version: [1-9]\d*\.\d+\.\d+`).MatchString(out) ||
					!regexp.MustCompile(`(?m)^\s+curr_connections: \d+$`).MatchString(out) {
					t.Errorf("memcstat %v: no version or curr_connections line:\n%s", args, out)
				}
			}
			// libmemcached prints the version it parsed: 255.255.255 when it could not.
			out := run(memcstat, "--server-version")
			if !regexp.MustCompile(`^`+regexp.QuoteMeta(moxi.addr)+` \d+\.\d+\.\d+\n$`).MatchString(out) ||
				strings.Contains(out, "255.255.255") {
				t.Errorf("memcstat --server-version: %q", out)
			}
			run(memcping)
		})
	}
}

// TestStatsSettings: "stats settings" answers the running config, to END, as pymemcache's
// stats("settings") and monitoring agents expect.
func TestStatsSettings(t *testing.T) {
	moxi := startMoxi(t)
	c, err := net.Dial("tcp", moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	lines := roundTrip(t, c, r, "stats settings\r\n", "END")
	for _, want := range []string{"STAT listen " + moxi.addr, "STAT item_size_max 1048576", "STAT pools.main.embedded 2"} {
		if !slices.Contains(lines, want) {
			t.Errorf("stats settings: no %q in\n%s", want, strings.Join(lines, "\n"))
		}
	}
}

// TestCacheMemlimit: cache_memlimit reaches every server (pymemcache's cache_memlimit, and
// memcached's t/dyn-maxbytes.t, expect OK), embedded shards included.
func TestCacheMemlimit(t *testing.T) {
	servers := cluster(t, 3)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"three servers", []string{"--config", writeConfig(t, poolConfig("", addrs(servers)...))}},
		{"embedded", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			moxi := startMoxi(t, tc.args...)
			c, err := net.Dial("tcp", moxi.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r := bufio.NewReader(c)
			if got := roundTrip(t, c, r, "cache_memlimit 50\r\n", "OK"); !slices.Equal(got, []string{"OK"}) {
				t.Fatalf("cache_memlimit 50: %q", got)
			}
			lines := roundTrip(t, c, r, "stats proxy\r\n", "END")
			limits := 0
			for _, l := range lines {
				if strings.HasSuffix(l, ":limit_maxbytes 52428800") {
					limits++
				}
			}
			if tc.name == "embedded" && limits != 2 {
				t.Errorf("embedded shards with limit_maxbytes 50 MiB: %d of 2\n%s", limits, strings.Join(lines, "\n"))
			}
		})
	}
	for _, s := range servers {
		c, err := net.Dial("tcp", s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		lines := roundTrip(t, c, bufio.NewReader(c), "stats\r\n", "END")
		c.Close()
		if !slices.Contains(lines, "STAT limit_maxbytes 52428800") {
			t.Errorf("memcached %s did not get the limit", s.Addr)
		}
	}
}
