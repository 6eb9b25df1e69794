package test

import (
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// The tests of this file check the failover rules (docs/operating.md): a key written to a stand-in while its
// server was dead never reads older afterwards, whether the server was only unreachable
// (its data kept), comes back and dies again, or flaps under load.

// setAll sets every key to value through c.
func setAll(t *testing.T, c *textClient, keys []string, value string) {
	t.Helper()
	for _, k := range keys {
		if ans, err := c.set(k, value); err != nil || ans != "STORED" {
			t.Fatalf("set %s %s: %q %v", k, value, ans, err)
		}
	}
}

// noneReads checks that no key reads old through c (a miss is fine); it returns the
// number of keys that read want.
func noneReads(t *testing.T, c *textClient, keys []string, old, want string) int {
	t.Helper()
	n := 0
	for _, k := range keys {
		v, err := c.get(k)
		if err != nil || strings.HasPrefix(v, "SERVER_ERROR") {
			t.Fatalf("get %s: %q %v", k, v, err)
		}
		if v == old {
			t.Errorf("get %s = %q: older than the acknowledged %q", k, v, want)
		}
		if v == want {
			n++
		}
	}
	return n
}

// waitServing waits until server s's keys are served by it again: a write lands there.
func waitServing(t *testing.T, moxi string, mc *memcachedtest.Server, key string) {
	t.Helper()
	waitUntil(t, time.Now(), 30*time.Second, func() bool { return landsOn(moxi, mc.Addr, key) })
}

// TestStandInAfterPause: 50 keys on s0; s0 paused (its data kept); the keys are written
// again, on the stand-ins; s0 resumes. Before s0 serves again the keys are deleted there
// and on the stand-ins, so none reads its value from before the pause.
func TestStandInAfterPause(t *testing.T) {
	mcs := cluster(t, 3)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, resilientConfig(true, addrs(mcs)...)), "--admin", admin)
	mine, _ := keysOf(0, 3, 50)
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	setAll(t, c, mine, "before")

	if err := mcs[0].Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, mcs[0].Addr)
	waitUntil(t, time.Now(), 30*time.Second, func() bool { // s0 marked dead: writes go to stand-ins
		ans, err := c.set(mine[0], "during")
		return err == nil && ans == "STORED"
	})
	setAll(t, c, mine, "during")
	if got := noneReads(t, c, mine, "before", "during"); got != len(mine) {
		t.Errorf("%d of %d keys read the value written to their stand-in; want all", got, len(mine))
	}
	if n := metricValue(t, admin, "moxi_failover_keys_remembered"); n != float64(len(mine)) {
		t.Errorf("moxi_failover_keys_remembered = %v, want %d", n, len(mine))
	}

	if err := mcs[0].Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Until s0 serves again every read is "during" or a miss; then, a miss.
	deadline := time.Now().Add(30 * time.Second)
	for metricValue(t, admin, "moxi_failover_keys_remembered") > 0 || !landsOn(moxi.addr, mcs[0].Addr, mine[0]) {
		noneReads(t, c, mine[1:], "before", "during")
		if time.Now().After(deadline) {
			t.Fatal("s0 does not serve again within 30 s of SIGCONT")
		}
	}
	if got := noneReads(t, c, mine[1:], "before", "during"); got != 0 {
		t.Errorf("%d keys still read their stand-in's value after s0 serves again; want misses", got)
	}
	if strings.Count(moxi.out.String(), "serves again after deleting") != 1 {
		t.Errorf("want one log line for the cleanup:\n%s", moxi.out.String())
	}
}

