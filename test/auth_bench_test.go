package test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// BenchmarkAuthCPU is what client authentication costs once clients have logged in: the
// same load of gets and sets (8 clients, each waiting for every answer and sending 1,000
// requests a second; 100-byte values, one set per four requests) through four moxi
// processes in front of one memcached — "off" without auth, "control" the same again (the
// noise between two equal processes), "auth" with auth, "namespaces" with auth.namespaces
// too — taking turns of 2 s for 12 rounds, each first in a round as often as the others
// (the place in a round alone moved the figures by up to 8 %). The load is paced so that
// each moxi sees the same arrivals (a closed loop lets batching differ), and the CPU time
// is the nanoseconds the kernel counts per thread (schedstat), not 10 ms ticks. It reports
// the median CPU time per request of each, and the median over the rounds of each round's
// ratio: control's to off's (the noise), auth's and namespaces' to the mean of off's and
// control's. internal/frontend's BenchmarkAuthGuard times the work auth adds alone.
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
		{"control", startMoxiBin(b, bin, "--config", writeConfig(b, base))}, // off again: the noise between two equal processes
		{"auth", startMoxiBin(b, bin, "--config", writeConfig(b, base+fmt.Sprintf("auth: {users_file: %q}\n", users)))},
		{"namespaces", startMoxiBin(b, bin, "--config", writeConfig(b, base+fmt.Sprintf("auth: {users_file: %q, namespaces: true}\n", users)))},
	}
	value := strings.Repeat("v", 100)
	login := "set auth 0 0 12\r\nalice secret\r\n"
	for b.Loop() {
		perRequest := make(map[string][]float64) // µs of moxi's CPU per request, one per round
		ratios := make(map[string][]float64)
		for round := range 12 {
			for k := range targets {
				tg := targets[(round+k)%len(targets)] // each takes each place in a round in turn
				var requests atomic.Int64
				cpu0 := threadsCPU(b, tg.p.cmd.Process.Pid)
				withClients(b, tg.p.addr, 8, func(w int, c *textClient) {
					if tg.name != "off" && tg.name != "control" {
						if ans, err := c.call(login); err != nil || ans != "STORED" {
							b.Errorf("login: %q %v", ans, err)
							return
						}
					}
					tick := time.NewTicker(time.Millisecond)
					defer tick.Stop()
					n := 0
					for end := time.Now().Add(2 * time.Second); n < 10_000 && time.Now().Before(end); n++ {
						<-tick.C
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
				cpu := threadsCPU(b, tg.p.cmd.Process.Pid) - cpu0
				perRequest[tg.name] = append(perRequest[tg.name], float64(cpu.Nanoseconds())/1e3/float64(requests.Load()))
			}
			last := func(name string) float64 { return perRequest[name][len(perRequest[name])-1] }
			ratios["control"] = append(ratios["control"], last("control")/last("off"))
			base := (last("off") + last("control")) / 2 // two equal processes: half the noise
			for _, name := range []string{"auth", "namespaces"} {
				ratios[name] = append(ratios[name], last(name)/base)
			}
		}
		median := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
		b.ReportMetric(median(perRequest["off"]), "cpu-µs/req-off")
		for _, name := range []string{"control", "auth", "namespaces"} {
			b.ReportMetric(median(perRequest[name]), "cpu-µs/req-"+name)
			b.ReportMetric(median(ratios[name]), "ratio-"+name)
		}
	}
}

// threadsCPU is the CPU time the threads of process pid have had so far, in nanoseconds
// as the scheduler counts it (/proc/<pid>/task/*/schedstat): exact where the process's
// utime and stime move in 10 ms ticks. A thread that exits takes its time with it; a Go
// process keeps its threads.
func threadsCPU(b testing.TB, pid int) time.Duration {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		b.Fatalf("threads of %d: %v", pid, err)
	}
	var total time.Duration
	for _, path := range tasks {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // the thread ended
		}
		ns, _ := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
		total += time.Duration(ns)
	}
	return total
}
