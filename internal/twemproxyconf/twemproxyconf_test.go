package twemproxyconf

import (
	"fmt"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/ketama/placement"
	"github.com/moxi-proxy/moxi/internal/pool"
)

// convert converts src and parses the result as moxi does, failing the test on any error.
func convert(t *testing.T, src string) (string, *config.Config) {
	t.Helper()
	out, _, err := Convert([]byte(src), "nutcracker.yml")
	if err != nil {
		t.Fatalf("Convert: %v\n%s", err, src)
	}
	cfg, err := config.Parse(out, "converted.yaml")
	if err != nil {
		t.Fatalf("moxi rejects the converted config: %v\n%s", err, out)
	}
	return string(out), cfg
}

// migrationExample is the nutcracker.yml that configs/twemproxy-migration.yaml says it
// corresponds to.
const migrationExample = `alpha:
  listen: 127.0.0.1:22121
  hash: fnv1a_64
  distribution: ketama
  auto_eject_hosts: true
  timeout: 400
  server_retry_timeout: 2000
  server_failure_limit: 2
  server_connections: 2
  servers:
   - 127.0.0.1:11211:1
   - 127.0.0.1:11212:1
   - 127.0.0.1:11213:2 cache-c
`

// TestMigrationExample: the conversion is the config the project ships for that file,
// setting for setting.
func TestMigrationExample(t *testing.T) {
	_, got := convert(t, migrationExample)
	want, err := config.Load("../../configs/twemproxy-migration.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if d := config.Diff(want, got); d != nil {
		t.Errorf("converted config differs from configs/twemproxy-migration.yaml:\n\t%s", strings.Join(d, "\n\t"))
	}
}

// TestPlacementVectors converts every pool recorded from a live nutcracker (the ketama
// package's vectors: every hash, ketama and modula, equal and unequal weights, named and
// unnamed servers, port 11211) and checks that the moxi pool built from the converted
// config puts every recorded key on the server nutcracker put it on.
func TestPlacementVectors(t *testing.T) {
	keys, pools, err := placement.Read("../ketama/testdata/twemproxy_placement.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pools {
		t.Run(fmt.Sprintf("%s/%s/%s", p.Dist, p.Hash, strings.Join(p.Servers, ",")), func(t *testing.T) {
			src := "p:\n  listen: 127.0.0.1:22121\n  distribution: " + p.Dist + "\n  hash: " + p.Hash + "\n  servers:\n"
			for _, s := range p.Servers {
				src += "   - " + s + "\n"
			}
			_, cfg := convert(t, src)
			pc := cfg.Pools[0]
			members := make([]pool.Member, len(pc.Servers))
			for i, s := range pc.Servers {
				members[i] = pool.Member{Name: s.RingName(), Addr: s.Addr, Weight: s.Weight}
			}
			moxi, err := pool.New(pc.Name, pool.Options{Distribution: pc.Distribution, Hash: pc.Hash}, members)
			if err != nil {
				t.Fatal(err)
			}
			for i, key := range keys {
				if got := moxi.Owner([]byte(key)); got != p.Owners[i] {
					t.Fatalf("key %q: moxi server %d, nutcracker %d", key, got, p.Owners[i])
				}
			}
		})
	}
}

