package test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/moxi-proxy/moxi/internal/tlstest"
)

// TestListeners runs a moxi with two more client ports (twemproxy's listen per pool): keys
// no route matches go to each port's own default pool — a real client (gomemcache) on each
// port, the servers read directly — routes apply on every port, a port's TLS is its own,
// and max_connections counts the clients of every port together.
func TestListeners(t *testing.T) {
	a, b := cluster(t, 1)[0], cluster(t, 1)[0]
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	cert := ca.Issue(t, dir, "moxi")
	second, secure := freeAddr(t), freeAddr(t)
	cfg := fmt.Sprintf(`watch_config: false
limits: {max_connections: 6}
listeners:
  - {listen: %q, default_pool: b}
  - {listen: %q, default_pool: b, tls: {cert: %s, key: %s}}
pools:
  a: {timeout: 2s, servers: [%q]}
  b: {timeout: 2s, servers: [%q]}
default_pool: a
routes:
  - {prefix: "r:", pool: a}
`, second, secure, cert.CertFile, cert.KeyFile, a.Addr, b.Addr)
	moxi := startMoxi(t, "--config", writeConfig(t, cfg))
	for _, addr := range []string{second, secure} {
		if err := waitDial(addr, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}

	onMain, onSecond := memcache.New(moxi.addr), memcache.New(second)
	defer onMain.Close()
	defer onSecond.Close()
	set := func(c *memcache.Client, key string) {
		t.Helper()
		if err := c.Set(&memcache.Item{Key: key, Value: []byte("v:" + key)}); err != nil {
			t.Fatalf("set %s: %v", key, err)
		}
	}
	set(onMain, "main-key")
	set(onSecond, "second-key")
	set(onSecond, "r:routed")
	for key, server := range map[string]string{"main-key": a.Addr, "second-key": b.Addr, "r:routed": a.Addr} {
		other := a.Addr
		if server == a.Addr {
			other = b.Addr
		}
		if !storedOn(t, server, key) || storedOn(t, other, key) {
			t.Errorf("%s: not on %s alone", key, server)
		}
	}
	// Reads follow the same rule: the main port's key is not in the second port's pool.
	if _, err := onSecond.Get("main-key"); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Errorf("get main-key on the second port: %v, want a miss", err)
	}
	got, err := onSecond.GetMulti([]string{"second-key", "r:routed", "main-key"})
	if err != nil || len(got) != 2 || string(got["second-key"].Value) != "v:second-key" || string(got["r:routed"].Value) != "v:r:routed" {
		t.Errorf("get_multi on the second port: %v %v", got, err)
	}
	c, err := net.Dial("tcp", second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkBinary(t, c, bufio.NewReader(c), "second:bin:") // pipelined binary on the second port

	// The TLS port speaks TLS; the others stay plain.
	tc := mustDialTLS(t, secure, ca.Pool())
	if got := roundTrip(t, tc, tc.r, "set tls-key 0 0 1\r\nx\r\n", "STORED"); len(got) != 1 {
		t.Fatalf("set over TLS: %q", got)
	}
	if !storedOn(t, b.Addr, "tls-key") {
		t.Error("tls-key is not on the TLS port's default pool")
	}
	if _, err := dialTLS(moxi.addr, ca.Pool()); err == nil {
		t.Error("a TLS handshake on the plain main port succeeded")
	}

	// max_connections counts every port's clients: 4 open here (gomemcache's two idle
	// ones, the binary one and the TLS one), two more fill it, the next is refused on
	// whichever port.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused := false
	for i := 0; i < 4 && !refused; i++ {
		c, err := net.Dial("tcp", []string{moxi.addr, second}[i%2])
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("version\r\n")); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		refused = strings.HasPrefix(line, "SERVER_ERROR too many connections")
		if !refused && !strings.HasPrefix(line, "VERSION ") {
			t.Fatalf("connection %d: %q", i, line)
		}
	}
	if !refused {
		t.Error("no connection refused past max_connections over both ports")
	}
}

// storedOn reports whether the memcached at addr holds key.
func storedOn(t *testing.T, addr, key string) bool {
	t.Helper()
	c := memcache.New(addr)
	defer c.Close()
	_, err := c.Get(key)
	if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("get %s from %s: %v", key, addr, err)
	}
	return err == nil
}

// waitDial waits until addr accepts connections.
func waitDial(addr string, timeout time.Duration) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(timeout); ; <-tick.C {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not accept connections: %w", addr, err)
		}
	}
}
