package test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// limitsConfig is a config of one pool over servers, without dedup (each get answered is
// one get on a server), with auth over users and the auth.limits entries limits (lines
// indented four spaces).
func limitsConfig(users, limits string, servers ...string) string {
	return poolConfig("", servers...) + "dedup: false\n" +
		fmt.Sprintf("auth:\n  users_file: %q\n  limits:\n%s", users, limits)
}

// serverOps is the gets and sets memcached at addr has served.
func serverOps(t *testing.T, addr string) int {
	t.Helper()
	st := memcachedtest.Stats(t, addr)
	gets, _ := strconv.Atoi(st["cmd_get"])
	sets, _ := strconv.Atoi(st["cmd_set"])
	return gets + sets
}

// login dials addr and logs in as user with the text protocol's login set.
func login(t *testing.T, addr, user, password string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, r := dialConn(t, addr)
	textLogin(t, c, r, user, password)
	return c, r
}

// floodResult is what a flood of requests got.
type floodResult struct {
	answered, refused int
	first, last       time.Time // the first request sent, and the last
}

// flood sends user's requests, rate a second, on conns connections (each keeping at most
// window requests in flight), sets and gets of keys of their own, until d has passed since
// the first, and reads every answer.
func flood(t *testing.T, addr, user, password string, conns, window, rate int, d time.Duration) floodResult {
	t.Helper()
	type conn struct {
		c net.Conn
		r *bufio.Reader
	}
	cs := make([]conn, conns)
	for i := range cs {
		cs[i].c, cs[i].r = login(t, addr, user, password)
		_ = cs[i].c.SetDeadline(time.Time{}) // the login's
	}
	per := time.Duration(float64(time.Second) * float64(conns) / float64(rate)) // between a connection's requests
	var answered, refused atomic.Int64
	var lastMu sync.Mutex
	var last time.Time
	first := time.Now()
	end := first.Add(d)
	var wg sync.WaitGroup
	for i, c := range cs {
		slots := make(chan struct{}, window)
		wg.Go(func() {
			w := bufio.NewWriter(c.c)
			for n := 0; time.Now().Before(end); n++ {
				if ahead := first.Add(time.Duration(n) * per).Sub(time.Now()); ahead > time.Millisecond {
					if err := w.Flush(); err != nil {
						t.Error(err)
						break
					}
					time.Sleep(ahead)
				}
				slots <- struct{}{}
				key := fmt.Sprintf("%s:%d:%d", user, i, n)
				if n%2 == 0 {
					fmt.Fprintf(w, "set %s 0 0 5\r\nvalue\r\n", key)
				} else {
					fmt.Fprintf(w, "get %s\r\n", key)
				}
				if len(slots) == cap(slots) || n%16 == 15 {
					if err := w.Flush(); err != nil {
						t.Error(err)
						break
					}
				}
			}
			_ = w.Flush()
			lastMu.Lock()
			if now := time.Now(); now.After(last) {
				last = now
			}
			lastMu.Unlock()
			_ = c.c.(*net.TCPConn).CloseWrite() // moxi answers what was sent, then closes
		})
		wg.Go(func() {
			_ = c.c.SetReadDeadline(end.Add(30 * time.Second))
			for {
				line, err := c.r.ReadString('\n')
				if err == io.EOF && line == "" {
					return
				}
				if err != nil {
					t.Errorf("%s's answers: %v", user, err)
					return
				}
				switch {
				case line == "SERVER_ERROR rate limited\r\n":
					refused.Add(1)
				case strings.HasPrefix(line, "VALUE "):
					if _, err := c.r.ReadString('\n'); err != nil {
						t.Error(err)
						return
					}
					if end, err := c.r.ReadString('\n'); err != nil || end != "END\r\n" {
						t.Errorf("after a value: %q, %v", end, err)
						return
					}
					answered.Add(1)
				case line == "END\r\n" || line == "STORED\r\n":
					answered.Add(1)
				default:
					t.Errorf("%s got %q", user, line)
					return
				}
				<-slots
			}
		})
	}
	wg.Wait()
	return floodResult{answered: int(answered.Load()), refused: int(refused.Load()), first: first, last: last}
}

