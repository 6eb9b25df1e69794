package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkReplicaWrites compares the p99 of sets through moxi to a pool of three servers
// without replicas ("plain"), with replicas: 2 and write_quorum all and one, and with three
// zones of one server each and write_quorum one ("zones"), on the same servers (four pools
// routed by prefix): 8 clients, 1 s per pool, the pools taking
// turns for 6 rounds, each first in a round as often as the others; it reports each p99 over all rounds and its ratio to plain's, and the
// CPU time moxi and the memcached processes took per set. In "closed" each client sends a
// set as soon as the last is answered, a load that takes all of the host's two cores (a
// replicated write costs its servers twice the work, and the latency is then the share of
// the CPU each request gets); in "8k" the 8 clients send 8,000 sets a second, a loaded
// proxy with room left, and in "2k" 2,000.
//
// "floor-…" measures bench/fanout the same way, the least a proxy can do to write a set to
// one server (plain), two (all: answered after both, one: after the first) or three (zones:
// after the first): a goroutine
// and a connection to each server per client, nothing parsed but the line.
func BenchmarkReplicaWrites(b *testing.B) {
	for _, load := range []struct {
		name  string
		every time.Duration
	}{{"closed", 0}, {"8k", time.Second / 8000}, {"2k", time.Second / 2000}} {
		b.Run(load.name, func(b *testing.B) { replicaWrites(b, load.every, false) })
		b.Run("floor-"+load.name, func(b *testing.B) { replicaWrites(b, load.every, true) })
	}
}

// writeTarget is where one of the compared writes go: an address, a key prefix, and the
// process whose CPU time it costs.
type writeTarget struct {
	name, addr, prefix string
	pid                int
}

func replicaWrites(b *testing.B, every time.Duration, floor bool) {
	mcs := cluster(b, 3)
	var targets []writeTarget
	if floor {
		bin := filepath.Join(b.TempDir(), "fanout")
		if out, err := exec.Command("go", "build", "-o", bin, "../bench/fanout").CombinedOutput(); err != nil {
			b.Fatalf("building bench/fanout: %v\n%s", err, out)
		}
		for _, t := range []struct {
			name string
			args []string
		}{{"plain", []string{"-replicas", "1"}}, {"all", []string{"-replicas", "2"}}, {"one", []string{"-replicas", "2", "-quorum", "1"}},
			{"zones", []string{"-replicas", "3", "-quorum", "1"}}} {
			addr := freeAddr(b)
			p := launch(b, addr, bin, false, append([]string{"-listen", addr, "-servers", strings.Join(addrs(mcs), ",")}, t.args...))
			targets = append(targets, writeTarget{t.name, addr, "", p.cmd.Process.Pid})
		}
	} else {
		list := fmt.Sprintf("[%q, %q, %q]", mcs[0].Addr, mcs[1].Addr, mcs[2].Addr)
		moxi := startMoxiBin(b, fastMoxi(b), "--config", writeConfig(b, fmt.Sprintf(`watch_config: false
pools:
  plain: {servers: %[1]s}
  all: {servers: %[1]s, replicas: 2}
  one: {servers: %[1]s, replicas: 2, write_quorum: one}
  zones:
    write_quorum: one
    zones:
      - {name: a, servers: [%[2]q]}
      - {name: b, servers: [%[3]q]}
      - {name: c, servers: [%[4]q]}
default_pool: plain
routes:
  - {prefix: "all:", pool: all}
  - {prefix: "one:", pool: one}
  - {prefix: "zones:", pool: zones}
`, list, mcs[0].Addr, mcs[1].Addr, mcs[2].Addr)))
		for _, name := range []string{"plain", "all", "one", "zones"} {
			targets = append(targets, writeTarget{name, moxi.addr, name + ":", moxi.cmd.Process.Pid})
		}
	}
	memcachedCPU := func() (d time.Duration) {
		for _, mc := range mcs {
			d += cpuTime(b, mc.Pid())
		}
		return d
	}
	value := strings.Repeat("v", 100)
	for b.Loop() {
		lat := make(map[string][]time.Duration)
		proxyCPU, serversCPU := map[string]time.Duration{}, map[string]time.Duration{}
		for round := range 6 {
			for k := range targets {
				tg := targets[(round+k)%len(targets)] // each first in a round as often as the others
				p0, s0 := cpuTime(b, tg.pid), memcachedCPU()
				var mu sync.Mutex
				withClients(b, tg.addr, 8, func(w int, c *textClient) {
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
						if ans, err := c.set(tg.prefix+"k"+strconv.Itoa(i%10_000), value); err != nil || ans != "STORED" {
							b.Errorf("set: %q %v", ans, err)
							return
						}
						mu.Lock()
						lat[tg.name] = append(lat[tg.name], time.Since(start))
						mu.Unlock()
					}
				})
				proxyCPU[tg.name] += cpuTime(b, tg.pid) - p0
				serversCPU[tg.name] += memcachedCPU() - s0
			}
		}
		for _, tg := range targets {
			slices.Sort(lat[tg.name])
			n := float64(len(lat[tg.name]))
			b.ReportMetric(float64(proxyCPU[tg.name].Microseconds())/n, "proxy-cpu-µs/set-"+tg.name)
			b.ReportMetric(float64(serversCPU[tg.name].Microseconds())/n, "memcached-cpu-µs/set-"+tg.name)
		}
		plain := p99(lat["plain"])
		b.ReportMetric(float64(plain.Microseconds()), "p99-plain-µs")
		for _, name := range []string{"all", "one", "zones"} {
			b.ReportMetric(float64(p99(lat[name]).Microseconds()), "p99-"+name+"-µs")
			b.ReportMetric(float64(p99(lat[name]))/float64(plain), "p99-"+name+"-ratio")
		}
	}
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
