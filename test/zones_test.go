package test

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// zoneNames are the zones of the tests' zoned pools, in listed order.
var zoneNames = []string{"a", "b", "c"}

// zonesConfig is a pool "main" of zones a, b, c… (servers[i] the i-th zone's), with extra
// pool settings, for a proxy in zone local.
func zonesConfig(local, extra string, servers ...[]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "zone: %s\npools:\n  main:\n", local)
	b.WriteString(extra)
	b.WriteString("    zones:\n")
	for z, list := range servers {
		fmt.Fprintf(&b, "      - name: %s\n        servers:\n", zoneNames[z])
		for i, s := range list {
			fmt.Fprintf(&b, "          - {name: %s%d, addr: %q}\n", zoneNames[z], i, s)
		}
	}
	return b.String()
}

// zoneCluster is 3 zones of 2 memcached each: [zone][server].
func zoneCluster(t *testing.T) [][]*memcachedtest.Server {
	all := cluster(t, 6)
	return [][]*memcachedtest.Server{all[0:2], all[2:4], all[4:6]}
}

// cmdGets is the cmd_get of each server of each zone.
func zoneCmdGets(t *testing.T, zones [][]*memcachedtest.Server) [][]int {
	out := make([][]int, len(zones))
	for z, mcs := range zones {
		for _, mc := range mcs {
			n, _ := strconv.Atoi(memcachedtest.Stats(t, mc.Addr)["cmd_get"])
			out[z] = append(out[z], n)
		}
	}
	return out
}

// zoneShare is the share of the gets between two cmdGets that zone z's servers answered.
func zoneShare(before, after [][]int, z int) (float64, int) {
	var mine, all int
	for zi := range after {
		for i := range after[zi] {
			d := after[zi][i] - before[zi][i]
			all += d
			if zi == z {
				mine += d
			}
		}
	}
	return float64(mine) / float64(max(all, 1)), all
}

// zonesRun is the zone figure at a scale: keys written and read through a proxy in
// zone b of three zones × two servers; reads stay in b; all of b killed costs no error and
// no miss; b restarted empty is rebuilt, and reads are local again.
func zonesRun(t *testing.T, keys int) {
	zones := zoneCluster(t)
	born := time.Now()
	var servers [][]string
	for _, mcs := range zones {
		servers = append(servers, addrs(mcs))
	}
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, zonesConfig("b", resilientSettings, servers...)), "--admin", admin)
	const local = 1 // b
	names := make([]string, keys)
	for i := range names {
		names[i] = "z:" + strconv.Itoa(i)
	}
	fill(t, moxi.addr, "z:", keys, 32)
	for z, mcs := range zones {
		held := 0
		for _, mc := range mcs {
			held += len(replicaValues(t, mc.Addr, names))
		}
		if held != keys {
			t.Errorf("zone %s holds %d of the %d keys", zoneNames[z], held, keys)
		}
	}

	readAll := func(what string) {
		t.Helper()
		got := replicaValues(t, moxi.addr, names)
		if len(got) != keys {
			t.Errorf("%s: %d of %d keys read through moxi", what, len(got), keys)
		}
	}
	before := zoneCmdGets(t, zones)
	readAll("all zones up")
	share, gets := zoneShare(before, zoneCmdGets(t, zones), local)
	t.Logf("all zones up: %.2f%% of %d gets answered in zone b", 100*share, gets)
	if share < 0.99 {
		t.Errorf("all zones up: %.2f%% of the gets answered in the local zone, want ≥ 99%%", 100*share)
	}

	// Zone b lost: reads and writes go on, without an error or a miss.
	for _, mc := range zones[local] {
		mc.Stop()
	}
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	errs, misses := 0, 0
	for i := range min(keys, 2000) {
		k := names[i]
		v := "w" + strconv.Itoa(i)
		if ans, err := c.set(k, v); err != nil || ans != "STORED" {
			errs++
			if errs <= 5 {
				t.Errorf("zone b down: set %s: %q %v", k, ans, err)
			}
		}
		switch got, err := c.get(k); {
		case err != nil || isErrorLine(got):
			errs++
		case got != v:
			misses++
			if misses <= 5 {
				t.Errorf("zone b down: get %s = %q, want %q", k, got, v)
			}
		}
	}
	if errs+misses > 0 {
		t.Errorf("zone b down: %d errors and %d misses; want none", errs, misses)
	}
	readAll("zone b down")

	// Zone b back, empty: rebuilt from the others, then local again.
	poll(30*time.Second, func() bool { return time.Since(born) > 2500*time.Millisecond }) // a start instant moves by whole seconds
	for _, mc := range zones[local] {
		mc.Restart(t)
	}
	for _, name := range []string{"rebuild-1", "rebuild-2"} {
		m := waitReshard(t, admin, name)
		t.Logf("%s: %d keys copied to %s from %s", name, m.KeysCopied, m.To, m.From)
	}
	held := 0
	for _, mc := range zones[local] {
		held += len(replicaValues(t, mc.Addr, names))
	}
	if held != keys {
		t.Errorf("zone b rebuilt holds %d of the %d keys", held, keys)
	}
	before = zoneCmdGets(t, zones)
	readAll("zone b rebuilt")
	share, gets = zoneShare(before, zoneCmdGets(t, zones), local)
	t.Logf("zone b rebuilt: %.2f%% of %d gets answered in zone b", 100*share, gets)
	if share < 0.99 {
		t.Errorf("zone b rebuilt: %.2f%% of the gets answered in the local zone, want ≥ 99%%", 100*share)
	}
	if t.Failed() {
		t.Logf("moxi log:\n%s", tail(moxi.out.String(), 8<<10))
	}
}