// closedLoop sends user's sets and gets one at a time on one connection until stop is
// closed, and returns each one's time.
func closedLoop(t *testing.T, c net.Conn, r *bufio.Reader, prefix string, stop <-chan struct{}) []time.Duration {
	var lat []time.Duration
	for i := 0; ; i++ {
		select {
		case <-stop:
			slices.Sort(lat)
			return lat
		default:
		}
		req, last := fmt.Sprintf("set %s%d 0 0 5\r\nvalue\r\n", prefix, i), "STORED"
		if i%2 == 1 {
			req, last = fmt.Sprintf("get %s%d\r\n", prefix, i-1), "END"
		}
		start := time.Now()
		lines := roundTrip(t, c, r, req, last)
		lat = append(lat, time.Since(start))
		if lines[len(lines)-1] != last {
			t.Errorf("%q: %q", req, lines)
		}
	}
}

// TestLimitRequestsPerSecond: alice, limited to 1,000 requests a second, floods moxi with
// 20,000 a second for 10 s while bob, unlimited, waits for each answer. alice gets her burst and then 1,000 a
// second answered, within 5 %, the rest SERVER_ERROR rate limited; bob's p99 stays of the
// order it has without her; the server serves exactly what was answered.
func TestLimitRequestsPerSecond(t *testing.T) {
	mc := memcachedtest.Start(t)
	users := writeUsers(t, "alice:secret", "bob:hunter2")
	admin := freeAddr(t)
	p := startMoxiBin(t, fastMoxi(t), "--config", writeConfig(t, limitsConfig(users, "    alice: {requests_per_s: 1000}\n", mc.Addr)), "--admin", admin)
	before := serverOps(t, mc.Addr)

	bob, bobR := login(t, p.addr, "bob", "hunter2")
	stop := make(chan struct{})
	time.AfterFunc(3*time.Second, func() { close(stop) })
	alone := closedLoop(t, bob, bobR, "bob-alone:", stop)

	stop = make(chan struct{})
	var during []time.Duration
	var wg sync.WaitGroup
	wg.Go(func() { during = closedLoop(t, bob, bobR, "bob-flood:", stop) })
	res := flood(t, p.addr, "alice", "secret", 2, 32, 20_000, 10*time.Second) // 20 times her limit
	close(stop)
	wg.Wait()

	elapsed := res.last.Sub(res.first).Seconds()
	want := 1000 + 1000*elapsed // the burst, then the rate
	t.Logf("alice: %d answered, %d refused in %.2f s (want %.0f ± 500: a burst of 1,000 and 1,000/s)", res.answered, res.refused, elapsed, want)
	if d := float64(res.answered) - want; d < -500 || d > 500 {
		t.Errorf("alice: %d answered in %.2f s, want %.0f ± 5 %% of 10,000", res.answered, elapsed, want)
	}
	if res.refused < 10*res.answered {
		t.Errorf("alice: only %d refused: the flood did not reach the limit", res.refused)
	}
	t.Logf("bob: p99 %v alone (%d requests), %v during alice's flood (%d requests); p50 %v, %v",
		p99(alone), len(alone), p99(during), len(during), alone[len(alone)/2], during[len(during)/2])
	if p99(during) > 10*p99(alone) && p99(during) > 5*time.Millisecond {
		t.Errorf("bob's p99: %v during alice's flood, %v alone: more than 10× worse", p99(during), p99(alone))
	}

	served := serverOps(t, mc.Addr) - before
	t.Logf("memcached served %d gets and sets: alice's %d answered + bob's %d", served, res.answered, len(alone)+len(during))
	if want := res.answered + len(alone) + len(during); served != want {
		t.Errorf("memcached served %d gets and sets, want %d: only what was answered", served, want)
	}
	if got := metricValue(t, admin, `moxi_rate_limited_total{user="alice"}`); int(got) != res.refused {
		t.Errorf(`moxi_rate_limited_total{user="alice"} = %v, want %d`, got, res.refused)
	}
	if got := metricValue(t, admin, `moxi_user_requests_total{user="*"}`); int(got) != len(alone)+len(during) {
		t.Errorf(`moxi_user_requests_total{user="*"} = %v, want bob's %d`, got, len(alone)+len(during))
	}
}

