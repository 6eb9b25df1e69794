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

// TestDedupThroughSlowLink: 200 concurrent gets of one key through a 50 ms link cost at most
// two backend gets, and everyone gets the value; gets of different keys are never merged.
func TestDedupThroughSlowLink(t *testing.T) {
	mc := memcachedtest.Start(t)
	link := startForwarder(t, mc.Addr, 25*time.Millisecond) // 50 ms round trip
	moxi := startMoxi(t, "--config", writeConfig(t, slowPool(link.addr(), "dedup: true\n")))
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var keys []string
	for i := range 200 {
		k := "d:" + strconv.Itoa(i)
		keys = append(keys, k)
		if ans, err := c.set(k, "value-of-"+k); err != nil || ans != "STORED" {
			t.Fatalf("set %s: %q %v", k, ans, err)
		}
	}

	same := make([]string, 200)
	for i := range same {
		same[i] = "d:0"
	}
	before := cmdGets(t, mc.Addr)
	for i, a := range concurrentGets(t, moxi.addr, same) {
		if a != "value-of-d:0" {
			t.Fatalf("client %d got %q", i, a)
		}
	}
	backend := cmdGets(t, mc.Addr) - before
	t.Logf("200 concurrent gets of one key: %d backend gets", backend)
	if backend > 2 {
		t.Errorf("200 concurrent gets of one key cost %d backend gets; want ≤ 2", backend)
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

// TestHotCache: reads of a hot key within one TTL cost at most one backend get; a write
// through moxi is seen by the very next read; a write behind moxi's back within the TTL.
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
	t.Logf("1000 reads of a hot key in %v: %d backend gets", elapsed.Round(time.Millisecond), backend)
	if elapsed < ttl && backend > 1 {
		t.Errorf("1000 reads within one TTL cost %d backend gets; want ≤ 1", backend)
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
	seen := waitUntil(t, written, 5*time.Second, func() bool { v, err := c.get("hot:k"); return err == nil && v == "v3" })
	t.Logf("a write behind moxi's back seen after %v (ttl %v)", seen.Round(time.Millisecond), ttl)
	if seen > ttl+100*time.Millisecond {
		t.Errorf("a write behind moxi's back took %v to be seen; want within the TTL %v", seen, ttl)
	}
}

// TestFireAndForgetThroughSlowLink: through a 200 ms link, fire-and-forget sets are answered
// at once while ordinary sets take the round trip; 10,000 queued sets all land; and sets
// still queued at SIGTERM are written before moxi exits.
func TestFireAndForgetThroughSlowLink(t *testing.T) {
	mc := memcachedtest.Start(t)
	link := startForwarder(t, mc.Addr, 100*time.Millisecond) // 200 ms round trip
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
	t.Logf("ordinary set %v; fire-and-forget sets p50 %v p99 %v", ordinary.Round(time.Millisecond), lat[n/2], p99)
	if ordinary < 200*time.Millisecond {
		t.Errorf("an ordinary set took %v through a 200 ms link", ordinary)
	}
	if p99 >= time.Millisecond {
		t.Errorf("fire-and-forget p99 %v; want under 1 ms", p99)
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
