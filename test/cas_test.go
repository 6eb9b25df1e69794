package test

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestCasZeroAsMemcached: "cas k … 0" compares with a unique no item has — EXISTS for an
// existing key (which keeps its value), NOT_FOUND for a missing one — through moxi in front
// of memcached and from moxi's embedded store, as from memcached itself (memcached's
// t/getset.t checks it). In the binary protocol a cas of 0 means "no check": a set, so moxi
// must pass it on as memcached takes it, not turn it into the text rule.
func TestCasZeroAsMemcached(t *testing.T) {
	mc := memcachedtest.Start(t)
	direct := memcachedtest.Start(t)
	proxied := startMoxi(t, "--config", writeConfig(t, poolConfig("", mc.Addr)))
	embedded := startMoxi(t)
	text := func(addr string) string {
		nc := dialFor(t, addr)
		defer nc.Close()
		script := "set moo 0 0 3\r\nold\r\n" +
			"cas moo 0 0 6 0\r\nbarva2\r\n" +
			"get moo\r\n" +
			"cas missing 0 0 6 0\r\nbarva2\r\n" +
			"get missing\r\n"
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
	bin := func(addr string) string {
		nc := dialFor(t, addr)
		defer nc.Close()
		ext := binary.BigEndian.AppendUint64(nil, 0) // flags 0, exptime 0
		var script []byte
		script = append(script, binPacket(0x01, 1, ext, "bmoo", []byte("old"))...)    // set
		script = append(script, binPacket(0x01, 2, ext, "bmoo", []byte("barva2"))...) // set, cas 0
		script = append(script, binPacket(0x0c, 3, nil, "bmoo", nil)...)              // getk
		script = append(script, binPacket(0x01, 4, ext, "bmissing", []byte("x"))...)  // set, cas 0
		script = append(script, binPacket(0x0c, 5, nil, "bmissing", nil)...)          // getk
		if _, err := nc.Write(script); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(nc)
		var out []byte
		for range 5 {
			hdr := make([]byte, 24)
			if _, err := io.ReadFull(r, hdr); err != nil {
				t.Fatalf("%s: after %q: %v", addr, out, err)
			}
			body := make([]byte, binary.BigEndian.Uint32(hdr[8:12]))
			if _, err := io.ReadFull(r, body); err != nil {
				t.Fatal(err)
			}
			clear(hdr[16:24]) // the cas values are each server's own
			out = append(append(out, hdr...), body...)
		}
		return string(out)
	}
	for _, proto := range []struct {
		name    string
		answers func(addr string) string
	}{{"text", text}, {"binary", bin}} {
		want := proto.answers(direct.Addr)
		for _, target := range []struct{ name, addr string }{{"proxied", proxied.addr}, {"embedded", embedded.addr}} {
			if got := proto.answers(target.addr); got != want {
				t.Errorf("%s, %s:\n%q\nmemcached:\n%q", proto.name, target.name, got, want)
			}
		}
	}
}

// dialFor connects to addr with a deadline for the whole exchange.
func dialFor(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	return nc
}
