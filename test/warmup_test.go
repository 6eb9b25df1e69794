package test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// warmKeys is how many keys the old pool holds: MOXI_WARMUP_KEYS (the figure is
// 100000), or 5000 for CI.
func warmKeys(t *testing.T) int {
	if s := os.Getenv("MOXI_WARMUP_KEYS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 100 {
			t.Fatalf("MOXI_WARMUP_KEYS=%q: want a number of keys ≥ 100", s)
		}
		return n
	}
	return 5000
}

// loadKeys stores value "v<i>" under "wk:<i>" for i < n through addr, pipelined.
func loadKeys(t *testing.T, addr string, n int) {
	t.Helper()
	c, r := dialConn(t, addr)
	defer c.Close()
	w := bufio.NewWriterSize(c, 64<<10)
	for i := range n {
		v := "v" + strconv.Itoa(i)
		fmt.Fprintf(w, "set wk:%d 0 0 %d noreply\r\n%s\r\n", i, len(v), v)
	}
	fmt.Fprintf(w, "get wk:%d\r\n", n-1)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("loading keys: %v", err)
		}
		if line == "END\r\n" {
			return
		}
		if strings.HasPrefix(line, "SERVER_ERROR") || strings.HasPrefix(line, "CLIENT_ERROR") {
			t.Fatalf("loading keys: %s", line)
		}
	}
}

// clusterGets sums the cmd_get of servers: the gets that reached them.
func clusterGets(t *testing.T, servers []*memcachedtest.Server) int64 {
	t.Helper()
	var sum int64
	for _, s := range servers {
		sum += int64(cmdGets(t, s.Addr))
	}
	return sum
}

// window is what the readers saw in one interval of a switch run.
type window struct {
	hits, misses, errs int64
	oldGets            int64 // gets that reached the old pool's servers
}

func (w window) ratio() float64 { return float64(w.hits) / float64(max(w.hits+w.misses+w.errs, 1)) }

// oldShare is the share of the zipf readers' gets that reached the old pool's servers: a
// share, since how many gets a window holds is the machine's (a loaded one ran 60 in one
// window and 170 in the next).
func (w window) oldShare() float64 {
	return float64(w.oldGets) / float64(max(w.hits+w.misses+w.errs, 1))
}

// switchRun loads n keys on an old pool, runs zipf-popular readers and staleCheck writers
// through one moxi, and reloads its routes to a new empty pool (with warm_from: old when
// warm) half-way. It returns the windows before and after the switch.
func switchRun(t *testing.T, n int, warm bool) (before window, after []window, sc *staleCheck) {
	oldC, newC := cluster(t, 2), cluster(t, 2)
	conf := func(def, warmFrom string) string {
		s := fmt.Sprintf("pools:\n  old:\n    timeout: 2s\n    servers: [%q, %q]\n  new:\n    timeout: 2s\n    servers: [%q, %q]\n",
			oldC[0].Addr, oldC[1].Addr, newC[0].Addr, newC[1].Addr)
		if warmFrom != "" {
			s += "    warm_from: " + warmFrom + "\n"
		}
		// POST /reload alone reloads: a watcher that saw the write first would leave
		// it "no changes" to report.
		return s + "default_pool: " + def + "\nwatch_config: false\n"
	}
	path, admin := writeConfig(t, conf("old", "")), freeAddr(t)
	moxi := startMoxi(t, "--config", path, "--admin", admin)
	loadKeys(t, moxi.addr, n)

	var hits, misses, errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tc, err := dialText(moxi.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer tc.Close()
			z := rand.NewZipf(rand.New(rand.NewPCG(uint64(w), 1)), 1.1, 1, uint64(n-1))
			for range maxOps {
				select {
				case <-stop:
					return
				default:
				}
				i := z.Uint64()
				v, err := tc.get("wk:" + strconv.FormatUint(i, 10))
				switch {
				case err != nil:
					t.Error(err)
					return
				case v == "":
					misses.Add(1)
				case v == "v"+strconv.FormatUint(i, 10):
					hits.Add(1)
				default:
					errs.Add(1)
				}
			}
		}()
	}
	staleKeys := make([]string, 200)
	for i := range staleKeys {
		staleKeys[i] = "sk:" + strconv.Itoa(i)
	}
	sc = newStaleCheck(staleKeys)
	for w := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); sc.write(t, moxi.addr, w, 2, stop) }()
	}
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); sc.read(t, moxi.addr, stop) }()
	}
	sample := func(d time.Duration) window {
		h, m, e, g := hits.Load(), misses.Load(), errs.Load(), clusterGets(t, oldC)
		<-time.After(d) // the load runs meanwhile: this is the measurement's interval
		return window{hits.Load() - h, misses.Load() - m, errs.Load() - e, clusterGets(t, oldC) - g}
	}
	sample(300 * time.Millisecond) // connections made, caches of the run warm
	before = sample(1500 * time.Millisecond)
	if err := os.WriteFile(path, []byte(conf("new", map[bool]string{true: "old"}[warm])), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := postReload(t, admin); code != 200 || !strings.Contains(body, "default_pool old → new") {
		t.Fatalf("reload: %d %s", code, body)
	}
	for range 6 {
		after = append(after, sample(500*time.Millisecond))
	}
	close(stop)
	wg.Wait()
	if warm {
		fams := metricFamilies(t, admin)
		if h := metricSample(fams, "moxi_warmup_reads_total", "pool", "new", "result", "hit"); h < 1 {
			t.Errorf("moxi_warmup_reads_total{pool=new,result=hit} = %v after a warm switch", h)
		}
		if m := metricSample(fams, "moxi_warmup_reads_total", "pool", "new", "result", "miss"); m < 0 {
			t.Error("moxi_warmup_reads_total{pool=new,result=miss} is missing")
		}
	}
	return before, after, sc
}

