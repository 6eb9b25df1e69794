package test

import (
	"bytes"
	"fmt"
	"os"
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
// 8,000 sets a second, a loaded proxy with room left, and in "2k" 2,000. It also reports the
// CPU time moxi and the memcached processes took per set, for each pool.
func BenchmarkReplicaWrites(b *testing.B) {
	b.Run("closed", func(b *testing.B) { replicaWrites(b, 0) })
	b.Run("8k", func(b *testing.B) { replicaWrites(b, time.Second/8000) })
	b.Run("2k", func(b *testing.B) { replicaWrites(b, time.Second/2000) })
}

// cpuTime is the CPU time (user and system) process pid has taken so far.
func cpuTime(b testing.TB, pid int) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command's closing parenthesis: utime and stime are the 12th and
	// 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
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
	memcachedCPU := func() (d time.Duration) {
		for _, mc := range mcs {
			d += cpuTime(b, mc.Pid())
		}
		return d
	}
	for b.Loop() {
		lat := make(map[string][]time.Duration)
		moxiCPU, serversCPU := map[string]time.Duration{}, map[string]time.Duration{}
		for range 5 {
			for _, pool := range pools {
				m0, s0 := cpuTime(b, moxi.cmd.Process.Pid), memcachedCPU()
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
				moxiCPU[pool] += cpuTime(b, moxi.cmd.Process.Pid) - m0
				serversCPU[pool] += memcachedCPU() - s0
			}
		}
		for _, pool := range pools {
			slices.Sort(lat[pool])
			n := float64(len(lat[pool]))
			b.ReportMetric(float64(moxiCPU[pool].Microseconds())/n, "moxi-cpu-µs/set-"+pool)
			b.ReportMetric(float64(serversCPU[pool].Microseconds())/n, "memcached-cpu-µs/set-"+pool)
		}
		plain := p99(lat["plain"])
		b.ReportMetric(float64(plain.Microseconds()), "p99-plain-µs")
		for _, pool := range pools[1:] {
			b.ReportMetric(float64(p99(lat[pool]).Microseconds()), "p99-"+pool+"-µs")
			b.ReportMetric(float64(p99(lat[pool]))/float64(plain), "p99-"+pool+"-ratio")
		}
	}
}
