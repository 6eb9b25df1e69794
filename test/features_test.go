package test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// slowPool is a moxi config whose one server sits behind a link of the given delay each way.
func slowPool(server string, extra string) string {
	return fmt.Sprintf("pools:\n  main:\n    timeout: 3s\n    servers: [%s]\n%s", server, extra)
}

func cmdGets(t *testing.T, addr string) int {
	t.Helper()
	n, err := strconv.Atoi(memcachedtest.Stats(t, addr)["cmd_get"])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// concurrentGets sends get of keys[i] on its own connection, all at once, and returns the
// answers.
func concurrentGets(t *testing.T, addr string, keys []string) []string {
	t.Helper()
	clients := make([]*textClient, len(keys))
	for i := range clients {
		c, err := dialText(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	answers := make([]string, len(keys))
	var ready, done sync.WaitGroup
	gate := make(chan struct{})
	for i, c := range clients {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-gate
			v, err := c.get(keys[i])
			if err != nil {
				v = "error: " + err.Error()
			}
			answers[i] = v
		}()
	}
	ready.Wait()
	close(gate)
	done.Wait()
	return answers
}

// TestDedupThroughSlowLink: 200 concurrent gets of one key through a slow link are answered
// by a handful of backend gets, and everyone gets the value; gets of different keys are
// never merged.
func TestDedupThroughSlowLink(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	mc := memcachedtest.Start(t)
	// A 1 s round trip: gets of one key join the fetch of it in flight, and a new fetch
	// starts only once that one has come back, so each backend get beyond the first means
	// the burst was still reaching moxi a whole round trip later. More than the 10 allowed
	// below would take moxi over 10 s to read 200 requests, however loaded the machine;
	// without dedup there are 200.
	const oneWay = 500 * time.Millisecond
	link := startForwarder(t, mc.Addr, oneWay)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, slowPool(link.addr(), "dedup: true\n")), "--admin", admin)
	d, err := dialText(mc.Addr) // straight to memcached: the link is slow
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var keys []string
	for i := range 200 {
		k := "d:" + strconv.Itoa(i)
		keys = append(keys, k)
		if ans, err := d.set(k, "value-of-"+k); err != nil || ans != "STORED" {
			t.Fatalf("set %s: %q %v", k, ans, err)
		}
	}

	same := make([]string, 200)
	for i := range same {
		same[i] = "d:0"
	}
	const coalesced = "moxi_dedup_coalesced_total"
	before, joinedBefore := cmdGets(t, mc.Addr), metricValue(t, admin, coalesced)
	start := time.Now()
	for i, a := range concurrentGets(t, moxi.addr, same) {
		if a != "value-of-d:0" {
			t.Fatalf("client %d got %q", i, a)
		}
	}
	took := time.Since(start)
	backend := cmdGets(t, mc.Addr) - before
	joined := int(metricValue(t, admin, coalesced) - joinedBefore)
	t.Logf("200 concurrent gets of one key in %v through a %v round trip: %d backend gets, %d joined one in flight", took.Round(time.Millisecond), 2*oneWay, backend, joined)
	if backend+joined != 200 {
		t.Errorf("%d backend gets + %d coalesced for 200 gets; each get must be one or the other", backend, joined)
	}
	if backend > 10 {
		t.Errorf("200 concurrent gets of one key cost %d backend gets; want a handful (≤ 10)", backend)
	}

	before = cmdGets(t, mc.Addr)
	for i, a := range concurrentGets(t, moxi.addr, keys) {
		if a != "value-of-"+keys[i] {
			t.Fatalf("get %s got %q: gets of different keys were merged", keys[i], a)
		}
	}
	if n := cmdGets(t, mc.Addr) - before; n != 200 {
		t.Errorf("200 gets of different keys cost %d backend gets; want 200", n)
	}
}

