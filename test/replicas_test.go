package test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/hashkit"
	"github.com/moxi-proxy/moxi/internal/ketama"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// The tests of this file check replicated pools (pools.<name>.replicas > 1): each key lives
// on the N distinct servers that follow it on the ring; writes go to every replica that is
// not away and are answered after the quorum; reads ask one replica and, on a miss or an
// error, the next. One replica dead or paused costs clients nothing, a resumed replica never
// serves a value older than an acknowledged write, and the replicas of a key agree.

// replicaConfig is resilientConfig (servers s0, s1, …, short failure settings, default
// failover) with replicas copies of each key, written with write_quorum: all and read from
// the first replica.
func replicaConfig(replicas int, addrs ...string) string {
	return strings.Replace(resilientConfig(true, addrs...), "  main:\n",
		fmt.Sprintf("  main:\n    replicas: %d\n    write_quorum: all\n    read_from: first\n", replicas), 1)
}

// replicaSets tells which of n servers named s0… hold a key in a pool of r replicas: the r
// distinct servers that follow the key on moxi's ring (md5, ketama), the owner first.
func replicaSets(n, r int) func(key string) []int {
	nodes := make([]ketama.Node, n)
	for i := range nodes {
		nodes[i] = ketama.Node{Name: fmt.Sprintf("s%d", i), Weight: 1}
	}
	ring := ketama.New(nodes)
	return func(key string) []int {
		var set []int
		ring.PickLive(hashkit.MD5([]byte(key)), func(node int) bool {
			if !slices.Contains(set, node) {
				set = append(set, node)
			}
			return len(set) == r
		})
		return set
	}
}

// replicaValues reads keys from the server (or moxi) at addr with pipelined multi-gets and
// returns the values found; a miss is absent from the map.
func replicaValues(t testing.TB, addr string, keys []string) map[string]string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	out := make(map[string]string, len(keys))
	for start := 0; start < len(keys); start += 200 {
		lines := roundTrip(t, c, r, "get "+strings.Join(keys[start:min(start+200, len(keys))], " ")+"\r\n", "END")
		if last := lines[len(lines)-1]; last != "END" {
			t.Fatalf("multi-get from %s: %q", addr, last)
		}
		for i := 0; i+1 < len(lines); i++ {
			if f := strings.Fields(lines[i]); len(f) == 4 && f[0] == "VALUE" {
				out[f[1]] = lines[i+1]
				i++
			}
		}
	}
	return out
}

