package test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// fill stores n keys prefix0… of size bytes straight into memcached, pipelined.
func fill(b testing.TB, addr, prefix string, n, size int) {
	b.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	value := strings.Repeat("x", size)
	for start := 0; start < n; start += 500 {
		var w strings.Builder
		end := min(start+500, n)
		for i := start; i < end; i++ {
			fmt.Fprintf(&w, "set %s%d 0 0 %d noreply\r\n%s\r\n", prefix, i, size, value)
		}
		w.WriteString("mn\r\n")
		if _, err := c.Write([]byte(w.String())); err != nil {
			b.Fatal(err)
		}
		if line, err := r.ReadString('\n'); err != nil || line != "MN\r\n" {
			b.Fatalf("fill: %q %v", line, err)
		}
	}
}

// waitMigrated polls /migrations until the one migration leaves "copying".
func waitMigrated(b *testing.B, admin string, limit time.Duration) migrationJSON {
	b.Helper()
	deadline := time.Now().Add(limit)
	for {
		ms := migrations(b, admin)
		if len(ms) == 1 && ms[0].Phase != "copying" {
			return ms[0]
		}
		if time.Now().After(deadline) {
			b.Fatalf("migration not done within %v: %+v", limit, ms)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkMigrationCopy measures the background copy, unlimited, for small and large
// values: keys/s and MB/s from moxi's start to phase done.
func BenchmarkMigrationCopy(b *testing.B) {
	for _, tc := range []struct {
		name        string
		keys, bytes int
	}{{"100B", 50000, 100}, {"10KB", 5000, 10 << 10}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				old, fresh := memcachedtest.Start(b, "-m", "1024"), memcachedtest.Start(b, "-m", "1024")
				fill(b, old.Addr, "c:", tc.keys, tc.bytes)
				if items := memcachedtest.Stats(b, old.Addr)["curr_items"]; items != strconv.Itoa(tc.keys) {
					b.Fatalf("filled %s of %d keys", items, tc.keys)
				}
				admin := freeAddr(b)
				conf := fmt.Sprintf("pools:\n  main:\n    servers:\n      - {name: s0, addr: %q, migrate_from: %q}\n", fresh.Addr, old.Addr)
				bin, path := fastMoxi(b), writeConfig(b, conf)
				start := time.Now()
				startMoxiBin(b, bin, "--config", path, "--admin", admin)
				m := waitMigrated(b, admin, 2*time.Minute)
				took := time.Since(start)
				// The crawler may list a key twice; what counts is that every key arrived.
				if items := memcachedtest.Stats(b, fresh.Addr)["curr_items"]; m.Phase != "done" || items != strconv.Itoa(tc.keys) {
					b.Fatalf("migration %s (%s): the new server holds %s of %d keys (listed %d, copied %d)", m.Phase, m.Error, items, tc.keys, m.KeysTotal, m.KeysCopied)
				}
				b.ReportMetric(float64(tc.keys)/took.Seconds(), "keys/s")
				b.ReportMetric(float64(tc.keys*tc.bytes)/took.Seconds()/1e6, "MB/s")
			}
		})
	}
}

// BenchmarkMigrationLiveP99 measures the p99 of live gets through moxi before a migration
// and while one copies at migrate_rate, and reports their ratio.
func BenchmarkMigrationLiveP99(b *testing.B) {
	for _, rate := range []int{5000, 20000} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) { migrationLiveP99(b, rate) })
	}
}

func migrationLiveP99(b *testing.B, rate int) {
	for b.Loop() {
		other, old, fresh := memcachedtest.Start(b), memcachedtest.Start(b, "-m", "1024"), memcachedtest.Start(b, "-m", "1024")
		fill(b, old.Addr, "p:", 100000, 100)
		conf := func(s1 string) string {
			return fmt.Sprintf("watch_config: false\npools:\n  main:\n    migrate_rate: %d\n    servers:\n      - {name: s0, addr: %q}\n      - %s\n", rate, other.Addr, s1)
		}
		path := writeConfig(b, conf(fmt.Sprintf("{name: s1, addr: %q}", old.Addr)))
		admin := freeAddr(b)
		moxi := startMoxiBin(b, fastMoxi(b), "--config", path, "--admin", admin)
		measure := func(d time.Duration) time.Duration {
			return p99(getLatencies(b, moxi.addr, d, func(i int) string { return "p:" + strconv.Itoa(i%100000) }))
		}
		before := measure(2 * time.Second)
		if err := os.WriteFile(path, []byte(conf(fmt.Sprintf("{name: s1, addr: %q, migrate_from: %q}", fresh.Addr, old.Addr))), 0o644); err != nil {
			b.Fatal(err)
		}
		if code, body := postReload(b, admin); code != http.StatusOK {
			b.Fatalf("reload: %d %s", code, body)
		}
		during := measure(2 * time.Second)
		if ms := migrations(b, admin); len(ms) != 1 || ms[0].Phase != "copying" {
			b.Fatalf("the copy did not last the measurement: %+v", ms)
		}
		b.ReportMetric(float64(before.Microseconds()), "p99-before-µs")
		b.ReportMetric(float64(during.Microseconds()), "p99-copying-µs")
		b.ReportMetric(float64(during)/float64(before), "p99-ratio")
	}
}