// TestHotCache: reads of a hot key cost at most one backend fetch per TTL (a get, and the
// "mg <key> t" that asks when its item expires: two gets as memcached counts); a write through
// moxi is seen by the very next read; a write behind moxi's back within the TTL (checked
// with a margin for a loaded machine, ×4 + 1 s, and the measured figure logged).
func TestHotCache(t *testing.T) {
	mc := memcachedtest.Start(t)
	const ttl = time.Second
	moxi := startMoxi(t, "--config", writeConfig(t, slowPool(mc.Addr,
		fmt.Sprintf("hot_cache:\n  prefixes: [\"hot:\"]\n  max_items: 100\n  ttl: %v\n", ttl))))
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ans, err := c.set("hot:k", "v1"); err != nil || ans != "STORED" {
		t.Fatalf("set: %q %v", ans, err)
	}
	before := cmdGets(t, mc.Addr)
	start := time.Now()
	for i := range 1000 {
		if v, err := c.get("hot:k"); err != nil || v != "v1" {
			t.Fatalf("read %d: %q %v", i, v, err)
		}
	}
	elapsed := time.Since(start)
	backend := cmdGets(t, mc.Addr) - before
	// A cached answer lives one TTL from its fetch, so fetches are at least a TTL apart;
	// each is a get and its expiry's ask.
	allowed := 2 * (1 + int(elapsed/ttl))
	t.Logf("1000 reads of a hot key in %v: %d backend gets (≤ %d allowed, a fetch per TTL)", elapsed.Round(time.Millisecond), backend, allowed)
	if backend > allowed {
		t.Errorf("1000 reads in %v (TTL %v) cost %d backend gets; want ≤ %d", elapsed, ttl, backend, allowed)
	}

	if ans, err := c.set("hot:k", "v2"); err != nil || ans != "STORED" {
		t.Fatalf("set: %q %v", ans, err)
	}
	if v, err := c.get("hot:k"); err != nil || v != "v2" {
		t.Fatalf("the read right after a write through moxi got %q %v; want v2", v, err)
	}

	d, err := dialText(mc.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if ans, err := d.set("hot:k", "v3"); err != nil || ans != "STORED" {
		t.Fatalf("direct set: %q %v", ans, err)
	}
	written := time.Now()
	seen := waitUntil(t, written, 20*time.Second, func() bool { v, err := c.get("hot:k"); return err == nil && v == "v3" })
	bound := 4*ttl + time.Second
	t.Logf("a write behind moxi's back seen after %v (ttl %v, checked ≤ %v)", seen.Round(time.Millisecond), ttl, bound)
	if seen > bound {
		t.Errorf("a write behind moxi's back took %v to be seen; want within the TTL %v (checked ≤ %v)", seen, ttl, bound)
	}
}

// TestFireAndForgetThroughSlowLink: through a 200 ms link, fire-and-forget sets are answered
// without waiting for the round trip while ordinary sets take it; 10,000 queued sets all
// land; and sets still queued at SIGTERM are written before moxi exits.
func TestFireAndForgetThroughSlowLink(t *testing.T) {
	mc := memcachedtest.Start(t)
	const rtt = 200 * time.Millisecond
	link := startForwarder(t, mc.Addr, rtt/2)
	conf := writeConfig(t, slowPool(link.addr(), "fire_and_forget:\n  prefixes: [\"ff:\"]\n  max_pending: 10000\n"))
	moxi := startMoxiBin(t, fastMoxi(t), "--config", conf)
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	start := time.Now()
	if ans, err := c.set("plain:1", "v"); err != nil || ans != "STORED" {
		t.Fatalf("ordinary set: %q %v", ans, err)
	}
	ordinary := time.Since(start)

	const n = 10000
	lat := make([]time.Duration, n)
	for i := range n {
		start := time.Now()
		if ans, err := c.set("ff:"+strconv.Itoa(i), strconv.Itoa(i)); err != nil || ans != "STORED" {
			t.Fatalf("fire-and-forget set %d: %q %v", i, ans, err)
		}
		lat[i] = time.Since(start)
	}
	slices.Sort(lat)
	p99 := lat[n*99/100]
	t.Logf("ordinary set %v; fire-and-forget sets p50 %v p99 %v max %v", ordinary.Round(time.Millisecond), lat[n/2], p99, lat[n-1])
	if ordinary < rtt {
		t.Errorf("an ordinary set took %v through a %v round trip", ordinary, rtt)
	}
	// Answered at once, they take loopback time (well under 1 ms when the machine is
	// idle); a set that waited for the link would take the whole round trip, so fewer than
	// 1 % of them may (a loaded machine's slowest).
	if p99 >= rtt {
		t.Errorf("fire-and-forget p99 %v; want under the %v round trip", p99, rtt)
	}
	landed := waitUntil(t, start, 60*time.Second, func() bool { return allStored(mc.Addr, "ff:", 0, n) })
	t.Logf("all %d queued sets landed %v after the first was queued", n, landed.Round(time.Millisecond))

	// Queue more, then SIGTERM at once: none may be lost.
	for i := n; i < n+2000; i++ {
		if ans, err := c.set("ff:"+strconv.Itoa(i), strconv.Itoa(i)); err != nil || ans != "STORED" {
			t.Fatalf("fire-and-forget set %d: %q %v", i, ans, err)
		}
	}
	c.Close()
	moxi.stop(t)
	if !allStored(mc.Addr, "ff:", n, n+2000) {
		t.Fatal("sets queued at SIGTERM were lost")
	}
	if !strings.Contains(moxi.out.String(), "stopped") {
		t.Errorf("moxi did not stop cleanly:\n%s", moxi.out.String())
	}
}

// allStored reports whether memcached at addr holds prefix+i = i for every i in [from, to).
func allStored(addr, prefix string, from, to int) bool {
	d, err := dialText(addr)
	if err != nil {
		return false
	}
	defer d.Close()
	for i := from; i < to; i++ {
		v, err := d.get(prefix + strconv.Itoa(i))
		if err != nil || v != strconv.Itoa(i) {
			return false
		}
	}
	return true
}

// TestHotCacheItemExpiry: a hot cache entry is never served past its item's own expiry on
// the server, however long the hot cache's ttl: the item set with a 3 s expiry reads as a
// miss from 3 s on, through moxi as on memcached.
func TestHotCacheItemExpiry(t *testing.T) {
	t.Parallel() // mostly waits for the item to expire
	mc := memcachedtest.Start(t)
	moxi := startMoxi(t, "--config", writeConfig(t, slowPool(mc.Addr, "hot_cache:\n  prefixes: [\"hot:\"]\n  ttl: 60s\n")))
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ans, err := c.call("set hot:short 0 3 2\r\nv1\r\n"); err != nil || ans != "STORED" {
		t.Fatalf("set: %q %v", ans, err)
	}
	set := time.Now()
	served := 0
	for time.Since(set) < 6*time.Second {
		v, err := c.get("hot:short")
		if err != nil {
			t.Fatal(err)
		}
		if v != "" {
			served++
			if age := time.Since(set); age >= 3*time.Second {
				t.Fatalf("the item, set to expire after 3 s, was served %v after its set", age)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if served == 0 {
		t.Fatal("the item was never served")
	}
	if ans, err := c.set("hot:long", "v"); err != nil || ans != "STORED" {
		t.Fatalf("set: %q %v", ans, err)
	}
	for range 3 {
		if v, err := c.get("hot:long"); err != nil || v != "v" {
			t.Fatalf("an item without expiry: %q %v", v, err)
		}
	}
}
