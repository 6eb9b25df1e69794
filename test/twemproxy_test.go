package test

import (
	"bufio"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestPlacementMatchesTwemproxy writes 3,000 keys through nutcracker (twemproxy) and through
// moxi configured with the same server list, and checks that every key lands on the same
// memcached, for both of twemproxy's common hashes and every server-list form.
func TestPlacementMatchesTwemproxy(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	nutcracker := requireBinary(t, "nutcracker")
	mcs := cluster(t, 3)
	keys := make([]string, 3000)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%d:profile", i*7919)
	}
	forms := []struct {
		name    string
		servers func(addr string, i int) string
	}{
		{"equal weights", func(a string, i int) string { return a + ":1" }},
		{"weights 1,2,3", func(a string, i int) string { return fmt.Sprintf("%s:%d", a, i+1) }},
		{"named servers", func(a string, i int) string { return fmt.Sprintf("%s:1 cache-%c", a, 'a'+i) }},
	}
	for _, hash := range []string{"md5", "fnv1a_64"} {
		for _, form := range forms {
			t.Run(hash+"/"+form.name, func(t *testing.T) {
				var servers []string
				for i, mc := range mcs {
					servers = append(servers, form.servers(mc.Addr, i))
				}
				flushAll(t, mcs)
				twem := startNutcracker(t, nutcracker, "  hash: "+hash+"\n", servers)
				setKeys(t, twem.addr, keys)
				want := placement(t, mcs, keys)

				flushAll(t, mcs)
				moxi := startMoxi(t, "--config", writeConfig(t, poolConfig(
					"    distribution: ketama\n    hash: "+hash+"\n", servers...)))
				setKeys(t, moxi.addr, keys)
				got := placement(t, mcs, keys)

				differ, perServer := 0, make([]int, len(mcs))
				for i := range keys {
					if got[i] != want[i] {
						if differ < 5 {
							t.Errorf("%s: twemproxy put it on server %d, moxi on %d", keys[i], want[i], got[i])
						}
						differ++
					}
					perServer[got[i]]++
				}
				t.Logf("%d/%d keys placed as twemproxy does; per server %v", len(keys)-differ, len(keys), perServer)
				if differ > 0 {
					t.Errorf("%d of %d keys placed differently", differ, len(keys))
				}
			})
		}
	}
}

// startNutcracker runs nutcracker with one ketama pool of servers, settings (its hash…) as
// nutcracker.yml lines.
// TestHashTagMatchesTwemproxy: with hash_tag "{}", moxi places keys as nutcracker does —
// the part between the first "{" and the next "}" after it, when not empty, is hashed —
// for tagged keys, untagged ones and the edge cases of the rule: an empty tag, a close
// before the open, two tags, an open with no close.
func TestHashTagMatchesTwemproxy(t *testing.T) {
	nutcracker := requireBinary(t, "nutcracker")
	mcs := cluster(t, 3)
	var keys []string
	for i := range 200 {
		keys = append(keys,
			fmt.Sprintf("{user%d}:cart", i), fmt.Sprintf("{user%d}:profile", i), fmt.Sprintf("plain:%d", i),
			fmt.Sprintf("{}empty:%d", i), fmt.Sprintf("}a{:%d", i), fmt.Sprintf("}b{c%d}", i),
			fmt.Sprintf("x{t%d}y{z}", i), fmt.Sprintf("open{%d", i), fmt.Sprintf("close}%d", i), fmt.Sprintf("%d{}", i))
	}
	servers := []string{mcs[0].Addr + ":1", mcs[1].Addr + ":1", mcs[2].Addr + ":1"}
	for _, hash := range []string{"md5", "fnv1a_64"} {
		t.Run(hash, func(t *testing.T) {
			flushAll(t, mcs)
			twem := startNutcracker(t, nutcracker, "  hash: "+hash+"\n  hash_tag: \"{}\"\n", servers)
			setKeys(t, twem.addr, keys)
			want := placement(t, mcs, keys)

			flushAll(t, mcs)
			moxi := startMoxi(t, "--config", writeConfig(t, poolConfig(
				"    distribution: ketama\n    hash: "+hash+"\n    hash_tag: \"{}\"\n", servers...)))
			setKeys(t, moxi.addr, keys)
			got := placement(t, mcs, keys)
			differ := 0
			for i := range keys {
				if got[i] != want[i] {
					if differ < 5 {
						t.Errorf("%s: twemproxy put it on server %d, moxi on %d", keys[i], want[i], got[i])
					}
					differ++
				}
			}
			if differ > 0 {
				t.Errorf("%d of %d keys placed differently", differ, len(keys))
			}
			// The tag is what is hashed: a user's keys share a server.
			for i := 0; i < len(keys); i += 10 {
				if got[i] != got[i+1] {
					t.Errorf("%s and %s on different servers", keys[i], keys[i+1])
				}
			}
		})
	}
}

