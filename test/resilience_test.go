package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/hashkit"
	"github.com/moxi-proxy/moxi/internal/ketama"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// The failure settings of these tests, and the bounds docs/operating.md derives from them.
const (
	testTimeout      = 250 * time.Millisecond
	testRetries      = 1
	testFailureLimit = 2
	testBackoffMax   = time.Second
)

// resilientConfig is a pool "main" of servers named s0, s1, … with short failure settings.
func resilientConfig(failover bool, addrs ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pools:\n  main:\n    timeout: %v\n    retries: %d\n    failure_limit: %d\n", testTimeout, testRetries, testFailureLimit)
	fmt.Fprintf(&b, "    dead_backoff: 100ms\n    dead_backoff_max: %v\n    connect_timeout: 250ms\n    failover: %v\n    servers:\n", testBackoffMax, failover)
	for i, a := range addrs {
		fmt.Fprintf(&b, "      - %s:1 s%d\n", a, i)
	}
	return b.String()
}

// owners tells which of n servers named s0… owns a key, as moxi places it (md5, ketama).
func owners(n int) func(key string) int {
	nodes := make([]ketama.Node, n)
	for i := range nodes {
		nodes[i] = ketama.Node{Name: fmt.Sprintf("s%d", i), Weight: 1}
	}
	ring := ketama.New(nodes)
	return func(key string) int { return ring.Pick(hashkit.MD5([]byte(key))) }
}

// keysOf returns n keys owned by server s and n owned by the others.
func keysOf(s, servers, n int) (mine, others []string) {
	owner := owners(servers)
	for i := 0; len(mine) < n || len(others) < n; i++ {
		k := fmt.Sprintf("key:%d", i)
		if owner(k) == s {
			if len(mine) < n {
				mine = append(mine, k)
			}
		} else if len(others) < n {
			others = append(others, k)
		}
	}
	return mine, others
}

type outcome struct {
	at  time.Time
	key string
	err string // "" when answered
}

// load runs workers that set and get keys round-robin until stop closes or 300,000 requests,
// and returns every outcome.
func load(t *testing.T, addr string, keys []string, workers int, stop <-chan struct{}) []outcome {
	t.Helper()
	l := startLoad(t, addr, keys, workers)
	select {
	case <-stop:
	case <-l.done:
	}
	return l.finish()
}

// loader is load running in the background, whose outcomes a test can watch while it runs.
type loader struct {
	stop   chan struct{} // closed by finish
	halted sync.Once
	done   chan struct{} // closed when every worker has returned

	mu  sync.Mutex
	out []outcome // guarded by mu
}