// TestLimitAnswers: a multi-key get is charged all or none; a noreply request over the
// limit is dropped and counted; a binary one is answered status 0x0086; a reload that
// changes alice's limit applies to her open connection. None of the refused requests
// reaches the server.
func TestLimitAnswers(t *testing.T) {
	mc := memcachedtest.Start(t)
	users := writeUsers(t, "alice:secret")
	admin := freeAddr(t)
	cfg := writeConfig(t, limitsConfig(users, "    alice: {requests_per_s: 5}\n", mc.Addr))
	p := startMoxi(t, "--config", cfg, "--admin", admin)
	before := serverOps(t, mc.Addr)
	alice, r := login(t, p.addr, "alice", "secret")
	start := time.Now()

	if got := roundTrip(t, alice, r, "get k1 k2 k3 k4\r\n", "END"); got[0] != "END" {
		t.Fatalf("a get of 4 keys with 5 tokens: %q", got)
	}
	if got := roundTrip(t, alice, r, "get k1 k2 k3 k4\r\n", "END"); got[0] != "SERVER_ERROR rate limited" {
		t.Errorf("a get of 4 keys with 1 token: %q, want it refused whole", got)
	}
	// The set takes the last token; the noreply one is dropped, unanswered: the get's
	// answer is the next line.
	if got := roundTrip(t, alice, r, "set a 0 0 1\r\n1\r\nset b 0 0 1 noreply\r\n2\r\nget a\r\n", "END"); !slices.Equal(got, []string{"STORED", "SERVER_ERROR rate limited"}) {
		t.Errorf("set, set noreply, get over the limit: %q", got)
	}
	if time.Since(start) > 150*time.Millisecond {
		t.Logf("the exchanges took %v: a token may have come back meanwhile", time.Since(start))
	}
	if got := metricValue(t, admin, `moxi_rate_limited_total{user="alice"}`); got != 6 {
		t.Errorf(`moxi_rate_limited_total{user="alice"} = %v, want 6 (4 keys, the noreply set, the get)`, got)
	}
	if got := serverOps(t, mc.Addr) - before; got != 5 {
		t.Errorf("memcached served %d gets and sets, want 5", got)
	}

	// Binary: status 0x0086.
	bin, binR := dialConn(t, p.addr)
	auth := append(binaryRequest(0x21, "PLAIN", nil, len("\x00alice\x00secret")), "\x00alice\x00secret"...)
	if _, err := bin.Write(append(auth, binaryRequest(0x00, "k", nil, 0)...)); err != nil {
		t.Fatal(err)
	}
	_ = bin.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, status, _, _ := readPacket(t, binR); status != 0 {
		t.Fatalf("SASL auth: status %#x", status)
	}
	if _, status, _, value := readPacket(t, binR); status != 0x0086 || value != "rate limited" {
		t.Errorf("a binary get over the limit: status %#x %q, want 0x0086", status, value)
	}

	// A reload raises alice's limit: her connection, still open, is served.
	if err := os.WriteFile(cfg, []byte(limitsConfig(users, "    alice: {requests_per_s: 100000}\n", mc.Addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := postReload(t, admin); code != 200 || !strings.Contains(body, "auth.limits.alice.requests_per_s 5 → 100000") {
		t.Fatalf("reload: %d %s", code, body)
	}
	for i := range 100 {
		if got := roundTrip(t, alice, r, fmt.Sprintf("get after%d\r\n", i), "END"); got[0] != "END" {
			t.Fatalf("request %d after the reload: %q", i, got)
		}
	}
	if current := metricValue(t, admin, "moxi_connections_current"); current < 2 {
		t.Errorf("moxi_connections_current %v after the reload: alice's connection was closed", current)
	}
}

// TestLoginFailuresCostTheGuesser: a client that fails logins as fast as it can with user
// names of a megabyte, reconnecting every 3 tries, for 10 s, is paced as one that keeps its
// connection (both measured, each against a moxi of its own); meanwhile clients from
// thousands of addresses fail as fast as they can too. moxi's log grows by under 1 MB, and
// every failure is counted.
func TestLoginFailuresCostTheGuesser(t *testing.T) {
	t.Parallel() // mostly waits out the pacing: beside the other waiting tests
	mc := memcachedtest.Start(t)
	users := writeUsers(t, "alice:secret")
	cfg := writeConfig(t, authConfig(users, false, "", mc.Addr))
	adminA, adminB := freeAddr(t), freeAddr(t)
	a := startMoxi(t, "--config", cfg, "--admin", adminA)
	b := startMoxi(t, "--config", cfg, "--admin", adminB)
	logBefore := len(a.out.String())

	name := strings.Repeat("n", 1<<20-len(" guess")) // the data of a login set, at most max_value_bytes
	attempt := func(c net.Conn, r *bufio.Reader) bool {
		data := name + " guess"
		_ = c.SetDeadline(time.Now().Add(40 * time.Second))
		if _, err := fmt.Fprintf(c, "set auth 0 0 %d\r\n%s\r\n", len(data), data); err != nil {
			return false
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return false
		}
		if line != "CLIENT_ERROR authentication failure\r\n" {
			t.Errorf("a failed login: %q", line)
		}
		return true
	}
	const d = 10 * time.Second
	var reconnecting, keeping int
	var sprayed atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	wg.Go(func() { // reconnects every 3 tries
		for time.Now().Before(end) {
			c, err := net.Dial("tcp", a.addr)
			if err != nil {
				t.Error(err)
				return
			}
			r := bufio.NewReader(c)
			for range 3 {
				if !time.Now().Before(end) || !attempt(c, r) {
					break
				}
				reconnecting++
			}
			c.Close()
		}
	})
	wg.Go(func() { // keeps its connection, to the other moxi
		c, err := net.Dial("tcp", b.addr)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for time.Now().Before(end) && attempt(c, r) {
			keeping++
		}
	})
	for g := range 4 { // from addresses of 127/8 of their own, one try each
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				n := 1 + g*1_000_000 + i
				src := &net.TCPAddr{IP: net.IPv4(127, byte(n>>16), byte(n>>8), byte(n))}
				if src.IP[15] == 0 || src.IP[15] == 255 {
					continue
				}
				c, err := (&net.Dialer{LocalAddr: src}).Dial("tcp", a.addr)
				if err != nil {
					t.Errorf("from %v: %v", src, err)
					return
				}
				if attempt(c, bufio.NewReader(c)) {
					sprayed.Add(1)
				}
				c.Close()
			}
		})
	}
	wg.Wait()

	grown := len(a.out.String()) - logBefore
	t.Logf("reconnecting every 3 tries: %d attempts in %v (%.2f/s); keeping one connection: %d (%.2f/s); from %d other addresses: %d attempts; moxi's log grew %d bytes",
		reconnecting, d, float64(reconnecting)/d.Seconds(), keeping, float64(keeping)/d.Seconds(), sprayed.Load(), sprayed.Load(), grown)
	if keeping < 4 || reconnecting > keeping+keeping/2+1 {
		t.Errorf("reconnecting every 3 tries: %d attempts, keeping one connection: %d: reconnecting is not paced alike", reconnecting, keeping)
	}
	if grown > 1<<20 {
		t.Errorf("moxi's log grew %d bytes, want at most 1 MB", grown)
	}
	logged := a.out.String()[logBefore:]
	for _, what := range []string{"client authentication failed", "client authentication failures not logged"} {
		i := strings.Index(logged, what)
		if i < 0 {
			t.Errorf("no log line %q", what)
			continue
		}
		start := strings.LastIndexByte(logged[:i], '\n') + 1
		line, _, _ := strings.Cut(logged[start:], "\n")
		t.Logf("a log line: %s", line)
	}
	if got := metricValue(t, adminA, "moxi_auth_failures_total"); int64(got) != int64(reconnecting)+sprayed.Load() {
		t.Errorf("moxi_auth_failures_total = %v, want the %d failures the clients saw", got, int64(reconnecting)+sprayed.Load())
	}
	if got := metricValue(t, adminB, "moxi_auth_failures_total"); int(got) != keeping {
		t.Errorf("the other moxi's moxi_auth_failures_total = %v, want %d", got, keeping)
	}
	// A client that knows the password is served at once, however its address failed.
	start := time.Now()
	c, r := login(t, a.addr, "alice", "secret")
	roundTrip(t, c, r, "get k\r\n", "END")
	t.Logf("a login with the right password after the guesses: %v", time.Since(start))
}