// BenchmarkReshard adds a fourth server to a pool of three holding 100,000 keys of 100
// bytes, migrate_rate 0: it reports the keys the background copy moved per second (from the
// reload to phase done), alone ("idle"), under 8 clients' gets sent as fast as they are
// answered ("live": a closed loop that takes all the host's CPU, so its latency is the share
// of it the proxy gets), and under the same 8 clients sending 16,000 gets a second
// ("live-16k": a loaded proxy with room left), with the p99 of those gets before and while
// it copies.
//
// "read-through" is the floor of the live p99 while keys move: the copy is held to 1 key/s,
// so a get of a key not yet moved (a quarter of them) misses on its new server and is read
// from its old one, two round trips, and the p99 over 2 s after the reload is theirs.
func BenchmarkReshard(b *testing.B) {
	b.Run("idle", func(b *testing.B) { reshardBench(b, 0, 0, 0) })
	b.Run("live", func(b *testing.B) { reshardBench(b, 8, 0, 0) })
	b.Run("live-16k", func(b *testing.B) { reshardBench(b, 8, time.Second/16_000, 0) })
	b.Run("read-through", func(b *testing.B) { reshardBench(b, 8, 0, 1) })
}

// reshardBench runs clients (0 or 8) paced by every (see timedGets) with the copy at rate.
func reshardBench(b *testing.B, clients int, every time.Duration, rate int) {
	for b.Loop() {
		var mcs []*memcachedtest.Server
		for range 4 {
			mcs = append(mcs, memcachedtest.Start(b, "-m", "1024"))
		}
		conf := func(n int) string {
			var w strings.Builder
			fmt.Fprintf(&w, "watch_config: false\npools:\n  main:\n    migrate_rate: %d\n    servers:\n", rate)
			for i := range n {
				fmt.Fprintf(&w, "      - {name: s%d, addr: %q}\n", i, mcs[i].Addr)
			}
			return w.String()
		}
		path, admin := writeConfig(b, conf(3)), freeAddr(b)
		moxi := startMoxiBin(b, fastMoxi(b), "--config", path, "--admin", admin)
		const keys = 100_000
		fill(b, moxi.addr, "r:", keys, 100)
		key := func(i int) string { return "r:" + strconv.Itoa(i%keys) }
		gets := func(stop <-chan struct{}) []time.Duration { return timedGets(b, moxi.addr, every, stop, key) }
		twoSeconds := func() <-chan struct{} {
			stop := make(chan struct{})
			time.AfterFunc(2*time.Second, func() { close(stop) })
			return stop
		}
		var before time.Duration
		if clients > 0 {
			before = p99(gets(twoSeconds()))
		}

		if err := os.WriteFile(path, []byte(conf(4)), 0o644); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if code, body := postReload(b, admin); code != http.StatusOK {
			b.Fatalf("reload: %d %s", code, body)
		}
		if rate > 0 {
			during := p99(gets(twoSeconds()))
			b.ReportMetric(float64(before.Microseconds()), "p99-before-µs")
			b.ReportMetric(float64(during.Microseconds()), "p99-reading-through-µs")
			b.ReportMetric(float64(during)/float64(before), "p99-ratio")
			continue
		}
		var m migrationJSON
		var took time.Duration
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for ; ; <-tick.C {
				for _, ms := range migrations(b, admin) {
					if ms.Name == "reshard-1" && ms.Phase != "copying" && ms.Phase != "scheduled" {
						m, took = ms, time.Since(start)
						return
					}
				}
			}
		}()
		// Gets until the copy is done.
		var lat []time.Duration
		if clients > 0 {
			lat = gets(finished)
		}
		<-finished
		if m.Phase != "done" {
			b.Fatalf("reshard %s: %+v", m.Phase, m)
		}
		b.ReportMetric(float64(m.KeysCopied)/took.Seconds(), "moved-keys/s")
		b.ReportMetric(float64(m.KeysCopied), "moved-keys")
		if clients == 0 {
			continue
		}
		during := p99(lat)
		b.ReportMetric(float64(before.Microseconds()), "p99-before-µs")
		b.ReportMetric(float64(during.Microseconds()), "p99-copying-µs")
		b.ReportMetric(float64(during)/float64(before), "p99-ratio")
	}
}
