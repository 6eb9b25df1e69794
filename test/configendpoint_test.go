package test

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/discover"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// fakeEndpoint is an ElastiCache/Memorystore configuration endpoint: it answers "config get
// cluster" with the cluster it is set to, in the documented format, or with garbage.
type fakeEndpoint struct {
	addr string
	ln   net.Listener

	mu      sync.Mutex
	cluster discover.ClusterConfig
	garbled bool
	asked   atomic.Int64
}

func startEndpoint(t *testing.T) *fakeEndpoint {
	ln, err := net.Listen("tcp", freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeEndpoint{addr: ln.Addr().String(), ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { e.serve(c) })
		}
	})
	return e
}

func (e *fakeEndpoint) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if line != "config get cluster\r\n" {
			fmt.Fprint(c, "ERROR\r\n")
			continue
		}
		e.asked.Add(1)
		e.mu.Lock()
		answer := discover.AppendClusterConfig(nil, e.cluster)
		if e.garbled {
			answer = []byte("CONFIG cluster 0 5\r\nnot a cluster\r\nEND\r\n")
		}
		e.mu.Unlock()
		if _, err := c.Write(answer); err != nil {
			return
		}
	}
}

// set makes the endpoint answer version with nodes (host names mc-<i>.test at addrs[i]).
func (e *fakeEndpoint) set(version int64, addrs map[int]string) {
	c := discover.ClusterConfig{Version: version}
	for i := range 10 {
		if a, ok := addrs[i]; ok {
			host, port, _ := net.SplitHostPort(a)
			p, _ := strconv.Atoi(port)
			c.Nodes = append(c.Nodes, discover.ClusterNode{Host: fmt.Sprintf("mc-%d.test", i), IP: host, Port: p})
		}
	}
	e.mu.Lock()
	e.cluster, e.garbled = c, false
	e.mu.Unlock()
}

// TestDiscoverConfigEndpoint follows a fake configuration endpoint: its nodes at start, a
// node added and one removed (each applied within interval + 1 s, warm: every 500 ms
// window of reads hits as before, and no read is older than acknowledged), an older version
// ignored, and a refused or garbled answer, which keeps the list and is counted.
func TestDiscoverConfigEndpoint(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	_, port, _ := net.SplitHostPort(freeAddr(t))
	var mcs []*memcachedtest.Server
	for _, host := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		mcs = append(mcs, memcachedtest.StartAt(t, net.JoinHostPort(host, port)))
	}
	ep := startEndpoint(t)
	ep.set(1, map[int]string{0: mcs[0].Addr, 1: mcs[1].Addr})
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, fmt.Sprintf(`watch_config: false
pools:
  main:
    timeout: 2s
    discover: {config_endpoint: %q, interval: 200ms}
`, ep.addr)), "--admin", admin)
	waitServers(t, admin, "mc-0.test", "mc-1.test")

	// Readers of keys written before, by 500 ms window; writers and readers of versioned
	// keys for stale reads; both throughout the changes.
	warm := make([]string, 300)
	for i := range warm {
		warm[i] = "warm:" + strconv.Itoa(i)
	}
	setKeys(t, moxi.addr, warm)
	versioned := make([]string, 40)
	for i := range versioned {
		versioned[i] = "ver:" + strconv.Itoa(i)
	}
	chk := newStaleCheck(versioned)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var windows []string
	var worst atomic.Value
	worst.Store(1.0)
	wg.Go(func() {
		tc, err := dialText(moxi.addr)
		if err != nil {
			t.Error(err)
			return
		}
		defer tc.Close()
		hits, reads, start := 0, 0, time.Now()
		for i := 0; i < maxOps; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v, err := tc.get(warm[i%len(warm)])
			if err != nil {
				t.Error(err)
				return
			}
			reads++
			if v != "" {
				hits++
			}
			if time.Since(start) >= 500*time.Millisecond {
				ratio := float64(hits) / float64(reads)
				windows = append(windows, fmt.Sprintf("%.3f", ratio))
				if ratio < worst.Load().(float64) {
					worst.Store(ratio)
				}
				hits, reads, start = 0, 0, time.Now()
			}
		}
	})
	for w := range 2 {
		wg.Go(func() { chk.write(t, moxi.addr, w, 2, stop) })
	}
	for range 2 {
		wg.Go(func() { chk.read(t, moxi.addr, stop) })
	}
	var stopped sync.Once
	halt := func() { stopped.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt)

	ep.set(2, map[int]string{0: mcs[0].Addr, 1: mcs[1].Addr, 2: mcs[2].Addr})
	t.Logf("a node added at the endpoint was in service after %s (interval 200ms)", waitServers(t, admin, "mc-0.test", "mc-1.test", "mc-2.test"))
	// An older version (a lagging node of the endpoint) changes nothing.
	ep.set(1, map[int]string{0: mcs[0].Addr, 1: mcs[1].Addr})
	asked := ep.asked.Load()
	eventually(t, "three more answers", func() bool { return ep.asked.Load() >= asked+3 })
	waitServers(t, admin, "mc-0.test", "mc-1.test", "mc-2.test")

	ep.set(3, map[int]string{1: mcs[1].Addr, 2: mcs[2].Addr})
	t.Logf("a node removed at the endpoint was out of service after %s (at once: no remove_after)", waitServers(t, admin, "mc-1.test", "mc-2.test"))
	acked := chk.acked.Load()
	eventually(t, "more writes after the changes", func() bool { return chk.acked.Load() >= acked+200 })
	halt()
	t.Logf("hit ratio of keys written before, by 500 ms window: %s", strings.Join(windows, " "))
	if w := worst.Load().(float64); w < 0.99 {
		t.Errorf("a 500 ms window of reads hit %.3f of keys written before the changes; want ≥ 0.99", w)
	}
	if n := chk.stale.Load(); n > 0 {
		t.Errorf("%d reads older than acknowledged:\n%s", n, strings.Join(chk.examples(), "\n"))
	}

	errorsNow := func() float64 {
		return metricSample(metricFamilies(t, admin), "moxi_discovery_errors_total", "pool", "main")
	}
	before := errorsNow()
	ep.mu.Lock()
	ep.garbled = true
	ep.mu.Unlock()
	eventually(t, "a garbled answer counted", func() bool { return errorsNow() >= before+2 })
	ep.ln.Close() // refused from now on
	refused := errorsNow()
	eventually(t, "a refused connection counted", func() bool { return errorsNow() >= refused+2 })
	waitServers(t, admin, "mc-1.test", "mc-2.test") // kept through both
	if missed := misses(t, moxi.addr, warm); missed > 0 {
		t.Errorf("%d of %d keys written before miss after the changes", missed, len(warm))
	}
}