// TestConvert checks settings and comments of the output for each kind of input.
func TestConvert(t *testing.T) {
	tests := []struct {
		name  string
		src   string
		check func(t *testing.T, out string, c *config.Config)
	}{
		{"twemproxy's defaults written out", "a:\n  listen: 127.0.0.1:22121\n  servers: [\"10.0.0.1:11211:1\"]\n",
			func(t *testing.T, out string, c *config.Config) {
				p := c.Pools[0]
				if p.Hash != "fnv1a_64" || p.Distribution != "ketama" || p.Failover {
					t.Errorf("hash %s, distribution %s, failover %v: want twemproxy's fnv1a_64, ketama, false", p.Hash, p.Distribution, p.Failover)
				}
				has(t, out, "twemproxy waits for a server forever without timeout")
			}},
		{"ipv6 servers get brackets", "a:\n  listen: 127.0.0.1:22121\n  servers:\n   - ::1:11211:1\n   - fe80::2:11300:2 b\n",
			func(t *testing.T, out string, c *config.Config) {
				s := c.Pools[0].Servers
				if s[0].Addr != "[::1]:11211" || s[0].RingName() != "::1" || s[1].Addr != "[fe80::2]:11300" || s[1].Name != "b" || s[1].Weight != 2 {
					t.Errorf("servers %+v", s)
				}
			}},
		{"durations and limits", "a:\n  listen: 127.0.0.1:22121\n  timeout: 1500\n  server_retry_timeout: 30000\n  server_failure_limit: 3\n  server_connections: 1\n  auto_eject_hosts: true\n  servers: [\"h:1:1\"]\n",
			func(t *testing.T, out string, c *config.Config) {
				p := c.Pools[0]
				if p.Timeout.String() != "1.5s" || p.DeadBackoff.String() != "30s" || p.DeadBackoffMax.String() != "30s" ||
					p.FailureLimit != 3 || p.Connections != 1 || !p.Failover {
					t.Errorf("pool %+v", p)
				}
			}},
		{"random distribution", "a:\n  listen: 127.0.0.1:22121\n  distribution: random\n  servers: [\"h:1:1\"]\n",
			func(t *testing.T, out string, c *config.Config) {
				has(t, out, "distribution: random sends each request to any server; moxi has no")
				if c.Pools[0].Distribution != "ketama" {
					t.Errorf("distribution %s", c.Pools[0].Distribution)
				}
			}},
		{"left-out keys are noted", "a:\n  listen: /tmp/tw.sock 0666\n  hash_tag: \"{}\"\n  preconnect: true\n  backlog: 1024\n  frobnicate: 1\n  redis: false\n  servers: [\"h:1:1\"]\n",
			func(t *testing.T, out string, c *config.Config) {
				if c.Pools[0].HashTag != "{}" {
					t.Errorf("hash_tag %q, want twemproxy's {}", c.Pools[0].HashTag)
				}
				has(t, out, "preconnect is left out")
				has(t, out, "backlog is left out")
				has(t, out, "frobnicate (line 6) is left out")
				has(t, out, "permissions 0666 are left out")
				if c.Listen != "/tmp/tw.sock" {
					t.Errorf("listen %q", c.Listen)
				}
			}},
		{"pools on listen addresses of their own", "a:\n  listen: 127.0.0.1:22121\n  servers: [\"h:1:1\"]\nb:\n  listen: 127.0.0.1:22122\n  servers: [\"h:2:1\"]\n" +
			"c:\n  listen: 127.0.0.1:22121\n  servers: [\"h:3:1\"]\nd:\n  listen: /run/d.sock\n  servers: [\"h:4:1\"]\n",
			func(t *testing.T, out string, c *config.Config) {
				if c.Listen != "127.0.0.1:22121" || c.DefaultPool != "a" || len(c.Pools) != 4 {
					t.Errorf("listen %s, default_pool %s, %d pools", c.Listen, c.DefaultPool, len(c.Pools))
				}
				want := []config.Listener{{Listen: "127.0.0.1:22122", DefaultPool: "b"}, {Listen: "/run/d.sock", DefaultPool: "d"}}
				if len(c.Listeners) != 2 || c.Listeners[0].Listen != want[0].Listen || c.Listeners[0].DefaultPool != want[0].DefaultPool ||
					c.Listeners[1].Listen != want[1].Listen || c.Listeners[1].DefaultPool != want[1].DefaultPool {
					t.Errorf("listeners %+v, want %+v", c.Listeners, want)
				}
				has(t, out, "twemproxy listened for c on 127.0.0.1:22121, as for a")
			}},
		{"redis pools left out", "r:\n  listen: 127.0.0.1:22120\n  redis: true\n  servers: [\"h:6379:1\"]\na:\n  listen: 127.0.0.1:22121\n  servers: [\"h:1:1\"]\n",
			func(t *testing.T, out string, c *config.Config) {
				if len(c.Pools) != 1 || c.Pools[0].Name != "a" || c.Listen != "127.0.0.1:22121" || len(c.Listeners) != 0 {
					t.Errorf("pools %v, listen %s, listeners %v: want a alone, on its port", c.Pools, c.Listen, c.Listeners)
				}
				has(t, out, "Left out: the Redis pools r (moxi speaks memcached only")
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, c := convert(t, tt.src)
			tt.check(t, out, c)
		})
	}
}

