//go:build accept

package test

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestAcceptHotCacheBoundedInBytes: 400 distinct 1 MiB hot keys, each read a few times, leave
// moxi's peak RSS within rssBound: the hot cache holds at most max_bytes (64 MiB by
// default) of them, the least recently used going first, and still serves hits. The TTL
// outlasts the test, so that max_bytes alone bounds the cache.
func TestAcceptHotCacheBoundedInBytes(t *testing.T) {
	t.Parallel() // what it measures is moxi's own memory, whatever else runs
	const keys, reads, clients = 400, 3, 4
	mc := memcachedtest.Start(t, "-I", "2m", "-m", "1024")
	admin := freeAddr(t)
	moxi := startMoxiBin(t, fastMoxi(t), "--admin", admin, "--config", writeConfig(t,
		fmt.Sprintf("pools:\n  main:\n    servers: [%s]\nhot_cache:\n  prefixes: [\"hot:\"]\n  ttl: 1m\n", mc.Addr)))

	run := func(each func(nc net.Conn, r *bufio.Reader, key string) error) {
		withClients(t, moxi.addr, clients, func(w int, tc *textClient) {
			for i := w; i < keys; i += clients {
				if err := each(tc.c, tc.r, "hot:"+strconv.Itoa(i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	run(func(nc net.Conn, r *bufio.Reader, key string) error {
		if line, err := setBig(nc, r, key, 10*time.Second); err != nil || line != "STORED\r\n" {
			return fmt.Errorf("set %s: %q %v", key, line, err)
		}
		return nil
	})
	run(func(nc net.Conn, r *bufio.Reader, key string) error {
		for range reads {
			if ok, err := getBig(nc, r, key); !ok || err != nil {
				return fmt.Errorf("get %s: right value %v, %v", key, ok, err)
			}
		}
		return nil
	})
	peak := peakRSS(t, moxi.cmd.Process.Pid)
	hits := metricValue(t, admin, "moxi_hotcache_hits_total")
	t.Logf("%d hot keys of %d bytes set, then each read %d times: moxi's peak RSS %.0f MiB (bound %d MiB), %.0f hot cache hits",
		keys, bigValue, reads, peak, rssBound, hits)
	if peak > rssBound {
		t.Errorf("peak RSS %.0f MiB with hot_cache.max_bytes 64 MiB; want ≤ %d MiB", peak, rssBound)
	}
	if hits < keys { // each key's second and third reads, most of them
		t.Errorf("%.0f hot cache hits for %d keys read %d times each: the cache does not serve", hits, keys, reads)
	}
}