// replicaGets is gets through tc: the value and its cas unique; "" for a miss, or the error
// line as the value.
func replicaGets(tc *textClient, key string) (string, uint64, error) {
	_ = tc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := tc.c.Write([]byte("gets " + key + "\r\n")); err != nil {
		return "", 0, err
	}
	line, err := tc.r.ReadString('\n')
	if err != nil {
		return "", 0, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "END" {
		return "", 0, nil
	}
	f := strings.Fields(line)
	if len(f) != 5 || f[0] != "VALUE" {
		return line, 0, nil
	}
	n, err1 := strconv.Atoi(f[3])
	cas, err2 := strconv.ParseUint(f[4], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, fmt.Errorf("bad VALUE line %q", line)
	}
	value, err := tc.r.ReadString('\n')
	if err != nil || len(value) != n+2 {
		return "", 0, fmt.Errorf("value %q: %v", value, err)
	}
	if end, err := tc.r.ReadString('\n'); err != nil || end != "END\r\n" {
		return "", 0, fmt.Errorf("after value: %q %v", end, err)
	}
	return value[:n], cas, nil
}

// isErrorLine reports whether an answer is one of memcached's error lines.
func isErrorLine(ans string) bool {
	return ans == "ERROR" || strings.HasPrefix(ans, "SERVER_ERROR") || strings.HasPrefix(ans, "CLIENT_ERROR")
}

// checkReplicaPlacement waits until every key is on at least r of the servers (noreply
// writes may still be on their way), then checks that each is on exactly the r servers
// that follow it on the ring.
func checkReplicaPlacement(t *testing.T, mcs []*memcachedtest.Server, keys []string, r int) {
	t.Helper()
	set := replicaSets(len(mcs), r)
	var on [][]int
	complete := poll(20*time.Second, func() bool {
		on = holders(t, mcs, keys)
		for _, h := range on {
			if len(h) < r {
				return false
			}
		}
		return true
	})
	if !complete {
		t.Log("some keys are not on all their replicas after 20 s")
	}
	wrongCount, wrongSet, perServer := 0, 0, make([]int, len(mcs))
	var examples []string
	for i, h := range on {
		for _, s := range h {
			perServer[s]++
		}
		want := set(keys[i])
		slices.Sort(want)
		switch {
		case len(h) != r:
			wrongCount++
		case !slices.Equal(h, want):
			wrongSet++
		default:
			continue
		}
		if len(examples) < 10 {
			examples = append(examples, fmt.Sprintf("%s on %v, want %v", keys[i], h, want))
		}
	}
	t.Logf("%d keys; copies per server %v", len(keys), perServer)
	if wrongCount > 0 {
		t.Errorf("%d of %d keys are not on exactly %d servers:\n%s", wrongCount, len(keys), r, strings.Join(examples, "\n"))
	}
	if wrongSet > 0 {
		t.Errorf("%d of %d keys are on %d servers, but not the %d that follow them on the ring:\n%s", wrongSet, len(keys), r, r, strings.Join(examples, "\n"))
	}
}

// replicaLoad is readers of the keys loadKeys stored before it (wk:<i> = v<i>) and writers
// of new keys (nw:<w>:<i>, whose value is the key), counting every error, miss and wrong
// value; it runs until finish, or maxOps requests per goroutine.
type replicaLoad struct {
	keys int
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	reads, readErrs, misses, wrong atomic.Int64
	writes, writeErrs              atomic.Int64

	mu       sync.Mutex
	written  []string // new keys whose set was acknowledged; guarded by mu
	examples []string // the first failures; guarded by mu
}

func startReplicaLoad(t *testing.T, addr string, keys, readers, writers int) *replicaLoad {
	t.Helper()
	l := &replicaLoad{keys: keys, stop: make(chan struct{})}
	for range readers {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); l.read(addr) }()
	}
	for w := range writers {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); l.write(addr, w) }()
	}
	t.Cleanup(l.finish)
	return l
}

func (l *replicaLoad) note(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.examples) < 10 {
		l.examples = append(l.examples, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	}
}

func (l *replicaLoad) read(addr string) {
	tc, err := dialText(addr)
	if err != nil {
		l.readErrs.Add(1)
		l.note("dial: %v", err)
		return
	}
	defer tc.Close()
	for range maxOps {
		select {
		case <-l.stop:
			return
		default:
		}
		i := rand.IntN(l.keys)
		k, want := fmt.Sprintf("wk:%d", i), fmt.Sprintf("v%d", i)
		v, err := tc.get(k)
		l.reads.Add(1)
		switch {
		case err != nil:
			l.readErrs.Add(1)
			l.note("get %s: %v", k, err)
			return
		case v == want:
		case v == "":
			l.misses.Add(1)
			l.note("get %s: miss", k)
		case isErrorLine(v):
			l.readErrs.Add(1)
			l.note("get %s: %s", k, v)
		default:
			l.wrong.Add(1)
			l.note("get %s = %q, want %q", k, v, want)
		}
	}
}

func (l *replicaLoad) write(addr string, w int) {
	tc, err := dialText(addr)
	if err != nil {
		l.writeErrs.Add(1)
		l.note("dial: %v", err)
		return
	}
	defer tc.Close()
	for i := range maxOps {
		select {
		case <-l.stop:
			return
		default:
		}
		k := fmt.Sprintf("nw:%d:%d", w, i)
		ans, err := tc.set(k, k)
		l.writes.Add(1)
		switch {
		case err != nil:
			l.writeErrs.Add(1)
			l.note("set %s: %v", k, err)
			return
		case ans != "STORED":
			l.writeErrs.Add(1)
			l.note("set %s: %s", k, ans)
		default:
			l.mu.Lock()
			l.written = append(l.written, k)
			l.mu.Unlock()
		}
	}
}