func has(t *testing.T, out, want string) {
	t.Helper()
	if !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
}

// TestRedisWarnings: each Redis pool left out is a warning naming it and its line.
func TestRedisWarnings(t *testing.T) {
	src := "r1:\n  redis: true\n  servers: [\"h:6379:1\"]\na:\n  listen: 127.0.0.1:22121\n  servers: [\"h:1:1\"]\nr2:\n  redis: true\n  servers: [\"h:6380:1\"]\n"
	_, warnings, err := Convert([]byte(src), "nutcracker.yml")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"nutcracker.yml:1: r1 is a Redis pool, left out: moxi speaks memcached only; keep it on twemproxy",
		"nutcracker.yml:7: r2 is a Redis pool, left out: moxi speaks memcached only; keep it on twemproxy",
	}
	if strings.Join(warnings, "\n") != strings.Join(want, "\n") {
		t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(warnings, "\n"), strings.Join(want, "\n"))
	}
}

// TestConvertErrors: what moxi cannot serve is an error, every one at once, with its place.
func TestConvertErrors(t *testing.T) {
	tests := []struct{ name, src, want string }{
		{"only redis pools", "a:\n  listen: 127.0.0.1:22121\n  redis: true\n  servers: [\"h:1:1\"]\n",
			"nutcracker.yml: no memcached pool: every pool is a Redis one (a), and moxi speaks memcached only"},
		{"bad hash_tag", "a:\n  listen: 127.0.0.1:22121\n  hash_tag: \"{\"\n  servers: [\"h:1:1\"]\n",
			"nutcracker.yml:3: a.hash_tag: want two characters, e.g. \"{}\", got \"{\""},
		{"unix socket server", "a:\n  listen: 127.0.0.1:22121\n  servers: [\"/tmp/mc.sock:1\"]\n",
			"nutcracker.yml:3: a.servers[0]: /tmp/mc.sock is a Unix socket: moxi reaches servers over TCP only"},
		{"several", "a:\n  listen: 127.0.0.1:22121\n  hash: sha1\n  timeout: soon\n  servers: [\"h:1:x\"]\n",
			"nutcracker.yml:3: a.hash: unknown hash \"sha1\": want one of crc16, crc32, crc32a, fnv1_32, fnv1_64, fnv1a_32, fnv1a_64, hsieh, jenkins, md5, murmur, one_at_a_time\n" +
				"nutcracker.yml:4: a.timeout: want a positive number of milliseconds, got \"soon\"\n" +
				"nutcracker.yml:5: a.servers[0]: bad weight \"x\" in \"h:1:x\": want an integer of at least 1"},
		{"no servers", "a:\n  listen: 127.0.0.1:22121\n", "nutcracker.yml:2: a.servers: required: a list of \"host:port:weight [name]\""},
		{"not a nutcracker.yml", "- a\n", "nutcracker.yml: no pools: a nutcracker.yml is a mapping of pool names to their settings"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := Convert([]byte(tt.src), "nutcracker.yml")
			if err == nil {
				t.Fatalf("no error; output:\n%s", out)
			}
			if err.Error() != tt.want {
				t.Errorf("error:\n%s\nwant:\n%s", err, tt.want)
			}
		})
	}
}
