package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDiff changes one thing (or a few) in the reference example and checks the exact
// lines.
func TestDiff(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
		want   []string
	}{
		{"nothing", func(c *Config) {}, nil},
		{"only file positions", func(c *Config) {
			for i := range c.Pools[0].Servers {
				c.Pools[0].Servers[i].Line += 7
			}
		}, nil},
		{"server added", func(c *Config) {
			c.Pools[1].Servers = append(c.Pools[1].Servers, Server{Addr: "127.0.0.1:11301", Weight: 1})
		}, []string{"pool spare: servers added: 127.0.0.1:11301"}},
		{"servers added and removed", func(c *Config) {
			c.Pools[0].Servers = append(c.Pools[0].Servers[1:],
				Server{Addr: "127.0.0.1:11215", Weight: 1}, Server{Name: "mc4", Addr: "127.0.0.1:11216", Weight: 1})
		}, []string{
			"pool main: servers added: 127.0.0.1:11215, mc4 (127.0.0.1:11216)",
			"pool main: servers removed: 127.0.0.1:11212",
		}},
		{"weight", func(c *Config) { c.Pools[0].Servers[1].Weight = 3 },
			[]string{"pool main: server 127.0.0.1:11213: weight 2 → 3"}},
		{"named server moves", func(c *Config) { c.Pools[0].Servers[2].Addr = "127.0.0.1:11220" },
			[]string{"pool main: server mc3 (127.0.0.1:11220): addr 127.0.0.1:11214 → 127.0.0.1:11220"}},
		{"migration finished", func(c *Config) { c.Pools[0].Servers[2].MigrateFrom = "" },
			[]string{`pool main: server mc3 (127.0.0.1:11214): migrate_from 127.0.0.1:11219 → ""`}},
		{"unnamed server moves: another ring name", func(c *Config) { c.Pools[0].Servers[0].Addr = "127.0.0.1:11222" },
			[]string{"pool main: servers added: 127.0.0.1:11222", "pool main: servers removed: 127.0.0.1:11212"}},
		{"name given to a server", func(c *Config) { c.Pools[0].Servers[0].Name = "mc1" },
			[]string{"pool main: servers added: mc1 (127.0.0.1:11212)", "pool main: servers removed: 127.0.0.1:11212"}},
		{"servers reordered", func(c *Config) {
			s := c.Pools[0].Servers
			s[0], s[1] = s[1], s[0]
		}, []string{"pool main: servers reordered: 127.0.0.1:11213, 127.0.0.1:11212, mc3 (127.0.0.1:11214)"}},
		{"pool settings", func(c *Config) {
			p := c.Pools[0]
			p.Timeout, p.Distribution, p.Hash, p.Failover, p.Backup, p.MigrateRate = 300*time.Millisecond, "jump", "fnv1a_64", false, "", 10
		}, []string{
			"pool main: distribution ketama → jump",
			"pool main: hash md5 → fnv1a_64",
			"pool main: timeout 250ms → 300ms",
			"pool main: failover true → false",
			`pool main: backup spare → ""`,
			"pool main: migrate_rate 0 → 10",
		}},
		{"warm_from and shadow", func(c *Config) {
			c.Pools[0].WarmFrom = "spare"
			c.Pools[1].Shadow = &Shadow{Pool: "main", Fraction: 0.1}
		}, []string{
			`pool main: warm_from "" → spare`,
			"pool spare: shadow off → main fraction 0.1",
		}},
		{"pool added and removed", func(c *Config) {
			c.Pools[1].Name = "sessions"
			c.Pools[0].Backup, c.Routes[0].Pool = "sessions", "sessions"
		}, []string{
			"pool main: backup spare → sessions",
			"pool sessions: added",
			"pool spare: removed",
			`routes: "sess:": pool spare → sessions`,
		}},
		{"routes added and removed", func(c *Config) {
			c.Routes = []Route{{Prefix: "s:", Pool: "spare"}, {Prefix: "", Pool: "main"}}
		}, []string{
			`routes: "s:" → spare added`,
			`routes: "" → main added`,
			`routes: "sess:" → spare removed`,
		}},
		{"top-level live settings", func(c *Config) {
			c.DefaultPool, c.Dedup, c.WatchConfig, c.ShutdownTimeout = "spare", false, false, 5*time.Second
			c.HotCache.TTL, c.HotCache.MaxItems, c.HotCache.Prefixes = time.Second, 10, []string{"cfg:"}
			c.FireAndForget.Prefixes = nil
		}, []string{
			"shutdown_timeout 10s → 5s",
			"watch_config true → false",
			"default_pool main → spare",
			"dedup true → false",
			`hot_cache.prefixes ["cfg:", "hot:"] → ["cfg:"]`,
			"hot_cache.max_items 100000 → 10",
			"hot_cache.ttl 2s → 1s",
			`fire_and_forget.prefixes ["log:", "sess:"] → []`,
		}},
		{"admin token and flush_all", func(c *Config) {
			c.AdminTokenFile, c.AdminToken, c.Limits.AllowFlushAll = "/etc/moxi/token", []byte("s3cret"), false
		}, []string{
			`admin_token_file "" → /etc/moxi/token`,
			"limits.allow_flush_all true → false",
		}},
		{"admin token rotated in the same file", func(c *Config) {
			c.AdminToken = []byte("new")
		}, []string{"admin_token_file: token changed"}},
		{"hot_keys turned on", func(c *Config) {
			c.HotKeys.Enabled, c.HotKeys.Top, c.HotKeys.Cache = true, 50, true
		}, []string{
			"hot_keys off → on",
			"hot_keys.top 20 → 50",
			"hot_keys.cache false → true",
		}},
		{"hot_keys turned off", func(c *Config) { c.HotKeys.Enabled = false }, nil}, // prev is off too: nothing
		{"peers and their token", func(c *Config) {
			c.HotCache.Peers, c.HotCache.PeerTokenFile, c.HotCache.PeerToken = []string{"10.0.0.2:9151"}, "/etc/moxi/peer-token", []byte("p33r")
		}, []string{
			`hot_cache.peers [] → ["10.0.0.2:9151"]`,
			`hot_cache.peer_token_file "" → /etc/moxi/peer-token`,
		}},
		{"peers found in DNS instead", func(c *Config) {
			c.HotCache.PeersDiscover = &Discover{DNS: "moxi.svc", Port: 9151, Interval: 10 * time.Second, RemoveAfter: time.Minute}
			c.HotCache.Peers = []string{"10.0.0.7:9151"} // what discovery found: not the file's
		}, []string{"hot_cache.peers_discover off → A/AAAA moxi.svc port 9151 every 10s remove_after 1m0s resolver \"\""}},
		{"restart-only settings", func(c *Config) {
			c.Listen, c.Admin = "127.0.0.1:11311", ""
			c.Limits = Limits{MaxConnections: 1, MaxKeyBytes: 2, MaxValueBytes: 3, MaxMultigetKeys: 4, AllowFlushAll: true,
				MaxBufferedBytes: 6, MaxConnectionBytes: 7, MaxBackgroundBytes: 8, RequestTimeout: time.Second, WriteTimeout: 2 * time.Second}
			c.FireAndForget.MaxPending, c.FireAndForget.MaxPendingBytes = 5, 9
		}, []string{
			"listen 127.0.0.1:11211 → 127.0.0.1:11311 (takes effect at the next restart)",
			`admin 127.0.0.1:9151 → "" (takes effect at the next restart)`,
			"limits.max_connections 10000 → 1 (takes effect at the next restart)",
			"limits.max_key_bytes 250 → 2 (takes effect at the next restart)",
			"limits.max_value_bytes 1048576 → 3 (takes effect at the next restart)",
			"limits.max_multiget_keys 10000 → 4 (takes effect at the next restart)",
			"limits.max_buffered_bytes 67108864 → 6 (takes effect at the next restart)",
			"limits.max_connection_bytes 4194304 → 7 (takes effect at the next restart)",
			"limits.max_background_bytes 67108864 → 8 (takes effect at the next restart)",
			"limits.request_timeout 30s → 1s (takes effect at the next restart)",
			"limits.write_timeout 30s → 2s (takes effect at the next restart)",
			"fire_and_forget.max_pending 10000 → 5 (takes effect at the next restart)",
			"fire_and_forget.max_pending_bytes 67108864 → 9 (takes effect at the next restart)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prev, next := contractConfig(), contractConfig()
			tt.change(next)
			got := Diff(prev, next)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Diff =\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(tt.want, "\n\t"))
			}
			if back := Diff(next, next); back != nil {
				t.Errorf("Diff(next, next) = %q, want nil", back)
			}
		})
	}
}

