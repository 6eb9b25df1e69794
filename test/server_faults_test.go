package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// binaryFake is a binary-protocol server that answers every request with what answer
// writes on its connection, until answer fails or the test ends.
func binaryFake(t *testing.T, answer func(c net.Conn, req *protocol.Request) error) string {
	t.Helper()
	return memcachedtest.StartFake(t, func(c net.Conn) {
		defer c.Close()
		dec := protocol.NewBinaryReader(bufio.NewReader(c), protocol.DefaultLimits())
		var req protocol.Request
		for dec.Read(&req) == nil {
			if answer(c, &req) != nil {
				return
			}
		}
	}).Addr
}

// drip answers any request with a header announcing a 1 MB body, then sends the body one
// byte per 100 ms: never silent, so a timeout that measures silence never ends it.
func drip(c net.Conn, req *protocol.Request) error {
	if _, err := c.Write(memcachedtest.BinaryHeader(req, 0x81, 0, 0, 1_000_000)); err != nil {
		return err
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		if _, err := c.Write([]byte{'x'}); err != nil {
			return err // moxi closed the connection
		}
	}
	return nil
}

// TestDrippingServer: a server that starts a 1 MB answer and then sends a byte per 100 ms
// makes its key's get answer SERVER_ERROR within timeout × (retries+1) + 1 s (checked with
// a margin), counted as a timeout, and the server is marked dead; the other server's keys
// are served meanwhile.
func TestDrippingServer(t *testing.T) {
	mc := memcachedtest.Start(t)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, resilientConfig(false, mc.Addr, binaryFake(t, drip))), "--admin", admin)
	bad, good := keysOf(1, 2, 3)
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	contract := time.Duration(testRetries+1)*testTimeout + time.Second
	const bound = 3 * time.Second
	start := time.Now()
	ans, err := c.get(bad[0])
	d := time.Since(start)
	t.Logf("get from a dripping server: %q after %v (contract %v, checked ≤ %v)", ans, d.Round(time.Millisecond), contract, bound)
	if err != nil || !strings.HasPrefix(ans, "SERVER_ERROR") {
		t.Fatalf("get %s from the dripping server: %q %v; want SERVER_ERROR", bad[0], ans, err)
	}
	if d > bound {
		t.Errorf("SERVER_ERROR after %v; want ≤ %v", d, bound)
	}
	for _, k := range good {
		if ans, err := c.set(k, "ok"); err != nil || ans != "STORED" {
			t.Errorf("set %s on the good server: %q %v", k, ans, err)
		}
	}
	waitUntil(t, start, 20*time.Second, func() bool { return serverStates(t, admin)["s1"] == "dead" })
	if n := metricValue(t, admin, `moxi_backend_errors_total{kind="timeout",pool="main",server="s1"}`); n < 1 {
		t.Errorf("the dripping server's timeouts: %v, want ≥ 1", n)
	}
}

// serverStates is GET /servers as a map from server name to state.
func serverStates(t *testing.T, admin string) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/servers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var servers []struct{ Name, State string }
	if err := json.NewDecoder(resp.Body).Decode(&servers); err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(servers))
	for _, s := range servers {
		out[s.Name] = s.State
	}
	return out
}

// TestOwnErrorsAtDial: a moxi out of file descriptors fails requests whose connections it
// cannot dial, but never holds that against the servers: after 100 clients at once on a
// limit of 64 descriptors, every server is up, none was ever marked dead, none counts a
// connect error, and a fresh client is served.
func TestOwnErrorsAtDial(t *testing.T) {
	mcs := cluster(t, 3)
	admin := freeAddr(t)
	// Meta requests open their server connections on first use, so they dial while the
	// clients hold every descriptor.
	moxi := startMoxiLimited(t, 64, "--config", writeConfig(t, resilientConfig(false, addrs(mcs)...)), "--admin", admin)

	const clients = 100
	var answered, failed atomic.Int64
	withClientsAtOnce(t, moxi.addr, clients, func(w int, tc *textClient) {
		_ = tc.c.SetDeadline(time.Now().Add(3 * time.Second))
		for i := range 10 {
			k := fmt.Sprintf("fd:%d:%d", w, i)
			for _, cmd := range []string{"set " + k + " 0 0 1\r\nv\r\n", "get " + k + "\r\n", "ms " + k + " 1\r\nv\r\n", "mg " + k + " v\r\n"} {
				if _, err := tc.c.Write([]byte(cmd)); err != nil {
					return
				}
				line, err := readAnswer(tc.r)
				switch {
				case err != nil:
					return
				case strings.HasPrefix(line, "SERVER_ERROR"):
					failed.Add(1)
				default:
					answered.Add(1)
				}
			}
		}
	})
	t.Logf("%d clients at once with 64 descriptors: %d answers, %d SERVER_ERROR", clients, answered.Load(), failed.Load())

	start := time.Now()
	took := waitUntil(t, start, 15*time.Second, func() bool {
		c, err := dialText(moxi.addr)
		if err != nil {
			return false
		}
		defer c.Close()
		ans, err := c.set("fresh", "1")
		v, err2 := c.get("fresh")
		return err == nil && ans == "STORED" && err2 == nil && v == "1"
	})
	t.Logf("a fresh client served %v after the clients closed", took.Round(time.Millisecond))
	states := serverStates(t, admin)
	if len(states) != len(mcs) {
		t.Errorf("/servers lists %v, want %d servers", states, len(mcs))
	}
	for name, state := range states {
		if state != "up" {
			t.Errorf("/servers: %s is %q after moxi ran out of descriptors, want up", name, state)
		}
	}
	overload := 0.0
	for i := range mcs {
		s := fmt.Sprintf(`pool="main",server="s%d"`, i)
		if n := counterValue(t, admin, `moxi_backend_errors_total{kind="connect",`+s+`}`); n != 0 {
			t.Errorf("s%d counts %v connect errors for moxi's own want of descriptors", i, n)
		}
		overload += counterValue(t, admin, `moxi_backend_errors_total{kind="overload",`+s+`}`)
	}
	t.Logf("requests failed for want of descriptors, counted as overload: %v", overload)
	if overload == 0 {
		t.Error("no request failed for want of descriptors: the test did not exhaust moxi's")
	}
	if n := strings.Count(moxi.out.String(), "backend marked dead"); n != 0 {
		t.Errorf("%d servers marked dead for moxi's own want of descriptors:\n%s", n, moxi.out.String())
	}
}