// TestWarmUpSwitch: routes switched by a reload to an empty pool that warms up from the old
// one keep the hit ratio clients see, the gets reaching the old pool fall as the new one
// fills, and no read is older than an acknowledged write. A cold switch is measured too.
func TestWarmUpSwitch(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	n := warmKeys(t)
	report := func(name string, before window, after []window) float64 {
		worst := 1.0
		var line strings.Builder
		for _, w := range after {
			worst = min(worst, w.ratio())
			fmt.Fprintf(&line, " %.4f/%d (%.4f)", w.ratio(), w.oldGets, w.oldShare())
		}
		t.Logf("%s switch, %d keys: hit ratio before %.4f (%d reads); after, per 500ms (ratio/gets reaching old (their share)):%s",
			name, n, before.ratio(), before.hits+before.misses+before.errs, line.String())
		return worst
	}

	before, after, sc := switchRun(t, n, true)
	worst := report("warm", before, after)
	if worst < 0.99*before.ratio() {
		t.Errorf("warm switch: hit ratio fell to %.4f, under 99%% of %.4f before", worst, before.ratio())
	}
	var errs int64
	for _, w := range after {
		errs += w.errs
	}
	if errs > 0 || before.errs > 0 {
		t.Errorf("warm switch: %d wrong answers", errs+before.errs)
	}
	if first, last := after[0].oldShare(), after[len(after)-1].oldShare(); last >= first {
		t.Errorf("the share of gets reaching the old pool did not fall: %.4f in the first window, %.4f in the last", first, last)
	}
	t.Logf("warm switch: %d reads checked, %d writes acknowledged, %d stale", sc.reads.Load(), sc.acked.Load(), sc.stale.Load())
	if sc.stale.Load() > 0 {
		t.Errorf("%d stale reads: %v", sc.stale.Load(), sc.examples())
	}
	if e := sc.errorsByKey(); len(e) > 0 {
		t.Errorf("write or read errors: %v", e)
	}

	coldBefore, coldAfter, _ := switchRun(t, n, false)
	coldWorst := report("cold", coldBefore, coldAfter)
	t.Logf("worst window after the switch: warm %.4f, cold %.4f", worst, coldWorst)
	if coldWorst >= worst {
		t.Errorf("the cold switch (worst %.4f) did as well as the warm one (%.4f): the comparison measures nothing", coldWorst, worst)
	}
}