// resilientSettings are resilientConfig's pool settings: short timeouts and backoffs.
var resilientSettings = fmt.Sprintf("    timeout: %v\n    retries: %d\n    failure_limit: %d\n    dead_backoff: 100ms\n    dead_backoff_max: %v\n    connect_timeout: 250ms\n",
	testTimeout, testRetries, testFailureLimit, testBackoffMax)

// TestZones: 2,000 keys through a proxy in zone b of three (the 10,000: accept).
func TestZones(t *testing.T) { zonesRun(t, 2000) }

// TestZonesPausedZone: a zone paused for 5 s while writers update keys through the proxy:
// no read is ever older than acknowledged, nor fails, and once it resumes no server holds
// a key older than its last acknowledged write.
func TestZonesPausedZone(t *testing.T) {
	t.Parallel() // mostly waits out the pause: runs beside the other such tests
	zones := zoneCluster(t)
	var servers [][]string
	for _, mcs := range zones {
		servers = append(servers, addrs(mcs))
	}
	moxi := startMoxi(t, "--config", writeConfig(t, zonesConfig("b", resilientSettings, servers...)))
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = fmt.Sprintf("zp:%d", i)
	}
	chk := newStaleCheck(keys)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() { chk.write(t, moxi.addr, w, 4, stop) })
	}
	for range 4 {
		wg.Go(func() { chk.read(t, moxi.addr, stop) })
	}
	var stopped sync.Once
	halt := func() { stopped.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt)
	waitUntil(t, time.Now(), 30*time.Second, func() bool { return chk.acked.Load() >= 300 && chk.reads.Load() >= 300 })
	const paused = 1 // b: the local zone, where reads go first
	for _, mc := range zones[paused] {
		mc.Pause(t)
	}
	at := time.Now()
	waitUntil(t, at, 30*time.Second, func() bool { return time.Since(at) >= 5*time.Second })
	for _, mc := range zones[paused] {
		if err := mc.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	var resumedReads atomic.Int64
	resumedReads.Store(chk.reads.Load())
	acked := chk.acked.Load()
	waitUntil(t, time.Now(), 30*time.Second, func() bool {
		return chk.reads.Load() >= resumedReads.Load()+2000 && chk.acked.Load() >= acked+500
	})
	halt()
	errs := 0
	for _, n := range chk.errorsByKey() {
		errs += n
	}
	t.Logf("%d reads, %d stale, %d errors, %d acknowledged writes", chk.reads.Load(), chk.stale.Load(), errs, chk.acked.Load())
	if n := chk.stale.Load(); n > 0 {
		t.Errorf("%d reads older than acknowledged; want 0:\n%s", n, strings.Join(chk.examples(), "\n"))
	}
	if errs > 0 {
		t.Errorf("%d failed requests with a zone paused; want 0: %v", errs, chk.errorsByKey())
	}
	for z, mcs := range zones {
		for s, mc := range mcs {
			held := replicaValues(t, mc.Addr, keys)
			for _, k := range keys {
				if v, ok := held[k]; ok && versionIn(v) < chk.newest[k].Load() {
					t.Errorf("zone %s server %d holds %s = %s, older than its last acknowledged write %d", zoneNames[z], s, k, v, chk.newest[k].Load())
				}
			}
		}
	}
	if t.Failed() {
		t.Logf("moxi log:\n%s", tail(moxi.out.String(), 8<<10))
	}
}

