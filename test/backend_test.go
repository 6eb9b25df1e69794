package test

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

func TestMemccapableThroughMemcached(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d servers", n), func(t *testing.T) {
			mcs := cluster(t, n)
			moxi := startMoxi(t, "--config", writeConfig(t, poolConfig("", addrs(mcs)...)))
			passed, failed := runMemccapable(t, moxi.addr)
			t.Logf("memccapable through moxi and %d memcached: %d passed, %d failed", n, len(passed), len(failed))
			if len(failed) > 0 || len(passed) != 54 {
				t.Errorf("memccapable: %d/54 passed; failed: %s\nmoxi log:\n%s", len(passed), strings.Join(failed, ", "), moxi.out.String())
			}
		})
	}
}

func TestGomemcacheThroughMemcached(t *testing.T) {
	mcs := cluster(t, 3)
	moxi := startMoxi(t, "--config", writeConfig(t, poolConfig("", addrs(mcs)...)))
	exerciseGomemcache(t, moxi.addr)
}

// TestMultiGetOneBatchPerServer: a 100-key get of small values over 3 servers reaches each
// server as one batch of quiet gets ended by one noop, and each server counts exactly its
// share.
func TestMultiGetOneBatchPerServer(t *testing.T) {
	mcs := cluster(t, 3)
	fwd := make([]*forwarder, len(mcs))
	var servers []string
	for i, mc := range mcs {
		fwd[i] = startForwarder(t, mc.Addr, 0)
		servers = append(servers, fwd[i].addr()+":1 mc"+strconv.Itoa(i))
	}
	moxi := startMoxi(t, "--config", writeConfig(t, poolConfig("    connections: 1\n", servers...)))
	c, err := net.Dial("tcp", moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	var keys []string
	for i := range 100 {
		k := "batch:" + strconv.Itoa(i)
		keys = append(keys, k)
		roundTrip(t, c, r, fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", k, len(k), k), "STORED")
	}
	// A first multi-get teaches moxi the size of the values: until it knows, it answers a
	// multi-get in small parts, in case the values are large.
	roundTrip(t, c, r, "get "+strings.Join(keys, " ")+"\r\n", "END")
	before := make([]int, len(mcs))
	for i, mc := range mcs {
		before[i], _ = strconv.Atoi(memcachedtest.Stats(t, mc.Addr)["cmd_get"])
		fwd[i].reset()
	}

	lines := roundTrip(t, c, r, "get "+strings.Join(keys, " ")+"\r\n", "END")
	if len(lines) != 2*100+1 {
		t.Fatalf("get of 100 stored keys answered %d lines", len(lines))
	}
	for i := range 100 {
		if want := fmt.Sprintf("VALUE %s 0 %d", keys[i], len(keys[i])); lines[2*i] != want || lines[2*i+1] != keys[i] {
			t.Fatalf("answer %d: %q %q, want %q in request order", i, lines[2*i], lines[2*i+1], want)
		}
	}

	total := 0
	for i, mc := range mcs {
		after, _ := strconv.Atoi(memcachedtest.Stats(t, mc.Addr)["cmd_get"])
		share := after - before[i]
		total += share
		noops, quietGets := fwd[i].count(0x0a), fwd[i].count(0x09)+fwd[i].count(0x0d)
		t.Logf("server %d: %d keys, %d quiet gets, %d noops", i, share, quietGets, noops)
		if share > 1 && (noops != 1 || quietGets != int64(share)) {
			t.Errorf("server %d: %d keys came as %d quiet gets and %d noops; want one batch", i, share, quietGets, noops)
		}
	}
	if total != 100 {
		t.Errorf("servers counted %d gets for 100 keys", total)
	}
}
