package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// contractConfig is what the reference example (testdata/contract.yaml, docs/configuration.md) documents, value by value.
func contractConfig() *Config {
	main := &Pool{
		Name:         "main",
		Distribution: "ketama",
		Hash:         "md5",
		Servers: []Server{
			{Addr: "127.0.0.1:11212", Weight: 1, Line: 39},
			{Addr: "127.0.0.1:11213", Weight: 2, Line: 40},
			{Name: "mc3", Addr: "127.0.0.1:11214", Weight: 1, MigrateFrom: "127.0.0.1:11219", MigrateAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), Line: 41},
		},
		Connections:      4,
		ConnectTimeout:   time.Second,
		Timeout:          250 * time.Millisecond,
		Retries:          1,
		FailureLimit:     2,
		DeadBackoff:      100 * time.Millisecond,
		DeadBackoffMax:   10 * time.Second,
		Failover:         true,
		FailoverTTL:      5 * time.Minute,
		Backup:           "spare",
		Embedded:         0,
		EmbeddedMemoryMB: 64,
		MigrateRate:      0,
		Replicas:         1,
		WriteQuorum:      "all",
		ReadFrom:         "first",
		TLS:              &PoolTLS{CA: "/etc/moxi/ca.crt", Line: 59},
	}
	spare := NewPool("spare")
	spare.Servers = []Server{{Addr: "127.0.0.1:11300", Weight: 1, Line: 68}}
	return &Config{
		Listen: "127.0.0.1:11211",
		TLS:    &TLS{Cert: "/etc/moxi/tls.crt", Key: "/etc/moxi/tls.key", Line: 4},
		Listeners: []Listener{{Listen: "127.0.0.1:22122", DefaultPool: "spare", Line: 8,
			TLS: &TLS{Cert: "/etc/moxi/tls.crt", Key: "/etc/moxi/tls.key", Line: 10}}},
		Admin:           "127.0.0.1:9151",
		ShutdownTimeout: 10 * time.Second,
		Limits: Limits{MaxConnections: 10000, MaxKeyBytes: 250, MaxValueBytes: 1048576, MaxMultigetKeys: 10000, AllowFlushAll: true,
			MaxBufferedBytes: 67108864, MaxConnectionBytes: 4194304, MaxBackgroundBytes: 67108864,
			RequestTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second},
		WatchConfig:   true,
		Pools:         []*Pool{main, spare},
		DefaultPool:   "main",
		Routes:        []Route{{Prefix: "sess:", Pool: "spare"}},
		Dedup:         true,
		HotCache:      HotCache{Prefixes: []string{"cfg:", "hot:"}, MaxItems: 100000, MaxBytes: 67108864, TTL: 2 * time.Second},
		HotKeys:       HotKeys{Top: 20, Sample: 0.01, Window: 10 * time.Second, MinShare: 0.01}, // off: the example leaves it out
		FireAndForget: FireAndForget{Prefixes: []string{"log:", "sess:"}, MaxPending: 10000, MaxPendingBytes: 67108864},
		Metrics:       Metrics{PerServer: true},
	}
}

func mustLoad(t *testing.T, path string) *Config {
	t.Helper()
	c, err := Load(path)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	return c
}

func mustParse(t *testing.T, src string) *Config {
	t.Helper()
	c, err := Parse([]byte(src), "t.yaml")
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror: %v", src, err)
	}
	return c
}

// equal compares configs as DeepEqual does, with a readable failure.
func equal(t *testing.T, got, want *Config) {
	t.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	g, _ := got.YAML()
	w, _ := want.YAML()
	t.Errorf("config differs\ngot:  %+v\nwant: %+v\ngot YAML:\n%s\nwant YAML:\n%s", got, want, g, w)
	for i := range min(len(got.Pools), len(want.Pools)) {
		if !reflect.DeepEqual(got.Pools[i], want.Pools[i]) {
			t.Errorf("pool %d:\ngot:  %+v\nwant: %+v", i, *got.Pools[i], *want.Pools[i])
		}
	}
}

// withoutLines returns a copy of c with Server.Line cleared: positions change when a
// config is written out again, nothing else may.
func withoutLines(c *Config) *Config {
	out := *c
	if c.TLS != nil {
		tls := *c.TLS
		tls.Line = 0
		out.TLS = &tls
	}
	out.HotCache.PeerTokenLine = 0
	out.Listeners = nil
	for _, l := range c.Listeners {
		l.Line = 0
		if l.TLS != nil {
			tls := *l.TLS
			tls.Line = 0
			l.TLS = &tls
		}
		out.Listeners = append(out.Listeners, l)
	}
	out.Pools = nil
	for _, p := range c.Pools {
		q := *p
		if p.TLS != nil {
			tls := *p.TLS
			tls.Line = 0
			q.TLS = &tls
		}
		q.Servers = nil
		for _, s := range p.Servers {
			s.Line = 0
			q.Servers = append(q.Servers, s)
		}
		out.Pools = append(out.Pools, &q)
	}
	return &out
}