// TestDiffSince: restart-only settings are compared with the config the process started
// with, the others with the one in service.
func TestDiffSince(t *testing.T) {
	started := contractConfig()
	prev := contractConfig() // in service after a reload that moved listen
	prev.Listen, prev.Dedup = "127.0.0.1:11311", false
	tests := []struct {
		name   string
		change func(c *Config)
		want   []string
	}{
		{"still waiting for a restart", func(c *Config) {},
			[]string{"listen 127.0.0.1:11211 → 127.0.0.1:11311 (takes effect at the next restart)"}},
		{"changed back", func(c *Config) { c.Listen = started.Listen }, nil},
		{"live settings against prev", func(c *Config) { c.Listen, c.Dedup = started.Listen, true },
			[]string{"dedup false → true"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := contractConfig()
			next.Listen, next.Dedup = prev.Listen, prev.Dedup
			tt.change(next)
			if got := DiffSince(started, prev, next); !slices.Equal(got, tt.want) {
				t.Errorf("DiffSince = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestDiffHotKeys: every hot_keys setting, and a rotated peer token, is a live change
// (no restart note), and the token itself is never in a line.
func TestDiffHotKeys(t *testing.T) {
	on := func(c *Config) *Config {
		c.HotKeys.Enabled = true
		c.HotCache.Peers, c.HotCache.PeerTokenFile, c.HotCache.PeerToken = []string{"10.0.0.2:9151"}, "/t", []byte("old-token")
		return c
	}
	prev, next := on(contractConfig()), on(contractConfig())
	next.HotKeys = HotKeys{Enabled: true, Top: 5, Sample: 0.5, Window: time.Minute, MinShare: 0.2, Cache: true}
	next.HotCache.PeerToken = []byte("new-token")
	want := []string{
		"hot_cache.peer_token_file: token changed",
		"hot_keys.top 20 → 5",
		"hot_keys.sample 0.01 → 0.5",
		"hot_keys.window 10s → 1m0s",
		"hot_keys.min_share 0.01 → 0.2",
		"hot_keys.cache false → true",
	}
	if got := Diff(prev, next); !slices.Equal(got, want) {
		t.Errorf("Diff =\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
	next = on(contractConfig())
	next.HotKeys.Enabled = false
	if got := Diff(prev, next); !slices.Equal(got, []string{"hot_keys on → off"}) {
		t.Errorf("hot_keys removed: Diff = %q", got)
	}
	parsed := func(src string) *Config {
		return mustParse(t, "pools:\n  p: {embedded: 1}\n"+src)
	}
	got := Diff(parsed("hot_keys: {window: 5s}\n"), parsed("hot_keys: {window: 6s, min_share: 0.02}\n"))
	if want := []string{"hot_keys.window 5s → 6s", "hot_keys.min_share 0.01 → 0.02"}; !slices.Equal(got, want) {
		t.Errorf("parsed: Diff = %q, want %q", got, want)
	}
	for _, line := range got {
		if strings.Contains(line, restartNote) {
			t.Errorf("%q: hot_keys changes live", line)
		}
	}
}

// TestDiffParsed: two files that differ in layout only have no differences.
func TestDiffParsed(t *testing.T) {
	a := mustParse(t, "pools:\n  p:\n    servers: [h:1, \"h:2:2 b\"]\n")
	b := mustParse(t, "# moved down\n\npools:\n  p:\n    servers:\n      - addr: h:1\n      - {name: b, addr: \"h:02\", weight: 2}\n    hash: md5\n")
	if d := Diff(a, b); d != nil {
		t.Errorf("Diff = %q, want nil", d)
	}
}