// finish stops the load and waits for it; calls after the first only wait.
func (l *replicaLoad) finish() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// check fails the test on any read error, miss or wrong value, or write error.
func (l *replicaLoad) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	examples := strings.Join(l.examples, "\n")
	l.mu.Unlock()
	t.Logf("%d reads: %d errors, %d misses, %d wrong values; %d writes: %d errors", l.reads.Load(), l.readErrs.Load(), l.misses.Load(), l.wrong.Load(), l.writes.Load(), l.writeErrs.Load())
	if l.readErrs.Load()+l.misses.Load()+l.wrong.Load() > 0 {
		t.Errorf("reads of keys written before the fault: %d errors, %d misses, %d wrong values; want none", l.readErrs.Load(), l.misses.Load(), l.wrong.Load())
	}
	if l.writeErrs.Load() > 0 {
		t.Errorf("%d of %d writes failed with write_quorum: all and one replica down; want none", l.writeErrs.Load(), l.writes.Load())
	}
	if l.readErrs.Load()+l.misses.Load()+l.wrong.Load()+l.writeErrs.Load() > 0 {
		t.Logf("first failures:\n%s", examples)
	}
}

// checkWritten checks the keys written during the fault: each reads back through moxi, and
// is on every replica of it but the victim.
func (l *replicaLoad) checkWritten(t *testing.T, moxi string, mcs []*memcachedtest.Server, victim int) {
	t.Helper()
	l.mu.Lock()
	written := slices.Clone(l.written)
	l.mu.Unlock()
	if len(written) == 0 {
		t.Error("no write was acknowledged during the fault")
		return
	}
	got := replicaValues(t, moxi, written)
	bad := 0
	for _, k := range written {
		if got[k] != k {
			if bad++; bad <= 10 {
				t.Errorf("%s, written during the fault, reads %q through moxi", k, got[k])
			}
		}
	}
	set := replicaSets(len(mcs), 2)
	on := make([]map[string]string, len(mcs))
	for s, mc := range mcs {
		if s != victim {
			on[s] = replicaValues(t, mc.Addr, written)
		}
	}
	missing := 0
	for _, k := range written {
		for _, s := range set(k) {
			if s != victim && on[s][k] != k {
				if missing++; missing <= 10 {
					t.Errorf("%s, acknowledged during the fault, is not on its live replica s%d", k, s)
				}
			}
		}
	}
	t.Logf("%d keys written during the fault: %d do not read back, %d copies missing on live replicas", len(written), bad, missing)
}

// replicaFault is TestReplicasKillOneServer and TestReplicasPausedServer: 20,000 keys on
// three servers with replicas: 2, then a read and write load while fault hits s1 and for
// hold after it; restore (if any) ends the fault, under the load still.
func replicaFault(t *testing.T, fault func(mc *memcachedtest.Server), hold time.Duration, restore func(mc *memcachedtest.Server)) {
	mcs := cluster(t, 3)
	moxi := startMoxi(t, "--config", writeConfig(t, replicaConfig(2, addrs(mcs)...)))
	const n = 20_000
	loadKeys(t, moxi.addr, n)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("wk:%d", i)
	}
	checkReplicaPlacement(t, mcs, keys, 2)
	if t.Failed() {
		return
	}

	const victim = 1
	l := startReplicaLoad(t, moxi.addr, n, 4, 2)
	waitUntil(t, time.Now(), 30*time.Second, func() bool { return l.reads.Load() >= 500 && l.writes.Load() >= 100 })
	fault(mcs[victim])
	at, reads, writes := time.Now(), l.reads.Load(), l.writes.Load()
	// For hold, and until the load has done enough after the fault on this machine.
	waitUntil(t, at, 30*time.Second+hold, func() bool {
		return time.Since(at) >= hold && l.reads.Load() >= reads+500 && l.writes.Load() >= writes+100
	})
	t.Logf("after the fault: %d reads and %d writes in %v", l.reads.Load()-reads, l.writes.Load()-writes, time.Since(at).Round(time.Millisecond))
	if restore != nil {
		restore(mcs[victim])
		at, reads := time.Now(), l.reads.Load()
		waitUntil(t, at, 30*time.Second, func() bool { return time.Since(at) >= time.Second && l.reads.Load() >= reads+300 })
	}
	l.finish()
	l.check(t)
	l.checkWritten(t, moxi.addr, mcs, victim)
	if t.Failed() {
		t.Logf("moxi log:\n%s", tail(moxi.out.String(), 8<<10))
	}
}

// TestReplicasKillOneServer: 20,000 keys written through moxi to three servers with
// replicas: 2 are each on exactly the two servers that follow it on the ring. One server
// is killed (SIGKILL) under readers of those keys and writers of new keys: for 2 s after,
// no read errs, misses or reads a wrong value, no write fails, and every key written
// meanwhile reads back and is on its live replicas.
func TestReplicasKillOneServer(t *testing.T) {
	replicaFault(t, func(mc *memcachedtest.Server) { mc.Stop() }, 2*time.Second, nil)
}