// nutcrackerSample is twemproxy's own sample config, conf/nutcracker.yml, as Debian's
// nutcracker package installs it: five pools, two of them Redis, on ports and a Unix
// socket of their own, one sharing servers with another.
const nutcrackerSample = "/usr/share/doc/nutcracker/examples/nutcracker.yml"

// TestConvertTwemproxySample converts twemproxy's sample config: exit 0, its Redis pools
// named in a warning, and a config --check accepts. Then, with the sample's addresses
// replaced by live memcached processes and free ports (and hash_tag "{}" added to a
// memcached pool: the sample's only tagged pool is a Redis one), a live nutcracker and
// the converted moxi put every key of each memcached pool, written on that pool's own
// port, on the same server.
func TestConvertTwemproxySample(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	nutcracker := requireBinary(t, "nutcracker")
	sample, err := os.ReadFile(nutcrackerSample)
	if err != nil {
		t.Fatalf("twemproxy's sample config (from the nutcracker package, which make deps installs): %v", err)
	}
	convert := func(path string) string {
		t.Helper()
		cmd := exec.Command(moxiBin, "--from-twemproxy", path)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("moxi --from-twemproxy %s: %v\n%s", path, err, stderr.String())
		}
		for _, pool := range []string{"alpha", "beta"} {
			if !strings.Contains(stderr.String(), pool+" is a Redis pool, left out") {
				t.Errorf("no warning names the Redis pool %s: %q", pool, stderr.String())
			}
		}
		converted := writeConfig(t, stdout.String())
		if out, err := exec.Command(moxiBin, "--check", "--config", converted).CombinedOutput(); err != nil {
			t.Fatalf("--check refuses the converted config: %v\n%s\n%s", err, out, stdout.String())
		}
		return converted
	}
	convert(nutcrackerSample)

	// The sample, live: every address replaced.
	live := string(sample)
	servers := map[string]*memcachedtest.Server{}
	for _, addr := range regexp.MustCompile(`127\.0\.0\.1:112\d\d`).FindAllString(live, -1) {
		if servers[addr] == nil {
			servers[addr] = memcachedtest.Start(t)
		}
	}
	for old, mc := range servers {
		live = strings.ReplaceAll(live, old+":", mc.Addr+":")
	}
	ports := map[string]string{}
	for _, old := range regexp.MustCompile(`listen: (127\.0\.0\.1:221\d\d)`).FindAllStringSubmatch(live, -1) {
		ports[old[1]] = freeAddr(t)
		live = strings.Replace(live, old[0], "listen: "+ports[old[1]], 1)
	}
	socket := filepath.Join(t.TempDir(), "omega.sock")
	live = strings.Replace(live, "listen: /tmp/gamma", "listen: "+socket, 1)
	live = strings.Replace(live, "gamma:\n", "gamma:\n  hash_tag: \"{}\"\n", 1)
	livePath := filepath.Join(t.TempDir(), "nutcracker.yml")
	if err := os.WriteFile(livePath, []byte(live), 0o644); err != nil {
		t.Fatal(err)
	}
	type memcachedPool struct {
		name, port string
		servers    []*memcachedtest.Server
		keys       []string
	}
	pools := []*memcachedPool{{name: "gamma", port: ports["127.0.0.1:22123"]}, {name: "delta", port: ports["127.0.0.1:22124"]}, {name: "omega", port: socket}}
	for _, p := range pools {
		section := live[strings.Index(live, p.name+":\n"):]
		if end := strings.Index(section, "\n\n"); end > 0 {
			section = section[:end]
		}
		for _, m := range regexp.MustCompile(`(127\.0\.0\.1:\d+):\d+`).FindAllStringSubmatch(section, -1) {
			for _, mc := range servers {
				if mc.Addr == m[1] {
					p.servers = append(p.servers, mc)
				}
			}
		}
		for i := range 300 {
			p.keys = append(p.keys, fmt.Sprintf("%s:%d", p.name, i*7919), fmt.Sprintf("{%s%d}:cart", p.name, i))
		}
	}
	all := slices.Collect(maps.Values(servers))
	if len(all) != 12 || len(pools[0].servers) != 2 || len(pools[1].servers) != 10 || len(pools[2].servers) != 2 {
		t.Fatalf("the sample's memcached servers: %d in all, %d %d %d in gamma, delta, omega; want 12, 2, 10, 2",
			len(all), len(pools[0].servers), len(pools[1].servers), len(pools[2].servers))
	}

	_, statsPort, _ := net.SplitHostPort(freeAddr(t))
	twem := start(t, pools[0].port, nutcracker, "-c", livePath, "-s", statsPort, "-a", "127.0.0.1", "-o", filepath.Join(t.TempDir(), "nutcracker.log"))
	want := map[string][]int{}
	for _, p := range pools {
		flushAll(t, all)
		setKeys(t, p.port, p.keys)
		want[p.name] = placement(t, p.servers, p.keys)
	}
	twem.stop(t)

	converted := convert(livePath)
	moxi := launch(t, pools[0].port, moxiBin, true, []string{"--config", converted, "--admin", ""})
	defer moxi.stop(t)
	for _, p := range pools {
		flushAll(t, all)
		setKeys(t, p.port, p.keys)
		got := placement(t, p.servers, p.keys)
		differ := 0
		for i := range p.keys {
			if got[i] != want[p.name][i] {
				differ++
			}
		}
		if differ > 0 {
			t.Errorf("pool %s: %d of %d keys placed elsewhere than by nutcracker", p.name, differ, len(p.keys))
		}
		// omega weighs one server 100,000 times the other: its keys all land there.
		if used := len(slices.Compact(slices.Sorted(slices.Values(got)))); used < 2 && p.name != "omega" {
			t.Errorf("pool %s: every key on one server: the comparison proves nothing", p.name)
		}
	}

	// twemproxy's safety kept: no retries, no failover in omega, whose servers twemproxy
	// did not eject, and flush_all refused as nutcracker refuses it — not sent to every
	// server of every pool.
	cfg, err := config.Load(converted)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Limits.AllowFlushAll {
		t.Error("converted with limits.allow_flush_all true: twemproxy refuses flush_all")
	}
	for _, p := range cfg.Pools {
		if p.Retries != 0 || p.Failover != (p.Name != "omega") {
			t.Errorf("pool %s converted with retries %d, failover %v; want 0 (twemproxy never retries), %v (auto_eject_hosts)",
				p.Name, p.Retries, p.Failover, p.Name != "omega")
		}
	}
	c, err := net.Dial("tcp", pools[1].port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := roundTrip(t, c, bufio.NewReader(c), "flush_all\r\n", "OK"); !slices.Equal(got, []string{"CLIENT_ERROR flush_all not allowed"}) {
		t.Errorf("flush_all through the converted config: %q, want it refused", got)
	}
	placement(t, pools[2].servers, pools[2].keys) // every key of the last pool written still on its server
}