// startMoxiLimited is startMoxi with at most nofile open file descriptors.
func startMoxiLimited(t *testing.T, nofile int, args ...string) *process {
	t.Helper()
	addr := freeAddr(t)
	for slices.Contains(args, addr) {
		addr = freeAddr(t)
	}
	all := append([]string{fmt.Sprintf("--nofile=%d:%d", nofile, nofile), moxiBin, "--listen", addr}, args...)
	return launch(t, addr, requireBinary(t, "prlimit"), true, all)
}

// withClientsAtOnce runs f on n goroutines, each with a text connection of its own to addr,
// once all n have connected (a connection moxi has not accepted yet counts as connected),
// and waits for them.
func withClientsAtOnce(t *testing.T, addr string, n int, f func(w int, tc *textClient)) {
	var dialed, done sync.WaitGroup
	dialed.Add(n)
	for w := range n {
		done.Add(1)
		go func() {
			defer done.Done()
			tc, err := dialText(addr)
			dialed.Done()
			if err != nil {
				t.Error(err)
				return
			}
			defer tc.Close()
			dialed.Wait()
			f(w, tc)
		}()
	}
	done.Wait()
}

// readAnswer reads a whole answer to a set, get, ms or mg and returns its first line.
func readAnswer(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	rest := 0 // lines after the first
	switch {
	case strings.HasPrefix(line, "VALUE "):
		rest = 2 // the data, END
	case strings.HasPrefix(line, "VA "):
		rest = 1 // the data
	}
	for range rest {
		if _, err := r.ReadString('\n'); err != nil {
			return "", err
		}
	}
	return line, nil
}

// errorAnswer is a temporary failure (0x0086) answer to req with text as its message.
func errorAnswer(req *protocol.Request, text string) []byte {
	return append(memcachedtest.BinaryHeader(req, 0x81, 0x86, 0, uint32(len(text))), text...)
}

// TestServerTextOneLine: whatever a server answers, a text client gets exactly one
// SERVER_ERROR line for its request, and its next request gets its own answer: an error
// text with line breaks arrives on one line, and a malformed answer closes the server
// connection without reaching the client.
func TestServerTextOneLine(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	forged := "oops\r\nVALUE k 0 6\r\nforged\r\nEND"
	answers := []struct {
		name   string
		answer func(req *protocol.Request) []byte
	}{
		{"error text with line breaks", func(req *protocol.Request) []byte { return errorAnswer(req, forged) }},
		{"NUL in error text", func(req *protocol.Request) []byte { return errorAnswer(req, "oops\x00END") }},
		{"bad magic", func(req *protocol.Request) []byte {
			return append(memcachedtest.BinaryHeader(req, 0x80, 0, 0, 9), "VALUE k 0"...)
		}},
		{"extras longer than the body", func(req *protocol.Request) []byte {
			return append(memcachedtest.BinaryHeader(req, 0x81, 0, 200, 9), "\r\nEND\r\n\r\n"...)
		}},
	}
	for _, a := range answers {
		t.Run(a.name, func(t *testing.T) {
			fake := binaryFake(t, func(c net.Conn, req *protocol.Request) error {
				out := a.answer(req)
				if req.Op == protocol.OpNoop { // the prober's: answered properly
					out = memcachedtest.BinaryHeader(req, 0x81, 0, 0, 0)
				}
				_, err := c.Write(out)
				return err
			})
			conf := fmt.Sprintf("pools:\n  main:\n    timeout: 2s\n    servers: [%s]\n", fake)
			moxi := startMoxi(t, "--config", writeConfig(t, conf))
			c, err := net.Dial("tcp", moxi.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r := bufio.NewReader(c)
			for i := range 3 {
				lines := roundTrip(t, c, r, "get k\r\n", "END")
				if len(lines) != 1 || !strings.HasPrefix(lines[0], "SERVER_ERROR ") || strings.ContainsAny(lines[0], "\x00\r") {
					t.Fatalf("get %d: %q, want one SERVER_ERROR line", i, lines)
				}
				t.Logf("get %d: %q", i, lines[0])
				if _, err := c.Write([]byte("version\r\n")); err != nil {
					t.Fatal(err)
				}
				if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "VERSION ") {
					t.Fatalf("version after the server's answer: %q %v", line, err)
				}
			}
		})
	}
}
