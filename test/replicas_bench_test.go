package test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkReplicaWrites compares the p99 of sets through moxi to a pool of three servers
// without replicas ("plain"), and with replicas: 2 and write_quorum all and one, on the
// same servers (three pools routed by prefix): 8 clients, 1 s per pool, the pools taking
// turns for 5 rounds; it reports each p99 over all rounds and its ratio to plain's. In
// "closed" each client sends a set as soon as the last is answered, a load that takes all
// of the host's two cores (a replicated write costs its servers twice the work, and the
// latency is then the share of the CPU each request gets); in "8k" the 8 clients send
// 8,000 sets a second, a loaded proxy with room left.
func BenchmarkReplicaWrites(b *testing.B) {
	b.Run("closed", func(b *testing.B) { replicaWrites(b, 0) })
	b.Run("8k", func(b *testing.B) { replicaWrites(b, time.Second/8000) })
}

func replicaWrites(b *testing.B, every time.Duration) {
	mcs := cluster(b, 3)
	var servers strings.Builder
	for _, mc := range mcs {
		fmt.Fprintf(&servers, "%q, ", mc.Addr)
	}
	list := "[" + strings.TrimSuffix(servers.String(), ", ") + "]"
	conf := fmt.Sprintf(`watch_config: false
pools:
  plain: {servers: %[1]s}
  all: {servers: %[1]s, replicas: 2}
  one: {servers: %[1]s, replicas: 2, write_quorum: one}
default_pool: plain
routes:
  - {prefix: "all:", pool: all}
  - {prefix: "one:", pool: one}
`, list)
	moxi := startMoxiBin(b, fastMoxi(b), "--config", writeConfig(b, conf))
	value := strings.Repeat("v", 100)
	pools := []string{"plain", "all", "one"}
	for b.Loop() {
		lat := make(map[string][]time.Duration)
		for range 5 {
			for _, pool := range pools {
				var mu sync.Mutex
				withClients(b, moxi.addr, 8, func(w int, c *textClient) {
					end := time.Now().Add(time.Second)
					var tick <-chan time.Time
					if every > 0 {
						t := time.NewTicker(8 * every)
						defer t.Stop()
						tick = t.C
					}
					for i := w; i < 1_000_000 && time.Now().Before(end); i += 8 {
						if tick != nil {
							<-tick
						}
						start := time.Now()
						if ans, err := c.set(pool+":"+strconv.Itoa(i%10_000), value); err != nil || ans != "STORED" {
							b.Errorf("set: %q %v", ans, err)
							return
						}
						mu.Lock()
						lat[pool] = append(lat[pool], time.Since(start))
						mu.Unlock()
					}
				})
			}
		}
		for _, pool := range pools {
			slices.Sort(lat[pool])
		}
		plain := p99(lat["plain"])
		b.ReportMetric(float64(plain.Microseconds()), "p99-plain-µs")
		for _, pool := range pools[1:] {
			b.ReportMetric(float64(p99(lat[pool]).Microseconds()), "p99-"+pool+"-µs")
			b.ReportMetric(float64(p99(lat[pool]))/float64(plain), "p99-"+pool+"-ratio")
		}
	}
}