// TestZoneFromConfigEndpoint: a pool of two zones, a's servers listed, b's a cluster behind
// a configuration endpoint (one endpoint, one zone): b's nodes are named in it, reads stay
// in b, and a node added to b's cluster reshards zone b alone, warm.
func TestZoneFromConfigEndpoint(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	mcs := cluster(t, 3)
	ep := startEndpoint(t)
	ep.set(1, map[int]string{1: mcs[1].Addr})
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, fmt.Sprintf(`watch_config: false
zone: b
pools:
  main:
    timeout: 2s
    zones:
      - name: a
        servers: [{name: a0, addr: %q}]
      - name: b
        discover: {config_endpoint: %q, interval: 200ms}
`, mcs[0].Addr, ep.addr)), "--admin", admin)
	waitServers(t, admin, "a/a0", "b/mc-1.test")
	keys := make([]string, 500)
	for i := range keys {
		keys[i] = "ze:" + strconv.Itoa(i)
	}
	setKeys(t, moxi.addr, keys)
	for i, mc := range mcs[:2] {
		if n := len(replicaValues(t, mc.Addr, keys)); n != len(keys) {
			t.Errorf("server %d (zone %s) holds %d of the %d keys", i, zoneNames[i], n, len(keys))
		}
	}
	before := cmdGets(t, mcs[1].Addr)
	if missed := misses(t, moxi.addr, keys); missed > 0 {
		t.Errorf("%d keys miss", missed)
	}
	if got := cmdGets(t, mcs[1].Addr) - before; got < len(keys) {
		t.Errorf("zone b's server answered %d of %d reads; want every one (the local zone)", got, len(keys))
	}
	ep.set(2, map[int]string{1: mcs[1].Addr, 2: mcs[2].Addr})
	waitServers(t, admin, "a/a0", "b/mc-1.test", "b/mc-2.test")
	m := waitReshard(t, admin, "b/reshard-1")
	t.Logf("b/reshard-1: %d keys moved from %s to %s", m.KeysCopied, m.From, m.To)
	if missed := misses(t, moxi.addr, keys); missed > 0 {
		t.Errorf("%d keys miss after zone b's cluster grew", missed)
	}
	if n := len(replicaValues(t, mcs[0].Addr, keys)); n != len(keys) {
		t.Errorf("zone a holds %d of the %d keys after zone b resharded", n, len(keys))
	}
}
