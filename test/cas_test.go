package test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestCasZeroAsMemcached: "cas k … 0" compares with a unique no item has — EXISTS for an
// existing key (which keeps its value), NOT_FOUND for a missing one — through moxi as from
// memcached itself (memcached's t/getset.t checks it). The binary protocol's cas 0 means
// "no check", so moxi must not pass it on as a set.
func TestCasZeroAsMemcached(t *testing.T) {
	mc := memcachedtest.Start(t)
	direct := memcachedtest.Start(t)
	moxi := startMoxi(t, "--config", writeConfig(t, poolConfig("", mc.Addr)))
	script := "set moo 0 0 3\r\nold\r\n" +
		"cas moo 0 0 6 0\r\nbarva2\r\n" +
		"get moo\r\n" +
		"cas missing 0 0 6 0\r\nbarva2\r\n" +
		"get missing\r\n"
	answers := func(addr string) string {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Write([]byte(script)); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(nc)
		var out string
		for range 7 { // STORED, EXISTS, VALUE…, old, END, NOT_FOUND, END
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: after %q: %v", addr, out, err)
			}
			out += line
		}
		return out
	}
	want, got := answers(direct.Addr), answers(moxi.addr)
	if got != want {
		t.Errorf("through moxi:\n%q\nmemcached:\n%q", got, want)
	}
}