func TestContractExample(t *testing.T) {
	equal(t, mustLoad(t, "testdata/contract.yaml"), contractConfig())
}

// TestConfigsDir parses every shipped example; moxi.yaml, which an install copies and then
// edits, is safe as shipped — one plain pool, every feature off, the features' examples
// commented out — and names every key of the reference example; embedded.yaml is exactly
// Default.
func TestConfigsDir(t *testing.T) {
	files, err := filepath.Glob("../../configs/*.yaml")
	if err != nil || len(files) < 3 {
		t.Fatalf("configs/*.yaml: %v %v", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			c := mustLoad(t, f)
			switch filepath.Base(f) {
			case "moxi.yaml":
				want := newConfig()
				main := NewPool("main")
				main.Servers = []Server{{Addr: "127.0.0.1:11212", Weight: 1}, {Addr: "127.0.0.1:11213", Weight: 1}}
				want.Pools, want.DefaultPool = []*Pool{main}, "main"
				got := withoutLines(c)
				got.HotCache.Prefixes, got.FireAndForget.Prefixes = nil, nil // [] in the file
				equal(t, got, want)
				text, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				for _, path := range keyPaths(t, contractConfig()) {
					key := strings.TrimSuffix(path[strings.LastIndexByte(path, '.')+1:], "[]")
					if key == "*" {
						continue // a pool's name
					}
					if !regexp.MustCompile(`(?m)^[ #]*(- )?` + regexp.QuoteMeta(key) + `:`).Match(text) {
						t.Errorf("moxi.yaml has no line for %s, set or commented out", path)
					}
				}
			case "embedded.yaml":
				equal(t, c, Default())
			case "twemproxy-migration.yaml":
				p := c.Pool("alpha")
				want := []Server{
					{Addr: "127.0.0.1:11211", Weight: 1},
					{Addr: "127.0.0.1:11212", Weight: 1},
					{Name: "cache-c", Addr: "127.0.0.1:11213", Weight: 2},
				}
				if p == nil || p.Distribution != "ketama" || p.Hash != "fnv1a_64" ||
					!reflect.DeepEqual(withoutLines(c).Pools[0].Servers, want) {
					t.Errorf("alpha pool = %+v", p)
				}
			case "resilience.yaml":
				if p := c.Pool("main"); p == nil || !p.Failover || p.Backup != "spare" || p.Retries != 1 {
					t.Errorf("main pool = %+v", p)
				}
			case "hot-keys.yaml":
				if !c.Dedup || len(c.HotCache.Prefixes) != 2 || len(c.FireAndForget.Prefixes) != 1 {
					t.Errorf("features = %v %+v %+v", c.Dedup, c.HotCache, c.FireAndForget)
				}
			case "live-migration.yaml":
				if p := c.Pool("main"); p == nil || p.Servers[1].MigrateFrom != "127.0.0.1:11213" || p.MigrateRate != 5000 {
					t.Errorf("main pool = %+v", p)
				}
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	c := mustParse(t, "pools:\n  p:\n    servers: [10.0.0.1:11211]\n")
	want := Default()
	p := NewPool("p")
	p.Servers = []Server{{Addr: "10.0.0.1:11211", Weight: 1, Line: 3}}
	want.Pools = []*Pool{p}
	want.DefaultPool = "p"
	equal(t, c, want)
}

func TestDefault(t *testing.T) {
	c := Default()
	if c.Listen != "127.0.0.1:11211" || c.Admin != "127.0.0.1:9151" || len(c.Pools) != 1 ||
		c.Pools[0].Name != "main" || c.Pools[0].Embedded != 2 || c.DefaultPool != "main" {
		t.Fatalf("Default() = %+v", c)
	}
	b, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	equal(t, mustParse(t, string(b)), c)
}

// TestValidForms parses each accepted spelling and checks the one thing it sets.
func TestValidForms(t *testing.T) {
	const pool = "pools:\n  p:\n"
	tests := []struct {
		name  string
		src   string
		check func(*Config) bool
	}{
		{"server host:port", pool + "    servers: [10.0.0.1:11212]\n",
			func(c *Config) bool {
				return c.Pools[0].Servers[0] == Server{Addr: "10.0.0.1:11212", Weight: 1, Line: 3}
			}},
		{"server host:port:weight", pool + "    servers: [10.0.0.1:11212:3]\n",
			func(c *Config) bool {
				return c.Pools[0].Servers[0] == Server{Addr: "10.0.0.1:11212", Weight: 3, Line: 3}
			}},
		{"server twemproxy form with name", pool + "    servers:\n      - 10.0.0.1:11212:3 cache-a\n",
			func(c *Config) bool {
				return c.Pools[0].Servers[0] == Server{Name: "cache-a", Addr: "10.0.0.1:11212", Weight: 3, Line: 4}
			}},
		{"server host:port with name", pool + "    servers: [\"10.0.0.1:11212  a\"]\n",
			func(c *Config) bool {
				return c.Pools[0].Servers[0] == Server{Name: "a", Addr: "10.0.0.1:11212", Weight: 1, Line: 3}
			}},
		{"server map without name or weight", pool + "    servers:\n      - addr: h.example:11212\n",
			func(c *Config) bool {
				return c.Pools[0].Servers[0] == Server{Addr: "h.example:11212", Weight: 1, Line: 4}
			}},
		{"server ipv6", pool + "    servers: [\"[::1]:11212\", \"[::2]:11212:4\"]\n",
			func(c *Config) bool {
				s := c.Pools[0].Servers
				return s[0].Addr == "[::1]:11212" && s[1].Addr == "[::2]:11212" && s[1].Weight == 4
			}},
		{"server port made canonical", pool + "    servers: [10.0.0.1:011212]\n",
			func(c *Config) bool { return c.Pools[0].Servers[0].Addr == "10.0.0.1:11212" }},
		{"false and zero are not defaults", pool + "    embedded: 1\n    failover: false\n    retries: 0\nwatch_config: false\ndedup: false\n",
			func(c *Config) bool {
				return !c.WatchConfig && !c.Dedup && !c.Pools[0].Failover && c.Pools[0].Retries == 0
			}},
		{"null keeps the default", pool + "    embedded: 1\n    timeout:\nlisten: ~\nlimits:\n",
			func(c *Config) bool {
				return c.Pools[0].Timeout == 250*time.Millisecond && c.Listen == "127.0.0.1:11211" && c.Limits.MaxKeyBytes == 250
			}},
		{"admin off", pool + "    embedded: 1\nadmin: \"\"\n",
			func(c *Config) bool { return c.Admin == "" }},
		{"listen on all interfaces, any port", pool + "    embedded: 1\nlisten: \":0\"\n",
			func(c *Config) bool { return c.Listen == ":0" }},
		{"alias", "pools:\n  p: {servers: [&s 10.0.0.9:11212]}\n  q: {servers: [*s]}\ndefault_pool: p\n",
			func(c *Config) bool {
				return c.Pools[1].Servers[0] == Server{Addr: "10.0.0.9:11212", Weight: 1, Line: 3}
			}},
		{"jump and fnv1a_64", pool + "    embedded: 1\n    distribution: jump\n    hash: fnv1a_64\n",
			func(c *Config) bool { return c.Pools[0].Distribution == "jump" && c.Pools[0].Hash == "fnv1a_64" }},
		{"durations", pool + "    embedded: 1\n    timeout: 1.5s\n    dead_backoff: 1m\n    dead_backoff_max: 1h\nshutdown_timeout: 0s\n",
			func(c *Config) bool {
				p := c.Pools[0]
				return p.Timeout == 1500*time.Millisecond && p.DeadBackoff == time.Minute &&
					p.DeadBackoffMax == time.Hour && c.ShutdownTimeout == 0
			}},
		{"limits", pool + "    embedded: 1\nlimits: {max_key_bytes: 1, max_value_bytes: 1073741824, max_connections: 1, max_multiget_keys: 1, allow_flush_all: false}\n",
			func(c *Config) bool {
				l := c.Limits
				return l.MaxKeyBytes == 1 && l.MaxValueBytes == 1<<30 && l.MaxConnections == 1 && l.MaxMultigetKeys == 1 && !l.AllowFlushAll
			}},
		{"byte bounds and progress timeouts", pool + "    embedded: 1\nlimits: {max_buffered_bytes: 1000, max_connection_bytes: 100, max_background_bytes: 10, request_timeout: 1s, write_timeout: 2s}\nhot_cache: {max_bytes: 5}\nfire_and_forget: {max_pending_bytes: 7}\n",
			func(c *Config) bool {
				l := c.Limits
				return l.MaxBufferedBytes == 1000 && l.MaxConnectionBytes == 100 && l.MaxBackgroundBytes == 10 &&
					l.RequestTimeout == time.Second && l.WriteTimeout == 2*time.Second &&
					c.HotCache.MaxBytes == 5 && c.FireAndForget.MaxPendingBytes == 7
			}},
		{"routes and default_pool", "pools:\n  a: {embedded: 1}\n  b: {embedded: 1}\ndefault_pool: b\nroutes:\n  - {prefix: \"x:\", pool: a}\n  - {prefix: \"y:\", pool: a}\n",
			func(c *Config) bool {
				return c.DefaultPool == "b" && reflect.DeepEqual(c.Routes, []Route{{"x:", "a"}, {"y:", "a"}})
			}},
		{"backup chain", "pools:\n  a: {embedded: 1, backup: b}\n  b: {embedded: 1, backup: c}\n  c: {embedded: 1}\ndefault_pool: a\n",
			func(c *Config) bool { return c.Pool("a").Backup == "b" && c.Pool("b").Backup == "c" }},
		{"pool order is file order", "pools:\n  z: {embedded: 1}\n  a: {embedded: 1}\n  m: {embedded: 1}\ndefault_pool: m\n",
			func(c *Config) bool {
				return c.Pools[0].Name == "z" && c.Pools[1].Name == "a" && c.Pools[2].Name == "m"
			}},
		{"embedded memory", pool + "    embedded: 3\n    embedded_memory_mb: 8\n",
			func(c *Config) bool { return c.Pools[0].Embedded == 3 && c.Pools[0].EmbeddedMemoryMB == 8 }},
		{"empty prefix lists", pool + "    embedded: 1\nhot_cache: {prefixes: []}\nfire_and_forget: {prefixes: []}\n",
			func(c *Config) bool { return c.HotCache.Prefixes == nil && c.FireAndForget.Prefixes == nil }},
		{"hot_keys absent: off", pool + "    embedded: 1\n",
			func(c *Config) bool {
				return c.HotKeys == HotKeys{Top: 20, Sample: 0.01, Window: 10 * time.Second, MinShare: 0.01}
			}},
		{"hot_keys null: off", pool + "    embedded: 1\nhot_keys:\n",
			func(c *Config) bool { return !c.HotKeys.Enabled }},
		{"hot_keys empty: on with the defaults", pool + "    embedded: 1\nhot_keys: {}\n",
			func(c *Config) bool {
				return c.HotKeys == HotKeys{Enabled: true, Top: 20, Sample: 0.01, Window: 10 * time.Second, MinShare: 0.01}
			}},
		{"hot_keys every key", pool + "    embedded: 1\nhot_keys:\n  top: 1000\n  sample: 1\n  window: 1s\n  min_share: 0.5\n  cache: true\n",
			func(c *Config) bool {
				return c.HotKeys == HotKeys{Enabled: true, Top: 1000, Sample: 1, Window: time.Second, MinShare: 0.5, Cache: true}
			}},
		{"hot_keys cache without hot_cache prefixes", pool + "    embedded: 1\nhot_keys: {cache: true, sample: 0.001, min_share: 0.05}\n",
			func(c *Config) bool {
				return c.HotKeys.Cache && c.HotKeys.Sample == 0.001 && c.HotKeys.MinShare == 0.05 && c.HotCache.Prefixes == nil
			}},
		{"hot_cache peers", pool + "    embedded: 1\nhot_cache:\n  peers: [10.0.0.2:09151, \"[::1]:9152\", moxi-1.moxi:9151]\n  peer_token_file: /etc/moxi/peer-token\n",
			func(c *Config) bool {
				h := c.HotCache
				return slices.Equal(h.Peers, []string{"10.0.0.2:9151", "[::1]:9152", "moxi-1.moxi:9151"}) && h.PeersDiscover == nil &&
					h.PeerTokenFile == "/etc/moxi/peer-token" && h.PeerTokenLine == 6 && h.PeerToken == nil
			}},
		{"hot_cache peers_discover", pool + "    embedded: 1\nhot_cache:\n  peers: []\n  peers_discover: {dns: moxi.cache.svc}\n  peer_token_file: /t\n",
			func(c *Config) bool {
				want := Discover{DNS: "moxi.cache.svc", Port: 9151, Interval: 10 * time.Second, RemoveAfter: time.Minute}
				h := c.HotCache
				return h.Peers == nil && h.PeersDiscover != nil && *h.PeersDiscover == want
			}},
		{"hot_cache peers_discover empty: none", pool + "    embedded: 1\nhot_cache: {peers: [\"h:1\"], peers_discover: {}, peer_token_file: /t}\n",
			func(c *Config) bool { return c.HotCache.PeersDiscover == nil && len(c.HotCache.Peers) == 1 }},
		{"peer_token_file alone", pool + "    embedded: 1\nhot_cache: {peer_token_file: /t}\n",
			func(c *Config) bool { return c.HotCache.PeerTokenFile == "/t" && c.HotCache.Peers == nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c := mustParse(t, tt.src); !tt.check(c) {
				b, _ := c.YAML()
				t.Errorf("unexpected result:\n%s", b)
			}
		})
	}
}

// TestRoundTrip checks that YAML() is re-loadable and loses nothing.
func TestRoundTrip(t *testing.T) {
	srcs := map[string]*Config{"default": Default(), "contract": contractConfig()}
	files, _ := filepath.Glob("../../configs/*.yaml")
	for _, f := range append(files, "testdata/contract.yaml") {
		srcs[f] = mustLoad(t, f)
	}
	odd := mustParse(t, "pools:\n  \"true\": {servers: [\"[::1]:1:7 x\", {name: \"a b\", addr: \"h:2\", migrate_from: \"h:3\"}], backup: \"1\"}\n"+
		"  \"1\": {embedded: 1, failover: false}\ndefault_pool: \"1\"\nadmin: \"\"\nlisten: \":0\"\n"+
		"hot_cache: {prefixes: [\"#\", \"- \", \"'\", \"\\\"\"]}\nroutes: [{prefix: \"null\", pool: \"true\"}]\n")
	srcs["odd"] = odd
	srcs["hot keys and peers"] = mustParse(t, "pools:\n  p: {embedded: 1}\nhot_cache: {peers: [\"10.0.0.2:9151\", \"[::1]:9152\"], peer_token_file: /etc/moxi/peer-token}\n"+
		"hot_keys: {top: 7, sample: 0.3, window: 1m30s, min_share: 0.125, cache: true}\n")
	srcs["hot keys on with defaults"] = mustParse(t, "pools:\n  p: {embedded: 1}\nhot_keys: {}\n")
	srcs["peers discovered"] = mustParse(t, "pools:\n  p: {embedded: 1}\nhot_cache:\n  peer_token_file: /t\n"+
		"  peers_discover: {dns: _admin._tcp.moxi.svc, srv: true, interval: 5s, remove_after: 0s, resolver: \"10.96.0.10:53\"}\n")
	srcs["warm and shadow"] = mustParse(t, "pools:\n  new: {embedded: 1, warm_from: old, shadow: {pool: sandbox, fraction: 0.01}}\n"+
		"  old: {embedded: 1, shadow: {pool: sandbox, fraction: 1}}\n  sandbox: {embedded: 1, shadow: {pool: \"\", fraction: 0}}\ndefault_pool: new\n")
	for name, c := range srcs {
		t.Run(name, func(t *testing.T) {
			b, err := c.YAML()
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse(b, "effective.yaml")
			if err != nil {
				t.Fatalf("Parse(YAML()): %v\n%s", err, b)
			}
			equal(t, withoutLines(back), withoutLines(c))
		})
	}
}

func TestPoolLookup(t *testing.T) {
	c := contractConfig()
	if p := c.Pool("spare"); p == nil || p.Name != "spare" {
		t.Errorf("Pool(spare) = %+v", p)
	}
	if p := c.Pool("nope"); p != nil {
		t.Errorf("Pool(nope) = %+v, want nil", p)
	}
}

func TestLoadMissingFile(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "absent.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(absent) = %v, want a not-exist error", err)
	}
}

// BenchmarkParse measures a reload's parsing cost on the reference example.
func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile("testdata/contract.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data, "contract.yaml"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestWarnings: an apply_at far in the past or more than a year away is worth a word from
// --check; one within those bounds, or none, is not.
func TestWarnings(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		at   time.Time
		want string
	}{
		{time.Time{}, ""},
		{now.Add(time.Hour), ""},
		{now.Add(-time.Hour), ""},
		{time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), "apply_at 2000-01-01T00:00:00Z is 26 years in the past: a load puts this file in service at once; remove apply_at, or check the date"},
		{time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), "apply_at 9999-01-01T00:00:00Z is 7973 years away: until then a reload keeps the previous config in service; check the date"},
		{now.Add(-72 * time.Hour), "apply_at 2026-11-29T12:00:00Z is 3 days in the past: a load puts this file in service at once; remove apply_at, or check the date"},
	} {
		cfg := Default()
		cfg.ApplyAt = c.at
		got := strings.Join(cfg.Warnings(now), "\n")
		if got != c.want {
			t.Errorf("apply_at %v: %q, want %q", c.at, got, c.want)
		}
	}
}