// startLoad starts load's workers. They end at finish, which the test's cleanup calls too,
// so a test that fails half-way does not leave them running.
func startLoad(t *testing.T, addr string, keys []string, workers int) *loader {
	t.Helper()
	l := &loader{stop: make(chan struct{}), done: make(chan struct{})}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dialText(addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for i := w; i < 300000; i += workers {
				select {
				case <-l.stop:
					return
				default:
				}
				k := keys[i%len(keys)]
				var ans string
				if i%2 == 0 {
					ans, err = c.set(k, "v")
				} else {
					ans, err = c.get(k)
				}
				o := outcome{at: time.Now(), key: k}
				switch {
				case err != nil:
					o.err = err.Error()
				case strings.HasPrefix(ans, "SERVER_ERROR"), strings.HasPrefix(ans, "CLIENT_ERROR"), ans == "ERROR":
					o.err = ans
				}
				l.mu.Lock()
				l.out = append(l.out, o)
				l.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(l.done) }()
	t.Cleanup(func() { l.finish() })
	return l
}

// count is how many outcomes so far satisfy ok.
func (l *loader) count(ok func(outcome) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.out {
		if ok(o) {
			n++
		}
	}
	return n
}

// finish stops the workers, waits for them and returns every outcome.
func (l *loader) finish() []outcome {
	l.halted.Do(func() { close(l.stop) })
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out
}

// TestKillServerUnderLoad: SIGKILL one of three servers under steady load. Keys on the
// other two see no error; the dead server's keys fail over within failure_limit × timeout;
// restarted once the prober waits dead_backoff_max between probes, its keys come back to
// it within dead_backoff_max. The bounds are checked
// with a margin for a loaded machine (×4 + 1 s) and the measured figures logged.
func TestKillServerUnderLoad(t *testing.T) {
	mcs := cluster(t, 3)
	// Debug logging shows the prober's backoff, which the dead phase waits on.
	moxi := startMoxi(t, "--config", writeConfig(t, resilientConfig(true, addrs(mcs)...)), "--log-level", "debug")
	mine, others := keysOf(0, 3, 50)
	keys := append(append([]string(nil), mine...), others...)
	owner := owners(3)

	l := startLoad(t, moxi.addr, keys, 6)
	// Each phase lasts until the killed server's keys have been answered 100 times in it:
	// as long as it takes on this machine, rather than a fixed time.
	served := func(phase string) {
		t.Helper()
		since := time.Now()
		took := waitUntil(t, since, 20*time.Second, func() bool {
			return l.count(func(o outcome) bool { return o.err == "" && owner(o.key) == 0 && o.at.After(since) }) >= 100
		})
		t.Logf("%s: 100 answers for the killed server's keys in %v", phase, took.Round(time.Millisecond))
	}
	served("steady load first")
	killed := time.Now()
	mcs[0].Stop()
	served("failed over")
	// The restart waits until the prober's backoff has doubled up to dead_backoff_max, so
	// that the failback below is bounded by it, not by a shorter early interval.
	atMax := "next_in=" + testBackoffMax.String()
	waitUntil(t, killed, 20*time.Second, func() bool {
		for _, line := range strings.Split(moxi.out.String(), "\n") {
			if strings.Contains(line, `msg="backend probe failed"`) && strings.Contains(line, atMax) {
				return true
			}
		}
		return false
	})
	mcs[0].Restart(t)
	restarted := time.Now()
	// from the restart until the server's keys land on it again
	back := waitUntil(t, restarted, 20*time.Second, func() bool { return landsOn(moxi.addr, mcs[0].Addr, mine[0]) })
	served("steady load after the failback")
	outcomes := l.finish()

	var lastErr time.Time
	errs := 0
	for _, o := range outcomes {
		if o.err == "" {
			continue
		}
		if owner(o.key) != 0 {
			t.Errorf("key %s on a live server failed: %s", o.key, o.err)
			continue
		}
		errs++
		if o.at.After(lastErr) {
			lastErr = o.at
		}
	}
	contract := testFailureLimit * testTimeout
	bound := 4*contract + time.Second
	window := time.Duration(0)
	if errs > 0 {
		window = lastErr.Sub(killed)
	}
	t.Logf("%d requests; %d errors, all for the killed server's keys, the last %v after the kill (contract %v, checked ≤ %v)", len(outcomes), errs, window.Round(time.Millisecond), contract, bound)
	if window > bound {
		t.Errorf("errors for the dead server's keys went on for %v after the kill; want ≤ %v", window, bound)
	}

	bound = 4*testBackoffMax + time.Second
	t.Logf("keys back on the restarted server %v after the restart (dead_backoff_max %v, checked ≤ %v)", back.Round(time.Millisecond), testBackoffMax, bound)
	if back > bound {
		t.Errorf("failback took %v; want within dead_backoff_max %v (plus a probe; checked ≤ %v)", back, testBackoffMax, bound)
	}
}

// landsOn reports whether a write of key through moxi is stored on the server at addr.
func landsOn(moxi, addr, key string) bool {
	c, err := dialText(moxi)
	if err != nil {
		return false
	}
	defer c.Close()
	v := fmt.Sprint(time.Now().UnixNano())
	if ans, err := c.set(key, v); err != nil || ans != "STORED" {
		return false
	}
	d, err := dialText(addr)
	if err != nil {
		return false
	}
	defer d.Close()
	got, err := d.get(key)
	return err == nil && got == v
}

// waitUntil polls cond every 10 ms until it holds, and returns how long after since it did;
// it fails the test if cond does not hold within limit (make it generous: it is a deadline
// for a loaded machine, not the bound a test checks).
func waitUntil(t *testing.T, since time.Time, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	if !poll(limit, cond) {
		t.Fatalf("condition not met within %v", limit)
	}
	return time.Since(since)
}

// poll calls cond every 10 ms until it is true, and reports whether it was within limit.
func poll(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// faultListener is a server that misbehaves in one way, for as long as the test runs.
func faultListener(t *testing.T, kind string) string {
	t.Helper()
	switch kind {
	case "refuses":
		return memcachedtest.FreeAddr(t) // nothing listens there
	case "closes after accepting":
		return memcachedtest.StartFake(t, func(c net.Conn) { c.Close() }).Addr
	}
	return memcachedtest.Blackhole(t) // "accepts and never answers": held open, nothing read
}

// TestFaultyServers: a server that pauses (SIGSTOP), one that accepts and never answers,
// one that refuses and one that closes after accepting. Without failover its keys answer
// SERVER_ERROR within timeout × (retries+1), the other servers' keys are served, and a
// paused server is used again after SIGCONT, within dead_backoff_max. The bounds are
// checked with a margin for a loaded machine (×4 + 1 s) and the measured figures logged.
func TestFaultyServers(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	for _, kind := range []string{"paused", "accepts and never answers", "refuses", "closes after accepting"} {
		t.Run(kind, func(t *testing.T) {
			mcs := cluster(t, 2)
			servers := addrs(mcs)
			var paused *memcachedtest.Server
			if kind == "paused" {
				paused = memcachedtest.Start(t)
				servers = append(servers, paused.Addr)
			} else {
				servers = append(servers, faultListener(t, kind))
			}
			admin := freeAddr(t)
			moxi := startMoxi(t, "--config", writeConfig(t, resilientConfig(false, servers...)), "--admin", admin)
			bad, good := keysOf(2, 3, 10)
			c, err := dialText(moxi.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if paused != nil {
				for _, k := range bad {
					if ans, err := c.set(k, "before"); err != nil || ans != "STORED" {
						t.Fatalf("set %s: %q %v", k, ans, err)
					}
				}
				if err := paused.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				waitStopped(t, paused.Addr)
			}

			contract := time.Duration(testRetries+1) * testTimeout
			bound := 4*contract + time.Second
			var slowest time.Duration
			for _, k := range bad {
				start := time.Now()
				ans, err := c.get(k)
				d := time.Since(start)
				slowest = max(slowest, d)
				if err != nil || !strings.HasPrefix(ans, "SERVER_ERROR") {
					t.Fatalf("get %s on the faulty server: %q %v; want SERVER_ERROR", k, ans, err)
				}
				if d > bound {
					t.Errorf("get %s took %v; want ≤ %v", k, d, bound)
				}
			}
			for _, k := range good {
				if ans, err := c.set(k, "ok"); err != nil || ans != "STORED" {
					t.Errorf("set %s on a good server: %q %v", k, ans, err)
				}
			}
			t.Logf("faulty server's keys: SERVER_ERROR, slowest %v (contract %v, checked ≤ %v); other keys served", slowest.Round(time.Millisecond), contract, bound)
			checkState(t, admin, "s2", "dead")
			checkState(t, admin, "s0", "up")

			if paused != nil {
				resumed := time.Now()
				if err := paused.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				back := waitUntil(t, resumed, 20*time.Second, func() bool {
					v, err := c.get(bad[0])
					return err == nil && v == "before"
				})
				limit := 4*testBackoffMax + time.Second
				t.Logf("paused server serving again %v after SIGCONT (dead_backoff_max %v, checked ≤ %v)", back.Round(time.Millisecond), testBackoffMax, limit)
				checkState(t, admin, "s2", "up")
				log := moxi.out.String()
				if n := strings.Count(log, "backend marked dead"); n != 1 {
					t.Errorf("%d 'marked dead' log lines for one pause, want 1:\n%s", n, log)
				}
				if n := strings.Count(log, "backend up again"); n != 1 {
					t.Errorf("%d 'up again' log lines for one recovery, want 1:\n%s", n, log)
				}
				if back > limit {
					t.Errorf("recovery after SIGCONT took %v; want within dead_backoff_max %v (checked ≤ %v)", back, testBackoffMax, limit)
				}
			}
		})
	}
}

// waitStopped waits until every thread of the memcached listening on addr is stopped. A
// SIGSTOP takes effect some time after kill returns, and on a busy machine a request
// sent meanwhile is still answered.
func waitStopped(t *testing.T, addr string) {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	pid := ""
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if filepath.Base(args[0]) == "memcached" && slices.Contains(args, port) {
			pid = filepath.Base(filepath.Dir(p))
			break
		}
	}
	if pid == "" {
		t.Fatalf("no memcached process found for %s", addr)
	}
	waitUntil(t, time.Now(), 20*time.Second, func() bool {
		threads, _ := filepath.Glob("/proc/" + pid + "/task/*/stat")
		for _, th := range threads {
			stat, err := os.ReadFile(th)
			if err != nil {
				return false
			}
			// "tid (comm) state ...": the state follows the last ')'.
			rest := string(stat[bytes.LastIndexByte(stat, ')')+1:])
			if f := strings.Fields(rest); len(f) == 0 || f[0] != "T" {
				return false
			}
		}
		return len(threads) > 0
	})
}

// TestBackupPool: writes are copied to the backup pool; a read that misses on the primary
// is answered from the backup, and so is one whose primary is down.
func TestBackupPool(t *testing.T) {
	primary, spare := memcachedtest.Start(t), memcachedtest.Start(t)
	conf := fmt.Sprintf(`pools:
  main:
    timeout: 250ms
    failure_limit: 1
    failover: false
    backup: spare
    servers: [%s]
  spare:
    servers: [%s]
default_pool: main
`, primary.Addr, spare.Addr)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, conf), "--admin", admin)
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ans, err := c.set("b:1", "one"); err != nil || ans != "STORED" {
		t.Fatalf("set: %q %v", ans, err)
	}
	d, err := dialText(spare.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	waitUntil(t, time.Now(), 20*time.Second, func() bool { v, err := d.get("b:1"); return err == nil && v == "one" })

	p, err := dialText(primary.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if ans, err := p.call("delete b:1\r\n"); err != nil || ans != "DELETED" {
		t.Fatalf("delete on primary: %q %v", ans, err)
	}
	p.Close()
	if v, err := c.get("b:1"); err != nil || v != "one" {
		t.Fatalf("get after a miss on the primary: %q %v; want the backup's value", v, err)
	}

	primary.Stop()
	if v, err := c.get("b:1"); err != nil || v != "one" {
		t.Fatalf("get with the primary down: %q %v; want the backup's value", v, err)
	}
	if v, err := c.get("b:none"); err != nil || v != "" {
		t.Fatalf("get of a key nowhere: %q %v; want a miss", v, err)
	}
	if hits := metricValue(t, admin, "moxi_backup_hits_total"); hits != 2 {
		t.Errorf("moxi_backup_hits_total = %v, want 2", hits)
	}
	if writes := metricValue(t, admin, "moxi_backup_writes_total"); writes < 1 {
		t.Errorf("moxi_backup_writes_total = %v, want ≥ 1", writes)
	}
}

// checkState checks a server's state in GET /servers and in moxi_backend_up.
func checkState(t *testing.T, admin, server, want string) {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/servers")
	if err != nil {
		t.Fatal(err)
	}
	var servers []struct{ Pool, Name, Addr, State string }
	err = json.NewDecoder(resp.Body).Decode(&servers)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range servers {
		if s.Name == server {
			found = true
			if s.State != want {
				t.Errorf("/servers: %s is %q, want %q", server, s.State, want)
			}
		}
	}
	if !found {
		t.Errorf("/servers does not list %s: %+v", server, servers)
	}
	resp, err = http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	value := map[string]string{"up": "1", "dead": "0"}[want]
	line := fmt.Sprintf(`moxi_backend_up{pool="main",server=%q} %s`, server, value)
	if !strings.Contains(string(body), line) {
		t.Errorf("/metrics lacks %s", line)
	}
	if want == "up" {
		latency := fmt.Sprintf(`moxi_backend_request_duration_seconds_count{pool="main",server=%q}`, server)
		if !strings.Contains(string(body), latency) {
			t.Errorf("/metrics lacks %s", latency)
		}
	}
}