// TestZonesMemccapable: libmemcached's conformance suite through a pool of three zones.
func TestZonesMemccapable(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	mcs := cluster(t, 3)
	as := addrs(mcs)
	moxi := startMoxi(t, "--config", writeConfig(t, zonesConfig("b", "    timeout: 2s\n", []string{as[0]}, []string{as[1]}, []string{as[2]})))
	passed, failed := runMemccapable(t, moxi.addr)
	t.Logf("memccapable through a pool of three zones: %d passed, %d failed", len(passed), len(failed))
	if len(failed) > 0 || len(passed) != 54 {
		t.Errorf("memccapable: %d/54 passed; failed: %s\nmoxi log:\n%s", len(passed), strings.Join(failed, ", "), tail(moxi.out.String(), 8<<10))
	}
}

// TestZonesReshard: a server added to one zone moves keys within that zone only, warm: the
// reshard's /migrations entry carries the zone, every key still hits, and the other zones'
// servers keep every key they held.
func TestZonesReshard(t *testing.T) {
	all := cluster(t, 4)
	as := addrs(all)
	admin := freeAddr(t)
	path := writeConfig(t, "watch_config: false\n"+zonesConfig("a", "", []string{as[0], as[1]}, []string{as[2]}))
	moxi := startMoxi(t, "--config", path, "--admin", admin)
	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = "zr:" + strconv.Itoa(i)
	}
	fill(t, moxi.addr, "zr:", len(keys), 16)
	onA := len(replicaValues(t, as[0], keys)) + len(replicaValues(t, as[1], keys))
	if err := os.WriteFile(path, []byte("watch_config: false\n"+zonesConfig("a", "", []string{as[0], as[1]}, []string{as[2], as[3]})), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := adminDo(t, "POST", "http://"+admin+"/reload", ""); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	m := waitReshard(t, admin, "b/reshard-1")
	t.Logf("b/reshard-1: %d keys moved from %s to %s", m.KeysCopied, m.From, m.To)
	if m.From != as[2] || m.To != as[3] || m.KeysCopied == 0 {
		t.Errorf("b/reshard-1 %+v; want keys moved from %s to %s", m, as[2], as[3])
	}
	for _, e := range migrations(t, admin) {
		if e.Name != "b/reshard-1" {
			t.Errorf("/migrations lists %s beside b/reshard-1: %+v", e.Name, e)
		}
	}
	if missed := misses(t, moxi.addr, keys); missed > 0 {
		t.Errorf("%d of %d keys miss after zone b resharded", missed, len(keys))
	}
	if now := len(replicaValues(t, as[0], keys)) + len(replicaValues(t, as[1], keys)); now != onA || onA != len(keys) {
		t.Errorf("zone a held %d keys before zone b resharded, %d after; want %d", onA, now, len(keys))
	}
	if b := len(replicaValues(t, as[2], keys)) + len(replicaValues(t, as[3], keys)); b != len(keys) {
		t.Errorf("zone b holds %d of the %d keys after its reshard", b, len(keys))
	}
}