func startNutcracker(t *testing.T, bin, settings string, servers []string) *process {
	t.Helper()
	addr, stats := freeAddr(t), freeAddr(t)
	_, statsPort, _ := net.SplitHostPort(stats)
	var conf strings.Builder
	fmt.Fprintf(&conf, "alpha:\n  listen: %s\n%s  distribution: ketama\n  timeout: 2000\n  servers:\n", addr, settings)
	for _, s := range servers {
		fmt.Fprintf(&conf, "   - %s\n", s)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "nutcracker.yml")
	if err := os.WriteFile(path, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return start(t, addr, bin, "-c", path, "-s", statsPort, "-a", "127.0.0.1", "-o", filepath.Join(dir, "nutcracker.log"))
}

func flushAll(t *testing.T, mcs []*memcachedtest.Server) {
	t.Helper()
	for _, mc := range mcs {
		c, err := net.Dial("tcp", mc.Addr)
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, c, bufio.NewReader(c), "flush_all\r\n", "OK")
		c.Close()
	}
}

// setKeys stores each key (value "1") through addr (host:port, or a Unix socket's path),
// pipelined in chunks.
func setKeys(t *testing.T, addr string, keys []string) {
	t.Helper()
	network := "tcp"
	if strings.Contains(addr, "/") {
		network = "unix"
	}
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	for start := 0; start < len(keys); start += 500 {
		chunk := keys[start:min(start+500, len(keys))]
		var b strings.Builder
		for _, k := range chunk {
			fmt.Fprintf(&b, "set %s 0 0 1\r\n1\r\n", k)
		}
		if _, err := c.Write([]byte(b.String())); err != nil {
			t.Fatal(err)
		}
		for _, k := range chunk {
			line, err := r.ReadString('\n')
			if err != nil || line != "STORED\r\n" {
				t.Fatalf("set %s through %s: %q %v", k, addr, line, err)
			}
		}
	}
}

// placement asks every server directly which keys it holds: the server index per key.
func placement(t *testing.T, mcs []*memcachedtest.Server, keys []string) []int {
	t.Helper()
	owner := make([]int, len(keys))
	for i, on := range holders(t, mcs, keys) {
		if len(on) != 1 {
			t.Fatalf("key %s is on servers %v, want one", keys[i], on)
		}
		owner[i] = on[0]
	}
	return owner
}
