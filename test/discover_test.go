package test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/dnstest"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// discoverConfig is a moxi config whose pool main follows name at resolver.
func discoverConfig(name, resolver string, port int, srv bool, removeAfter time.Duration) string {
	return fmt.Sprintf(`watch_config: false
pools:
  main:
    timeout: 2s
    discover: {dns: %q, port: %d, srv: %v, interval: 200ms, remove_after: %s, resolver: %q}
`, name, port, srv, removeAfter, resolver)
}

// waitServers waits until GET /servers names exactly want (sorted), and returns how long
// that took.
func waitServers(t *testing.T, admin string, want ...string) time.Duration {
	t.Helper()
	slices.Sort(want)
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for deadline := start.Add(20 * time.Second); ; <-tick.C {
		var got []string
		for name := range serverStates(t, admin) {
			got = append(got, name)
		}
		slices.Sort(got)
		if slices.Equal(got, want) {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("/servers lists %v, want %v", got, want)
		}
	}
}

// TestDiscoverA follows a name's A records through moxi: its servers at start, a server
// added (applied within interval + 1 s, and used), one removed only after remove_after, and
// a DNS server that answers NXDOMAIN or nothing, which changes nothing but is counted.
func TestDiscoverA(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	dns := dnstest.Start(t)
	_, port, _ := net.SplitHostPort(freeAddr(t))
	var mcs []*memcachedtest.Server
	for _, host := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		mcs = append(mcs, memcachedtest.StartAt(t, net.JoinHostPort(host, port)))
	}
	dns.SetIPs("mc.test", "127.0.0.2", "127.0.0.3")
	var p int
	fmt.Sscan(port, &p)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, discoverConfig("mc.test.", dns.Addr, p, false, 2*time.Second)), "--admin", admin)
	waitServers(t, admin, mcs[0].Addr, mcs[1].Addr)
	warm := make([]string, 300)
	for i := range warm {
		warm[i] = fmt.Sprintf("before:%d", i)
	}
	setKeys(t, moxi.addr, warm)

	dns.SetIPs("mc.test", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	// Applied within interval + 1 s: logged for the record, not asserted (a loaded machine
	// may be slower, and the test must not fail for it).
	t.Logf("a server added to the answers was in service after %s (interval 200ms)", waitServers(t, admin, mcs[0].Addr, mcs[1].Addr, mcs[2].Addr))
	// Warm: the keys written before are still hits, those that moved to the new server
	// read through from the one that held them.
	if missed := misses(t, moxi.addr, warm); missed > 0 {
		t.Errorf("%d of %d keys written before the server was added miss after", missed, len(warm))
	}
	keys := make([]string, 300)
	for i := range keys {
		keys[i] = fmt.Sprintf("disc:%d", i)
	}
	setKeys(t, moxi.addr, keys)
	if on := placement(t, mcs, keys); !slices.Contains(on, 2) {
		t.Error("no key was placed on the server DNS added")
	}

	dns.SetIPs("mc.test", "127.0.0.3", "127.0.0.4")
	removed := time.Now()
	waitServers(t, admin, mcs[1].Addr, mcs[2].Addr)
	if took := time.Since(removed); took < 2*time.Second {
		t.Errorf("a server missing from the answers was removed after %s, before remove_after (2s)", took)
	}
	if missed := misses(t, moxi.addr, append(warm, keys...)); missed > 0 {
		t.Errorf("%d keys miss after a server was removed", missed)
	}

	errorsNow := func() float64 {
		return metricSample(metricFamilies(t, admin), "moxi_discovery_errors_total", "pool", "main")
	}
	before := errorsNow()
	dns.SetIPs("mc.test")
	eventually(t, "NXDOMAIN counted", func() bool { return errorsNow() >= before+2 })
	dns.Silence(true)
	silent := errorsNow()
	eventually(t, "a silent DNS server counted", func() bool { return errorsNow() >= silent+1 })
	dns.Silence(false)
	waitServers(t, admin, mcs[1].Addr, mcs[2].Addr) // kept through both
	c, err := net.Dial("tcp", moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := roundTrip(t, c, bufio.NewReader(c), "get disc:1\r\n", "END"); len(got) == 0 {
		t.Error("no answer while DNS fails")
	}
}

// TestDiscoverSRV follows SRV records: ring names are the targets, and a target that comes
// back at a new address (a StatefulSet pod restarted) keeps its ring point — no key moves.
// moxi serves only once the name has answered: until then the client port is closed and
// /readyz answers 503.
func TestDiscoverSRV(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	dns := dnstest.Start(t)
	mcs := cluster(t, 3)
	records := func() []dnstest.SRV {
		var out []dnstest.SRV
		for i, mc := range mcs {
			_, port, _ := net.SplitHostPort(mc.Addr)
			var p uint16
			fmt.Sscan(port, &p)
			out = append(out, dnstest.SRV{Target: fmt.Sprintf("mc-%d.mc.test", i), Port: p, Weight: 1})
		}
		return out
	}
	dns.SetIPs("mc-0.mc.test", "127.0.0.1")
	dns.SetIPs("mc-1.mc.test", "127.0.0.1")
	dns.SetIPs("mc-2.mc.test", "127.0.0.1")
	dns.Silence(true) // at start: no answer yet

	admin := freeAddr(t)
	listen := freeAddr(t)
	cmd := startMoxiNoWait(t, listen, "--config", writeConfig(t, discoverConfig("_memcache._tcp.mc.test.", dns.Addr, 11211, true, time.Minute)), "--admin", admin)
	eventually(t, "/readyz 503 while discovery waits", func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	if c, err := net.Dial("tcp", listen); err == nil {
		c.Close()
		t.Error("the client port accepts before the DNS name answered")
	}
	dns.SetSRV("_memcache._tcp.mc.test", records()...)
	dns.Silence(false)
	if err := cmd.waitListening(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitServers(t, admin, "mc-0.mc.test", "mc-1.mc.test", "mc-2.mc.test")

	keys := make([]string, 300)
	for i := range keys {
		keys[i] = fmt.Sprintf("srv:%d", i)
	}
	setKeys(t, listen, keys)
	before := placement(t, mcs, keys)

	// mc-1 comes back empty at a new address: a new memcached, the SRV record's new port.
	mcs[1].Stop()
	mcs[1] = memcachedtest.Start(t)
	dns.SetSRV("_memcache._tcp.mc.test", records()...)
	eventually(t, "mc-1's new address applied", func() bool {
		c, err := net.Dial("tcp", listen)
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "set srv:probe 0 0 1\r\n1\r\n")
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line == "STORED\r\n" && strings.Contains(fmt.Sprint(serverStates(t, admin)), "mc-1.mc.test:up")
	})
	flushAll(t, mcs)
	setKeys(t, listen, keys)
	if after := placement(t, mcs, keys); !slices.Equal(after, before) {
		moved := 0
		for i := range before {
			if before[i] != after[i] {
				moved++
			}
		}
		t.Errorf("%d of %d keys moved when a target changed address", moved, len(keys))
	}
}

// misses counts the keys a get through addr misses.
func misses(t *testing.T, addr string, keys []string) int {
	t.Helper()
	tc, err := dialText(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	n := 0
	for _, k := range keys {
		v, err := tc.get(k)
		if err != nil {
			t.Fatal(err)
		}
		if v == "" {
			n++
		}
	}
	return n
}

// eventually polls cond until it holds, failing the test after a generous deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(20 * time.Second); !cond(); <-tick.C {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
	}
}
