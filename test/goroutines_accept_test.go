//go:build accept

package test

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/dnstest"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestAcceptGoroutinesAfterReloads: 100 reloads that change the hot cache, the replicas, the
// routes and the servers (each a reshard), ending on the starting config with every
// reshard done, leave moxi with the goroutines it had before (within 5). Every topology
// builds a hot cache, stand-ins and reshard copies: whatever one of them starts must end
// with it.
func TestAcceptGoroutinesAfterReloads(t *testing.T) {
	t.Parallel() // mostly waits for reloads to settle: beside the other waiting checks
	mcs := cluster(t, 4)
	configs := [2]string{
		goroutinesConfig(mcs, 2, `["hot:"]`, "r:", 0, 1, 2),
		goroutinesConfig(mcs, 1, `["hot:", "cfg:"]`, "q:", 0, 1),
	}
	path := writeConfig(t, configs[0])
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", path, "--admin", admin)
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = fmt.Sprintf("hot:%d", i)
	}
	setKeys(t, moxi.addr, keys)
	if missed := misses(t, moxi.addr, keys); missed > 0 {
		t.Fatalf("%d of %d keys missed before the reloads", missed, len(keys))
	}
	before := settledGoroutines(t, admin, -1)
	const reloads = 100
	for i := 1; i <= reloads; i++ {
		reloadFile(t, path, admin, configs[i%2])
		if missed := misses(t, moxi.addr, keys[:10]); missed > 0 {
			t.Fatalf("reload %d: %d of 10 keys missed", i, missed)
		}
	}
	waitMigrationsDone(t, admin)
	after := settledGoroutines(t, admin, before)
	t.Logf("go_goroutines %d before %d reloads, %d after", before, reloads, after)
}

// goroutinesConfig is TestAcceptGoroutinesAfterReloads's config: pool main over the servers
// given, with replicas, a hot cache on prefixes, and a route of prefix to pool spare
// (mcs[3]).
func goroutinesConfig(mcs []*memcachedtest.Server, replicas int, prefixes, route string, servers ...int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "watch_config: false\nhot_cache: {prefixes: %s}\nroutes: [{prefix: %q, pool: spare}]\ndefault_pool: main\n", prefixes, route)
	fmt.Fprintf(&b, "pools:\n  spare: {servers: [%q]}\n  main:\n    timeout: 2s\n    replicas: %d\n    servers:\n", mcs[3].Addr, replicas)
	for _, i := range servers {
		fmt.Fprintf(&b, "      - {name: s%d, addr: %q}\n", i, mcs[i].Addr)
	}
	return b.String()
}

// TestAcceptGoroutinesAfterDiscovery: 100 changes of a discover pool's DNS answer (interval
// 100ms, remove_after 0s), a server added and removed again each time (each a reshard),
// ending on the starting answer with every reshard done, leave moxi with the goroutines it
// had before (within 5).
func TestAcceptGoroutinesAfterDiscovery(t *testing.T) {
	t.Parallel() // mostly waits for DNS answers: beside the other waiting checks
	dns := dnstest.Start(t)
	_, port, _ := net.SplitHostPort(freeAddr(t))
	var mcs []*memcachedtest.Server
	for _, host := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		mcs = append(mcs, memcachedtest.StartAt(t, net.JoinHostPort(host, port)))
	}
	var p int
	fmt.Sscan(port, &p)
	dns.SetIPs("mc.test", "127.0.0.2", "127.0.0.3")
	cfg := strings.Replace(discoverConfig("mc.test.", dns.Addr, p, false, 0), "interval: 200ms", "interval: 100ms", 1)
	cfg = strings.Replace(cfg, "watch_config: false\n", "watch_config: false\nhot_cache: {prefixes: [\"hot:\"]}\n", 1)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, cfg), "--admin", admin)
	waitServers(t, admin, mcs[0].Addr, mcs[1].Addr)
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = fmt.Sprintf("hot:%d", i)
	}
	setKeys(t, moxi.addr, keys)
	// Read once first: filling the hot cache asks each server for its items' expiry over a
	// meta connection, which it keeps; the count before includes them.
	if missed := misses(t, moxi.addr, keys); missed > 0 {
		t.Fatalf("%d of %d keys missed before the changes", missed, len(keys))
	}
	before := settledGoroutines(t, admin, -1)
	const changes = 100
	for i := 1; i <= changes; i++ {
		if i%2 == 1 {
			dns.SetIPs("mc.test", "127.0.0.2", "127.0.0.3", "127.0.0.4")
			waitServers(t, admin, mcs[0].Addr, mcs[1].Addr, mcs[2].Addr)
		} else {
			dns.SetIPs("mc.test", "127.0.0.2", "127.0.0.3")
			waitServers(t, admin, mcs[0].Addr, mcs[1].Addr)
		}
	}
	waitMigrationsDone(t, admin)
	if missed := misses(t, moxi.addr, keys); missed > 0 {
		t.Errorf("%d of %d keys missed after the changes", missed, len(keys))
	}
	after := settledGoroutines(t, admin, before)
	t.Logf("go_goroutines %d before %d DNS changes, %d after", before, changes, after)
}

// settledGoroutines is moxi's go_goroutines once it is within 5 of want (any value when
// want < 0, read twice 1 s apart alike); it fails the test if that takes over 60 s.
func settledGoroutines(t *testing.T, admin string, want int) int {
	t.Helper()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := -1
	for deadline := time.Now().Add(60 * time.Second); ; <-tick.C {
		n := int(metricValue(t, admin, "go_goroutines"))
		switch {
		case want < 0 && n == last:
			return n
		case want >= 0 && n <= want+5:
			return n
		case time.Now().After(deadline):
			t.Fatalf("go_goroutines %d, want ≤ %d (before, + 5)", n, want+5)
		}
		last = n
	}
}

// waitMigrationsDone waits until every entry of /migrations is done (a reshard that a later
// one replaced is no longer listed).
func waitMigrationsDone(t *testing.T, admin string) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(120 * time.Second); ; <-tick.C {
		ms := migrations(t, admin)
		running := slices.ContainsFunc(ms, func(m migrationJSON) bool { return m.Phase != "done" })
		if !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("migrations not done within 120s: %+v", ms)
		}
	}
}