// TestStandInKillAgain: kill s0; v1 lands on the stand-ins; s0 restarts (empty); v2 lands
// on s0; s0 dies again. The stand-ins must not hand v1 back.
func TestStandInKillAgain(t *testing.T) {
	mcs := cluster(t, 3)
	moxi := startMoxi(t, "--config", writeConfig(t, resilientConfig(true, addrs(mcs)...)))
	mine, _ := keysOf(0, 3, 50)
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	mcs[0].Stop()
	waitUntil(t, time.Now(), 30*time.Second, func() bool {
		ans, err := c.set(mine[0], "v1")
		return err == nil && ans == "STORED"
	})
	setAll(t, c, mine, "v1")
	mcs[0].Restart(t)
	waitServing(t, moxi.addr, mcs[0], mine[0])
	setAll(t, c, mine, "v2")
	mcs[0].Stop()
	waitUntil(t, time.Now(), 30*time.Second, func() bool { // failed over again
		v, err := c.get(mine[0])
		return err == nil && !strings.HasPrefix(v, "SERVER_ERROR")
	})
	noneReads(t, c, mine, "v1", "v2")
}

// TestStandInFlapping: s0 is killed and restarted every 300 ms while writers store rising
// versions of keys on every server and readers check each read against the newest version
// acknowledged before it was sent: none may be older. Keys of the other servers never fail.
func TestStandInFlapping(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	mcs := cluster(t, 3)
	moxi := startMoxi(t, "--config", writeConfig(t, resilientConfig(true, addrs(mcs)...)))
	mine, _ := keysOf(0, 3, 20)
	staleUnderFault(t, moxi.addr, func(i int) {
		if i%2 == 0 {
			mcs[0].Stop()
		} else {
			mcs[0].Restart(t)
		}
	}, func() {
		mcs[0].Restart(t)
		waitServing(t, moxi.addr, mcs[0], mine[0])
	})
}

// TestStandInConnectionCuts: every connection to s0 is cut every 300 ms (s0 keeps its
// data), under the load of TestStandInFlapping: no read is older than acknowledged.
func TestStandInConnectionCuts(t *testing.T) {
	mcs := cluster(t, 3)
	fw := startForwarder(t, mcs[0].Addr, 0)
	servers := addrs(mcs)
	servers[0] = fw.addr()
	moxi := startMoxi(t, "--config", writeConfig(t, resilientConfig(true, servers...)))
	staleUnderFault(t, moxi.addr, func(int) { fw.cut() }, func() {})
}

// staleUnderFault runs 4 writers and 4 readers over keys of s0 and of the other two servers
// of moxi's pool while fault(i) is applied 12 times, 300 ms apart, then restore(), then
// some more load; it fails the test on any read older than acknowledged, or any error on
// the other servers' keys.
func staleUnderFault(t *testing.T, moxi string, fault func(i int), restore func()) {
	t.Helper()
	mine, others := keysOf(0, 3, 20)
	keys := append(append([]string(nil), mine...), others...)
	owner := owners(3)
	chk := newStaleCheck(keys)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	const writers, readers = 4, 4
	for w := range writers {
		wg.Add(1)
		go func() { defer wg.Done(); chk.write(t, moxi, w, writers, stop) }()
	}
	for range readers {
		wg.Add(1)
		go func() { defer wg.Done(); chk.read(t, moxi, stop) }()
	}
	schedule := time.NewTicker(300 * time.Millisecond) // the fault's schedule, about 4 s of it
	for i := 0; i < 12; i++ {
		<-schedule.C
		fault(i)
	}
	schedule.Stop()
	restore()
	after := chk.reads.Load() // some load with s0 serving again
	waitUntil(t, time.Now(), 30*time.Second, func() bool { return chk.reads.Load() >= after+200 })
	close(stop)
	wg.Wait()

	reads, stale, errs := chk.reads.Load(), chk.stale.Load(), 0
	for k, n := range chk.errorsByKey() {
		if owner(k) != 0 {
			t.Errorf("key %s of a server that never failed: %d errors", k, n)
		}
		errs += n
	}
	t.Logf("%d reads, %d stale, %d errors (all on s0's keys), %d acknowledged writes", reads, stale, errs, chk.acked.Load())
	if stale > 0 {
		t.Errorf("%d stale reads; want 0:\n%s", stale, strings.Join(chk.examples(), "\n"))
	}
	if reads < 100 || chk.acked.Load() < 100 {
		t.Errorf("only %d reads and %d acknowledged writes: the check saw too little", reads, chk.acked.Load())
	}
}