// TestReplicasPausedServer: as TestReplicasKillOneServer, but the server is paused
// (SIGSTOP) for 5 s and then resumed, under the load throughout: no error, no miss.
func TestReplicasPausedServer(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	replicaFault(t, func(mc *memcachedtest.Server) {
		if err := mc.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitStopped(t, mc.Addr)
	}, 5*time.Second, func(mc *memcachedtest.Server) {
		if err := mc.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	})
}

// TestReplicasNoStaleAfterPause: writers store rising versions of 60 keys (three servers,
// replicas: 2) while readers check every read against the newest version acknowledged;
// s1 is paused for 2 s, then resumed. No read through moxi is ever older than acknowledged,
// and no request fails. Once moxi reports s1 up and writes land on it again, no server
// holds any key older than its last acknowledged write.
func TestReplicasNoStaleAfterPause(t *testing.T) {
	mcs := cluster(t, 3)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, replicaConfig(2, addrs(mcs)...)), "--admin", admin)
	const victim = 1
	set := replicaSets(3, 2)
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = fmt.Sprintf("st:%d", i)
	}
	onVictim := 0
	for _, k := range keys {
		if slices.Contains(set(k), victim) {
			onVictim++
		}
	}
	probe := "" // a key s1 owns, not written by the check: landsOn tells when s1 takes writes again
	for i := 0; probe == ""; i++ {
		if k := fmt.Sprintf("probe:%d", i); set(k)[0] == victim {
			probe = k
		}
	}
	chk := newStaleCheck(keys)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const writers, readers = 4, 4
	for w := range writers {
		wg.Add(1)
		go func() { defer wg.Done(); chk.write(t, moxi.addr, w, writers, stop) }()
	}
	for range readers {
		wg.Add(1)
		go func() { defer wg.Done(); chk.read(t, moxi.addr, stop) }()
	}
	var stopped sync.Once
	halt := func() { stopped.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt)

	waitUntil(t, time.Now(), 30*time.Second, func() bool { return chk.acked.Load() >= 300 && chk.reads.Load() >= 300 })
	if err := mcs[victim].Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, mcs[victim].Addr)
	paused, acked := time.Now(), chk.acked.Load()
	waitUntil(t, paused, 30*time.Second, func() bool {
		return time.Since(paused) >= 2*time.Second && chk.acked.Load() >= acked+500
	})
	t.Logf("%d writes acknowledged while s1 was paused, %v; states %v", chk.acked.Load()-acked, time.Since(paused).Round(time.Millisecond), serverStates(t, admin))
	if err := mcs[victim].Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed, reads := time.Now(), chk.reads.Load()
	back := waitUntil(t, resumed, 30*time.Second, func() bool {
		return serverStates(t, admin)["s1"] == "up" && landsOn(moxi.addr, mcs[victim].Addr, probe)
	})
	t.Logf("s1 up and taking writes %v after SIGCONT", back.Round(time.Millisecond))
	acked = chk.acked.Load() // some more load with s1 serving again
	waitUntil(t, time.Now(), 30*time.Second, func() bool {
		return chk.acked.Load() >= acked+300 && chk.reads.Load() >= reads+500
	})
	halt()

	errs := 0
	for _, n := range chk.errorsByKey() {
		errs += n
	}
	t.Logf("%d reads, %d stale, %d errors, %d acknowledged writes; %d of %d keys have s1 as a replica", chk.reads.Load(), chk.stale.Load(), errs, chk.acked.Load(), onVictim, len(keys))
	if stale := chk.stale.Load(); stale > 0 {
		t.Errorf("%d reads through moxi older than acknowledged; want 0:\n%s", stale, strings.Join(chk.examples(), "\n"))
	}
	if errs > 0 {
		t.Errorf("%d failed requests with one replica paused; want 0: %v", errs, chk.errorsByKey())
	}
	if chk.reads.Load() < 500 || chk.acked.Load() < 500 {
		t.Errorf("only %d reads and %d acknowledged writes: the check saw too little", chk.reads.Load(), chk.acked.Load())
	}

	// Every copy, read directly: none older than the last acknowledged write.
	older := 0
	for s, mc := range mcs {
		held := replicaValues(t, mc.Addr, keys)
		for _, k := range keys {
			v, ok := held[k]
			if !ok {
				continue
			}
			if got, last := versionIn(v), chk.newest[k].Load(); got < last {
				if older++; older <= 10 {
					t.Errorf("s%d holds %s = %d, older than its last acknowledged write %d (replicas %v)", s, k, got, last, set(k))
				}
			}
		}
		t.Logf("s%d holds %d of the %d keys", s, len(held), len(keys))
	}
	if older > 0 {
		t.Errorf("%d copies older than the last acknowledged write", older)
	}
	if t.Failed() {
		t.Logf("moxi log:\n%s", tail(moxi.out.String(), 8<<10))
	}
}

