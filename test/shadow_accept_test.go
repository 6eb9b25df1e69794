//go:build accept

package test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestAcceptShadowPoolDown: with the shadow pool paused (SIGSTOP) or killed, clients see the same
// errors (none) and about the same p99 as without a shadow, and moxi's memory stays bounded.
//
// The phases (no shadow; a shadow of 10 % of keys, the figure, onto a paused and
// onto a killed memcached; the same with every key shadowed, the worst case) take turns,
// switched by reload, for 20 short rounds in one run and in a rotating order, so that the
// machine's drift during the run falls on every phase alike; each phase's p99 is over all
// its rounds. (With 3 rounds of 1 s in a fixed order, identical phases differed by up to
// 20 % on a loaded machine; in 150 ms rounds, by a few %.)
func TestAcceptShadowPoolDown(t *testing.T) {
	mains, paused, killed := cluster(t, 2), memcachedtest.Start(t), memcachedtest.Start(t)
	killed.Stop()
	if err := paused.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, paused.Addr)
	type phase struct {
		name     string
		sandbox  string
		fraction float64
		lat      []time.Duration
		errs     int
	}
	phases := []*phase{{name: "no shadow"}, {name: "paused, 10% of keys", sandbox: "paused", fraction: 0.1},
		{name: "killed, 10% of keys", sandbox: "killed", fraction: 0.1}, {name: "paused, every key", sandbox: "paused", fraction: 1},
		{name: "killed, every key", sandbox: "killed", fraction: 1}}
	config := func(ph *phase) string {
		return shadowDownConfig(mains, paused.Addr, killed.Addr, ph.sandbox, ph.fraction)
	}
	path, admin := writeConfig(t, config(phases[0])), freeAddr(t)
	moxi := startMoxiBin(t, fastMoxi(t), "--config", path, "--admin", admin)
	pid := moxi.cmd.Process.Pid

	latencyRun(t, moxi.addr, 300*time.Millisecond) // connections and caches warm
	baseRSS := procStatus(t, pid, "VmRSS")
	const rounds, run = 20, 150 * time.Millisecond
	for r := range rounds {
		for i := range phases {
			ph := phases[(r+i)%len(phases)] // each round starts elsewhere: no phase always follows the same one
			if err := os.WriteFile(path, []byte(config(ph)), 0o644); err != nil {
				t.Fatal(err)
			}
			if code, body := postReload(t, admin); code != 200 {
				t.Fatalf("reload to %s: %d %s", ph.name, code, body)
			}
			latencyRun(t, moxi.addr, 50*time.Millisecond) // the reload settles
			lat, errs := latencyRun(t, moxi.addr, run)
			ph.lat, ph.errs = append(ph.lat, lat...), ph.errs+errs
		}
	}
	hwm := procStatus(t, pid, "VmHWM")

	p99 := func(ph *phase) time.Duration {
		slices.Sort(ph.lat)
		return ph.lat[len(ph.lat)*99/100]
	}
	base := p99(phases[0])
	for _, ph := range phases {
		d := p99(ph)
		t.Logf("%-20s p99 %v (ratio %.2f to no shadow), %d errors, %d requests", ph.name, d, float64(d)/float64(base), ph.errs, len(ph.lat))
		if ph.errs > 0 {
			t.Errorf("%s: %d client errors", ph.name, ph.errs)
		}
		// The speed figure (p99 ≤ 1.1× no shadow) is in the log, and in benchmarks. What
		// is checked is that clients do not wait for the shadow: were they to, every
		// shadowed request would take the paused pool's timeout (100ms), so at least the
		// shadowed share of them; half of it tells the two apart on a loaded machine.
		if slow := slowShare(ph.lat, 100*time.Millisecond); ph.fraction > 0 && slow >= ph.fraction/2 {
			t.Errorf("with the shadow pool %s, %.1f %% of requests took the shadow's timeout (100ms) or longer: clients wait for it", ph.name, 100*slow)
		}
	}
	fams := metricFamilies(t, admin)
	dropped := metricSample(fams, "moxi_shadow_requests_total", "pool", "main", "result", "dropped")
	failed := metricSample(fams, "moxi_shadow_requests_total", "pool", "main", "result", "error")
	t.Logf("shadow requests: %v dropped, %v failed; VmRSS %d kB before the phases, VmHWM %d kB after", dropped, failed, baseRSS, hwm)
	if dropped+failed < 1 {
		t.Errorf("shadow requests dropped %v, failed %v: want them to move with the shadow pool down", dropped, failed)
	}
	if grew := hwm - baseRSS; grew > 64<<10 {
		t.Errorf("moxi's peak memory grew by %d kB with the shadow pool down (bound: the 16 MB queue)", grew)
	}
}

// latencyRun runs 4 clients of mixed sets and gets for d and returns every request's
// latency and the count of error answers.
func latencyRun(t *testing.T, addr string, d time.Duration) (all []time.Duration, errs int) {
	var mu sync.Mutex
	deadline := time.Now().Add(d)
	withClients(t, addr, 4, func(w int, tc *textClient) {
		var mine []time.Duration
		bad := 0
		for i := 0; time.Now().Before(deadline); i++ {
			k := fmt.Sprintf("lk:%d:%d", w, i%2000)
			start := time.Now()
			var ans string
			var err error
			if i%4 == 0 {
				ans, err = tc.set(k, "value-"+strconv.Itoa(i))
			} else {
				ans, err = tc.get(k)
			}
			mine = append(mine, time.Since(start))
			if err != nil {
				t.Error(err)
				return
			}
			if strings.HasPrefix(ans, "SERVER_ERROR") || strings.HasPrefix(ans, "CLIENT_ERROR") || ans == "ERROR" {
				bad++
			}
		}
		mu.Lock()
		all, errs = append(all, mine...), errs+bad
		mu.Unlock()
	})
	if len(all) == 0 {
		t.Fatal("no requests made")
	}
	return all, errs
}

// shadowDownConfig is pool main over mains, shadowing fraction of its keys to pool
// sandbox (when fraction > 0), with pools paused and killed over the given addresses.
func shadowDownConfig(mains []*memcachedtest.Server, paused, killed, sandbox string, fraction float64) string {
	s := fmt.Sprintf("pools:\n  main:\n    timeout: 2s\n    servers: [%q, %q]\n", mains[0].Addr, mains[1].Addr)
	if fraction > 0 {
		s += fmt.Sprintf("    shadow: {pool: %s, fraction: %g}\n", sandbox, fraction)
	}
	for name, addr := range map[string]string{"paused": paused, "killed": killed} {
		s += fmt.Sprintf("  %s:\n    timeout: 100ms\n    retries: 0\n    servers: [%q]\n", name, addr)
	}
	return s + "default_pool: main\n"
}

// slowShare is the share of lat that took at least d.
func slowShare(lat []time.Duration, d time.Duration) float64 {
	n := 0
	for _, l := range lat {
		if l >= d {
			n++
		}
	}
	return float64(n) / float64(len(lat))
}
