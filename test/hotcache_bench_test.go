package test

import (
	"testing"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// BenchmarkHotCacheVsDirect compares gets of one key straight from memcached, through moxi
// to memcached, and through moxi as a hot-cache hit (served from its memory); sequential
// from one client, then from 16 clients at once.
func BenchmarkHotCacheVsDirect(b *testing.B) {
	mc := memcachedtest.Start(b)
	bin := fastMoxi(b)
	hot := startMoxiBin(b, bin, "--config", writeConfig(b,
		"pools:\n  main:\n    servers: ["+mc.Addr+"]\nhot_cache:\n  prefixes: [\"hot:\"]\n  ttl: 1h\n"))
	cold := startMoxiBin(b, bin, "--config", writeConfig(b, "pools:\n  main:\n    servers: ["+mc.Addr+"]\n"))
	const value = "0123456789012345678901234567890123456789"
	targets := []struct{ name, addr string }{{"direct-memcached", mc.Addr}, {"moxi-to-memcached", cold.addr}, {"moxi-hot-hit", hot.addr}}
	get := func(b *testing.B, c *textClient) {
		if v, err := c.get("hot:k"); err != nil || v != value {
			b.Fatalf("get: %q %v", v, err)
		}
	}
	for _, target := range targets {
		c, err := dialText(target.addr)
		if err != nil {
			b.Fatal(err)
		}
		if ans, err := c.set("hot:k", value); err != nil || ans != "STORED" {
			b.Fatalf("set: %q %v", ans, err)
		}
		b.Run("sequential/"+target.name, func(b *testing.B) {
			for b.Loop() {
				get(b, c)
			}
		})
		c.Close()
		b.Run("parallel16/"+target.name, func(b *testing.B) {
			b.SetParallelism(8) // × GOMAXPROCS 2 = 16 clients
			b.RunParallel(func(pb *testing.PB) {
				c, err := dialText(target.addr)
				if err != nil {
					b.Error(err)
					return
				}
				defer c.Close()
				for pb.Next() {
					get(b, c)
				}
			})
		})
	}
}
