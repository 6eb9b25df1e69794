package test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// BenchmarkAuthCPU is what client authentication costs once clients have logged in: the
// same load of gets and sets (8 clients, each waiting for every answer; 100-byte values,
// one set per four requests) through three moxi processes in front of one memcached — "off"
// without auth, "auth" with it, "namespaces" with auth.namespaces too — taking turns of
// 1 s for 7 rounds. It reports each one's median CPU time per request over the rounds and
// the ratios to off's.
func BenchmarkAuthCPU(b *testing.B) {
	mc := memcachedtest.Start(b)
	users := writeUsers(b, "alice:secret")
	bin := fastMoxi(b)
	base := fmt.Sprintf("watch_config: false\npools:\n  main:\n    servers: [%q]\n", mc.Addr)
	targets := []struct {
		name string
		p    *process
	}{
		{"off", startMoxiBin(b, bin, "--config", writeConfig(b, base))},
		{"auth", startMoxiBin(b, bin, "--config", writeConfig(b, base+fmt.Sprintf("auth: {users_file: %q}\n", users)))},
		{"namespaces", startMoxiBin(b, bin, "--config", writeConfig(b, base+fmt.Sprintf("auth: {users_file: %q, namespaces: true}\n", users)))},
	}
	value := strings.Repeat("v", 100)
	login := "set auth 0 0 12\r\nalice secret\r\n"
	for b.Loop() {
		perRequest := make(map[string][]float64) // µs of moxi's CPU per request, one per round
		for range 7 {
			for _, tg := range targets {
				var requests atomic.Int64
				cpu0 := cpuTime(b, tg.p.cmd.Process.Pid)
				withClients(b, tg.p.addr, 8, func(w int, c *textClient) {
					if tg.name != "off" {
						if ans, err := c.call(login); err != nil || ans != "STORED" {
							b.Errorf("login: %q %v", ans, err)
							return
						}
					}
					end := time.Now().Add(time.Second)
					n := 0
					for ; n < 1_000_000 && time.Now().Before(end); n++ {
						key := "k" + strconv.Itoa(w*1000+n%1000)
						if n%4 == 0 {
							if ans, err := c.set(key, value); err != nil || ans != "STORED" {
								b.Errorf("set: %q %v", ans, err)
								return
							}
						} else if _, err := c.get(key); err != nil {
							b.Errorf("get: %v", err)
							return
						}
					}
					requests.Add(int64(n))
				})
				cpu := cpuTime(b, tg.p.cmd.Process.Pid) - cpu0
				perRequest[tg.name] = append(perRequest[tg.name], float64(cpu.Nanoseconds())/1e3/float64(requests.Load()))
			}
		}
		median := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
		off := median(perRequest["off"])
		b.ReportMetric(off, "cpu-µs/req-off")
		for _, name := range []string{"auth", "namespaces"} {
			m := median(perRequest[name])
			b.ReportMetric(m, "cpu-µs/req-"+name)
			b.ReportMetric(m/off, "ratio-"+name)
		}
	}
}
