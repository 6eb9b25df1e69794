package test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// tooLarge is a value over memcached's (and moxi's default) 1 MiB item limit.
const tooLarge = 1049600

// TestTooLargeSetUnlinks: a set refused as too large leaves no older value readable —
// memcached unlinks the item under the key — text and binary, through moxi in front of
// memcached and from moxi's embedded store, answered byte for byte as memcached answers.
func TestTooLargeSetUnlinks(t *testing.T) {
	direct := memcachedtest.Start(t)
	mc := memcachedtest.Start(t)
	proxied := startMoxi(t, "--config", writeConfig(t, poolConfig("", mc.Addr)))
	embedded := startMoxi(t)

	big := bytes.Repeat([]byte{'x'}, tooLarge)
	text := func(addr string) string {
		var in bytes.Buffer
		in.WriteString("set k 0 0 3\r\nold\r\n")
		fmt.Fprintf(&in, "set k 0 0 %d\r\n%s\r\n", tooLarge, big)
		in.WriteString("get k\r\nadd k2 0 0 3\r\nold\r\n")
		fmt.Fprintf(&in, "add k2 0 0 %d\r\n%s\r\n", tooLarge, big) // only a set unlinks
		in.WriteString("get k2\r\n")
		return exchange(t, addr, in.Bytes(), func(r *bufio.Reader) string {
			var out strings.Builder
			for range 7 { // STORED, SERVER_ERROR, END, STORED, SERVER_ERROR, VALUE, old, END
				line, err := r.ReadString('\n')
				if err != nil {
					t.Fatalf("%s: after %q: %v", addr, out.String(), err)
				}
				out.WriteString(line)
			}
			line, _ := r.ReadString('\n')
			return out.String() + line
		})
	}
	bin := func(addr string) string {
		var in bytes.Buffer
		ext := binary.BigEndian.AppendUint64(nil, 0)
		in.Write(binPacket(0x01, 1, ext, "k", []byte("old")))
		in.Write(binPacket(0x01, 2, ext, "k", big))
		in.Write(binPacket(0x00, 3, nil, "k", nil))
		return exchange(t, addr, in.Bytes(), func(r *bufio.Reader) string {
			var out strings.Builder
			for range 3 {
				hdr := make([]byte, 24)
				if _, err := io.ReadFull(r, hdr); err != nil {
					t.Fatalf("%s: %v", addr, err)
				}
				body := make([]byte, binary.BigEndian.Uint32(hdr[8:12]))
				if _, err := io.ReadFull(r, body); err != nil {
					t.Fatalf("%s: %v", addr, err)
				}
				clear(hdr[16:24]) // cas differs between servers
				fmt.Fprintf(&out, "%x %q\n", hdr, body)
			}
			return out.String()
		})
	}
	for _, tc := range []struct {
		name string
		run  func(string) string
	}{{"text", text}, {"binary", bin}} {
		want := tc.run(direct.Addr)
		for _, target := range []struct{ name, addr string }{{"proxied", proxied.addr}, {"embedded", embedded.addr}} {
			if got := tc.run(target.addr); got != want {
				t.Errorf("%s, %s:\n%s\nmemcached:\n%s", tc.name, target.name, got, want)
			}
		}
	}
}

// exchange writes in to a fresh connection to addr and returns what read makes of the answer.
func exchange(t *testing.T, addr string, in []byte, read func(*bufio.Reader) string) string {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	go nc.Write(in) // the answers may come before the whole input is read
	return read(bufio.NewReader(nc))
}

// binPacket is a binary request packet.
func binPacket(opcode uint8, opaque uint32, ext []byte, key string, value []byte) []byte {
	h := make([]byte, 24)
	h[0], h[1] = 0x80, opcode
	binary.BigEndian.PutUint16(h[2:4], uint16(len(key)))
	h[4] = byte(len(ext))
	binary.BigEndian.PutUint32(h[8:12], uint32(len(ext)+len(key)+len(value)))
	binary.BigEndian.PutUint32(h[12:16], opaque)
	return append(append(append(h, ext...), key...), value...)
}