// TestReplicasIncrCasAgree: clients incr counters, update keys by gets/cas and append to
// others, concurrently, on three servers with replicas: 2; s0 is killed half-way. At the
// end every key's copies on the live servers are equal (and equal what moxi reads), and
// each counter, cas key and appended key holds the number of acknowledged operations on it
// (give or take the ones answered with an error, which may or may not have been applied).
func TestReplicasIncrCasAgree(t *testing.T) {
	mcs := cluster(t, 3)
	moxi := startMoxi(t, "--config", writeConfig(t, replicaConfig(2, addrs(mcs)...)))
	const victim = 0
	set := replicaSets(3, 2)
	// For each kind, two keys of each sort: owned by the victim (the next replica decides
	// after the kill), with the victim second, and without the victim (both copies live).
	pick := func(prefix string) []string {
		var out []string
		for _, sort := range []func([]int) bool{
			func(s []int) bool { return s[0] == victim },
			func(s []int) bool { return s[1] == victim },
			func(s []int) bool { return !slices.Contains(s, victim) },
		} {
			for i, n := 0, 0; n < 2; i++ {
				if k := fmt.Sprintf("%s:%d", prefix, i); sort(set(k)) {
					out = append(out, k)
					n++
				}
			}
		}
		return out
	}
	counters, casKeys, appKeys := pick("ctr"), pick("cas"), pick("app")
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	setAll(t, c, counters, "0")
	setAll(t, c, casKeys, "0")
	setAll(t, c, appKeys, "a")

	// The cas unique a write answers is the one a cas write is decided by: the first
	// replica's, whichever replica acknowledged first.
	t.Run("cas unique of a write", func(t *testing.T) {
		bad := 0
		for i := range 100 {
			k := fmt.Sprintf("wcas:%d", i)
			ans, err := c.call("ms " + k + " 1 c\r\nv\r\n")
			cas := ""
			for _, f := range strings.Fields(ans) {
				if strings.HasPrefix(f, "c") {
					cas = f[1:]
				}
			}
			if err != nil || !strings.HasPrefix(ans, "HD") || cas == "" {
				t.Fatalf("ms %s c: %q %v", k, ans, err)
			}
			if ans2, err := c.call("ms " + k + " 1 C" + cas + "\r\nw\r\n"); err != nil || ans2 != "HD" {
				if bad++; bad <= 5 {
					t.Errorf("ms %s C%s with the cas unique its write answered (%q): %q %v; want HD", k, cas, ans, ans2, err)
				}
			}
		}
		if bad > 0 {
			t.Errorf("%d of 100 cas writes with the cas unique of the write before failed", bad)
		}
	})

	// Per key: operations acknowledged, and answered with an error (maybe applied).
	acked, uncertain := map[string]*atomic.Int64{}, map[string]*atomic.Int64{}
	for _, k := range slices.Concat(counters, casKeys, appKeys) {
		acked[k], uncertain[k] = new(atomic.Int64), new(atomic.Int64)
	}
	var ops, errs, conflicts, atKill atomic.Int64
	var killedAt atomic.Int64 // unix nanoseconds of the kill, 0 before it
	var mu sync.Mutex
	var examples []string
	fail := func(k, format string, args ...any) {
		// A conditional write in flight on the server at the moment it is killed may fail
		// (it may or may not have been applied there, so it is not acknowledged): as on a
		// server without replicas. One a client at most, within a second of the kill.
		if at := killedAt.Load(); at != 0 && time.Since(time.Unix(0, at)) < time.Second && atKill.Add(1) <= 8 {
			return
		}
		errs.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if len(examples) < 10 {
			examples = append(examples, time.Now().Format("15:04:05.000 ")+k+": "+fmt.Sprintf(format, args...))
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := func(f func(tc *textClient) bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tc, err := dialText(moxi.addr)
			if err != nil {
				fail("dial", "%v", err)
				return
			}
			defer tc.Close()
			for range maxOps {
				select {
				case <-stop:
					return
				default:
				}
				ops.Add(1)
				if !f(tc) {
					return
				}
			}
		}()
	}
	for range 4 {
		client(func(tc *textClient) bool {
			k := counters[rand.IntN(len(counters))]
			ans, err := tc.call("incr " + k + " 1\r\n")
			switch {
			case err != nil:
				uncertain[k].Add(1)
				fail(k, "incr: %v", err)
				return false
			case isErrorLine(ans):
				uncertain[k].Add(1)
				fail(k, "incr: %s", ans)
			default:
				if _, err := strconv.ParseUint(ans, 10, 64); err != nil {
					fail(k, "incr: %s", ans)
				} else {
					acked[k].Add(1)
				}
			}
			return true
		})
	}
	for range 3 {
		client(func(tc *textClient) bool {
			k := casKeys[rand.IntN(len(casKeys))]
			v, cas, err := replicaGets(tc, k)
			if err != nil {
				fail(k, "gets: %v", err)
				return false
			}
			n, perr := strconv.Atoi(v)
			if perr != nil {
				fail(k, "gets: %q", v)
				return true
			}
			next := strconv.Itoa(n + 1)
			ans, err := tc.call(fmt.Sprintf("cas %s 0 0 %d %d\r\n%s\r\n", k, len(next), cas, next))
			switch {
			case err != nil:
				uncertain[k].Add(1)
				fail(k, "cas: %v", err)
				return false
			case ans == "STORED":
				acked[k].Add(1)
			case ans == "EXISTS":
				conflicts.Add(1)
			case isErrorLine(ans):
				uncertain[k].Add(1)
				fail(k, "cas: %s", ans)
			default:
				fail(k, "cas: %s", ans)
			}
			return true
		})
	}
	client(func(tc *textClient) bool {
		k := appKeys[rand.IntN(len(appKeys))]
		ans, err := tc.call("append " + k + " 0 0 1\r\nx\r\n")
		switch {
		case err != nil:
			uncertain[k].Add(1)
			fail(k, "append: %v", err)
			return false
		case ans == "STORED":
			acked[k].Add(1)
		case isErrorLine(ans):
			uncertain[k].Add(1)
			fail(k, "append: %s", ans)
		default:
			fail(k, "append: %s", ans)
		}
		return true
	})
	var stopped sync.Once
	halt := func() { stopped.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt)

	waitUntil(t, time.Now(), 30*time.Second, func() bool { return ops.Load() >= 1000 })
	killedAt.Store(time.Now().UnixNano())
	mcs[victim].Stop()
	killed, before := time.Now(), ops.Load()
	waitUntil(t, killed, 30*time.Second, func() bool {
		return time.Since(killed) >= 1500*time.Millisecond && ops.Load() >= before+1000
	})
	halt()
	t.Logf("%d operations (%d before the kill), %d cas conflicts, %d errors (and %d in flight at the kill)", ops.Load(), before, conflicts.Load(), errs.Load(), min(atKill.Load(), 8))

	// The copies on the live servers: every live replica holds the key, all equal. A copy
	// may be on its way when the last answer came: wait a little for agreement.
	keys := slices.Concat(counters, casKeys, appKeys)
	var held []map[string]string
	agree := func() bool {
		held = make([]map[string]string, len(mcs))
		for s, mc := range mcs {
			if s != victim {
				held[s] = replicaValues(t, mc.Addr, keys)
			}
		}
		for _, k := range keys {
			var first *string
			for _, s := range set(k) {
				if s == victim {
					continue
				}
				v, ok := held[s][k]
				if !ok || (first != nil && v != *first) {
					return false
				}
				first = &v
			}
		}
		return true
	}
	if !poll(5*time.Second, agree) {
		t.Error("the live replicas of some keys disagree 5 s after the last answer")
	}
	through := replicaValues(t, moxi.addr, keys)
	for _, k := range keys {
		var copies []string
		for _, s := range set(k) {
			if s != victim {
				v, ok := held[s][k]
				if !ok {
					v = "(missing)"
				}
				copies = append(copies, fmt.Sprintf("s%d=%s", s, v))
			}
		}
		live := slices.DeleteFunc(slices.Clone(set(k)), func(s int) bool { return s == victim })
		var values []string
		for _, s := range live {
			if v, ok := held[s][k]; ok {
				values = append(values, v)
			} else {
				t.Errorf("%s (replicas %v) is missing on its live replica s%d (copies %s)", k, set(k), s, strings.Join(copies, " "))
			}
		}
		if len(values) == 0 {
			continue
		}
		v := values[0]
		if slices.ContainsFunc(values, func(o string) bool { return o != v }) {
			t.Errorf("%s (replicas %v): the live copies disagree: %s", k, set(k), strings.Join(copies, " "))
		}
		if through[k] != v {
			t.Errorf("%s reads %q through moxi, but its live copies are %s", k, through[k], strings.Join(copies, " "))
		}
		n := int64(len(v)) - 1 // appended: "a" then one "x" per append
		if !slices.Contains(appKeys, k) {
			var err error
			if n, err = strconv.ParseInt(v, 10, 64); err != nil {
				t.Errorf("%s: copies %s, want a number", k, strings.Join(copies, " "))
				continue
			}
		}
		lo, hi := acked[k].Load(), acked[k].Load()+uncertain[k].Load()
		if n < lo || n > hi {
			t.Errorf("%s (replicas %v) counts %d operations, but %d were acknowledged and %d failed (copies %s)", k, set(k), n, lo, hi-lo, strings.Join(copies, " "))
		}
	}
	if errs.Load() > 0 {
		mu.Lock()
		t.Errorf("%d operations failed with one replica killed and write_quorum: all; want none. First:\n%s", errs.Load(), strings.Join(examples, "\n"))
		mu.Unlock()
	}
	if t.Failed() {
		t.Logf("moxi log:\n%s", tail(moxi.out.String(), 8<<10))
	}
}

// TestReplicasMemccapable: libmemcached's conformance suite, and gomemcache's whole API,
// through moxi in front of three servers with replicas: 2.
func TestReplicasMemccapable(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	mcs := cluster(t, 3)
	moxi := startMoxi(t, "--config", writeConfig(t, poolConfig("    replicas: 2\n", addrs(mcs)...)))
	t.Run("memccapable", func(t *testing.T) {
		passed, failed := runMemccapable(t, moxi.addr)
		t.Logf("memccapable through moxi and a replicated pool: %d passed, %d failed", len(passed), len(failed))
		if len(failed) > 0 || len(passed) != 54 {
			t.Errorf("memccapable: %d/54 passed; failed: %s\nmoxi log:\n%s", len(passed), strings.Join(failed, ", "), tail(moxi.out.String(), 8<<10))
		}
	})
	t.Run("gomemcache", func(t *testing.T) { exerciseGomemcache(t, moxi.addr) })
}

// TestReplicasPlacementDistinct: with replicas: 3 on four servers, every key written is on
// exactly the three distinct servers that follow it on the ring — at once for a set
// answered STORED (write_quorum: all), eventually for noreply sets. A copy deleted on the
// first replica is read from the next and copied back, with its remaining TTL.
func TestReplicasPlacementDistinct(t *testing.T) {
	mcs := cluster(t, 4)
	moxi := startMoxi(t, "--config", writeConfig(t, replicaConfig(3, addrs(mcs)...)))
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	acked := make([]string, 300)
	for i := range acked {
		acked[i] = fmt.Sprintf("pd:%d", i)
	}
	setAll(t, c, acked, "v")
	t.Run("acknowledged", func(t *testing.T) {
		set := replicaSets(4, 3)
		bad := 0
		for i, h := range holders(t, mcs, acked) {
			want := set(acked[i])
			slices.Sort(want)
			if !slices.Equal(h, want) {
				if bad++; bad <= 10 {
					t.Errorf("%s, answered STORED, is on %v; want all of %v", acked[i], h, want)
				}
			}
		}
		if bad > 0 {
			t.Errorf("%d of %d keys answered STORED are not on their 3 replicas", bad, len(acked))
		}
	})
	t.Run("noreply", func(t *testing.T) {
		const n = 5000
		loadKeys(t, moxi.addr, n)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("wk:%d", i)
		}
		checkReplicaPlacement(t, mcs, keys, 3)
	})
	t.Run("read repair", func(t *testing.T) {
		const k = "pd:repair"
		if ans, err := c.call("set " + k + " 0 100 1\r\nr\r\n"); err != nil || ans != "STORED" {
			t.Fatalf("set %s: %q %v", k, ans, err)
		}
		first := mcs[replicaSets(4, 3)(k)[0]]
		d, err := dialText(first.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if ans, err := d.call("delete " + k + "\r\n"); err != nil || ans != "DELETED" {
			t.Fatalf("delete %s on its first replica: %q %v", k, ans, err)
		}
		if v, err := c.get(k); err != nil || v != "r" {
			t.Fatalf("get %s, deleted on its first replica only: %q %v; want the next replica's copy", k, v, err)
		}
		var ans string
		if !poll(10*time.Second, func() bool {
			ans, err = d.call("mg " + k + " v t\r\n")
			return err == nil && strings.HasPrefix(ans, "VA ")
		}) {
			t.Fatalf("%s not copied back to its first replica after a read there missed: %q %v", k, ans, err)
		}
		if _, err := d.r.ReadString('\n'); err != nil { // the value line
			t.Fatal(err)
		}
		ttl := -2
		for _, f := range strings.Fields(ans)[2:] {
			if strings.HasPrefix(f, "t") {
				ttl, _ = strconv.Atoi(f[1:])
			}
		}
		if ttl <= 0 || ttl > 100 {
			t.Errorf("the copy read back to the first replica has TTL %d (%q); want the remaining TTL, ≤ 100 s", ttl, ans)
		}
	})
}

// TestReplicasFireAndForget: sets answered at once and written in the background
// (fire_and_forget) are written to every replica too.
func TestReplicasFireAndForget(t *testing.T) {
	mcs := cluster(t, 3)
	moxi := startMoxi(t, "--config", writeConfig(t, replicaConfig(2, addrs(mcs)...)+"fire_and_forget:\n  prefixes: [\"ff:\"]\n"))
	keys := make([]string, 200)
	tc, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	for i := range keys {
		keys[i] = fmt.Sprintf("ff:%d", i)
		if ans, err := tc.set(keys[i], "v"); err != nil || ans != "STORED" {
			t.Fatalf("set %s: %q %v", keys[i], ans, err)
		}
	}
	set := replicaSets(3, 2)
	eventually(t, "every fire-and-forget key on its two replicas", func() bool {
		for i, hs := range holders(t, mcs, keys) {
			want := slices.Clone(set(keys[i]))
			slices.Sort(want)
			if !slices.Equal(hs, want) {
				return false
			}
		}
		return true
	})
}

// TestReplicasBigValuesAndMultiGet: 1 MiB values and a multi-get of 2,000 keys through a
// pool with replicas: 2, before and after one of its three servers is killed: every value
// comes back, from its other replica, and moxi's peak RSS stays bounded (built without the
// race detector, whose shadow memory would swamp it).
func TestReplicasBigValuesAndMultiGet(t *testing.T) {
	var mcs []*memcachedtest.Server
	for range 3 {
		mcs = append(mcs, memcachedtest.Start(t, "-I", "2m", "-m", "256"))
	}
	moxi := startMoxiBin(t, fastMoxi(t), "--config", writeConfig(t, replicaConfig(2, addrs(mcs)...)+"limits:\n  max_value_bytes: 2097152\n"))
	storeBig(t, moxi.addr, 20)
	small := make([]string, 2000)
	for i := range small {
		small[i] = fmt.Sprintf("mg:%d", i)
	}
	setKeys(t, moxi.addr, small)
	check := func(when string) {
		t.Helper()
		if n, err := bigGet(moxi.addr, 20); n != 20 || err != nil {
			t.Errorf("%s: a get of 20 values of 1 MiB answered %d (%v)", when, n, err)
		}
		c, err := net.Dial("tcp", moxi.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		found := 0
		for _, l := range roundTrip(t, c, bufio.NewReader(c), "get "+strings.Join(small, " ")+"\r\n", "END") {
			if strings.HasPrefix(l, "VALUE ") {
				found++
			}
		}
		if found != len(small) {
			t.Errorf("%s: one multi-get of %d keys found %d", when, len(small), found)
		}
	}
	check("all servers up")
	mcs[0].Stop()
	check("one server killed")
	rss := peakRSS(t, moxi.cmd.Process.Pid)
	t.Logf("moxi's peak RSS: %.0f MiB", rss)
	if rss > 256 {
		t.Errorf("moxi's peak RSS %.0f MiB for 20 MiB of values", rss)
	}
}
