//go:build linux

package frontend_test

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestRequestsSplitAnywhere: a stream of requests cut in two at every byte, the second part
// sent only once the server has read the first, is answered exactly as the stream sent
// whole. The server serves requests that came whole without leaving its wait for the
// socket; a request that came in part is decoded again, from its first byte, once the rest
// has come, and a rejected request's body that came in part goes on being dropped.
func TestRequestsSplitAnywhere(t *testing.T) {
	lim := protocol.DefaultLimits()
	lim.MaxValueBytes = 8 // the rejected bodies below stay short
	ts := startServer(t, &frontend.Server{Handler: newProxy(t), Limits: lim})

	text := "set a 0 0 5\r\nhello\r\nget a\r\n" +
		"set big 0 0 20 noreply\r\n" + strings.Repeat("x", 20) + "\r\n" + // rejected, no answer: its body is dropped
		"set big2 0 0 12\r\n" + strings.Repeat("y", 12) + "\r\n" +
		"mg a v\r\nms b 3\r\nxyz\r\nms c 20\r\n" + strings.Repeat("z", 20) + "\r\n" +
		"get a b\r\ndelete a\r\nget a\r\n"
	t.Run("text", func(t *testing.T) {
		c := dial(t, ts.addr)
		c.send([]byte(text + "version\r\n"))
		var whole []byte
		for !bytes.HasSuffix(whole, []byte(versionAnswer)) {
			whole = append(whole, c.read(1)...)
		}
		want := whole[:len(whole)-len(versionAnswer)]
		sc := ts.ln.conn(0)
		for k := 1; k < len(text); k++ {
			sendSplit(t, c, sc, []byte(text), k)
			if got := c.read(len(want)); !bytes.Equal(got, want) {
				t.Fatalf("cut after %d bytes (%q | %q):\ngot  %q\nwant %q", k, text[:k], text[k:], got, want)
			}
		}
	})

	ext := make([]byte, 8)
	bin := bytes.Join([][]byte{
		binSet(1, "a", "hello", 7),
		binRequest(opGetK, 2, nil, []byte("a"), nil),
		binSet(3, "big", strings.Repeat("x", 12), 0),               // too large: its body is dropped
		binRequest(0x40, 4, nil, nil, []byte("xyz")),               // an unknown opcode: likewise
		binRequest(opGetQ, 5, nil, []byte("nothing"), nil),         // a quiet miss: no answer
		binRequest(opSet, 6, ext, []byte("b"), []byte("12345678")), // the largest value
		binRequest(opGetK, 7, nil, []byte("b"), nil),
	}, nil)
	t.Run("binary", func(t *testing.T) {
		c := dial(t, ts.addr)
		noop := binRequest(opNoop, 99, nil, nil, nil)
		c.send(append(bin[:len(bin):len(bin)], noop...))
		var want []binAnswer
		for a := c.readBinary(); a.Opcode != opNoop; a = c.readBinary() {
			want = append(want, a)
		}
		sc := ts.ln.conn(1)
		for k := 1; k < len(bin); k++ {
			sendSplit(t, c, sc, bin, k)
			for i, w := range want {
				if got := c.readBinary(); got != w {
					t.Fatalf("cut after %d bytes, answer %d: got %+v, want %+v", k, i, got, w)
				}
			}
		}
	})
}

// sendSplit sends stream in two writes cut after k bytes, the second once the server's end
// sc has read the first (its receive queue is empty: loopback queues a write before it
// returns).
func sendSplit(t *testing.T, c *client, sc net.Conn, stream []byte, k int) {
	t.Helper()
	c.send(stream[:k])
	raw, err := sc.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	unread := func() int {
		n := int32(-1)
		_ = raw.Control(func(fd uintptr) {
			_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
		})
		return int(n)
	}
	waitFor(t, fmt.Sprintf("the server to read the first %d bytes", k), func() bool { return unread() == 0 })
	c.send(stream[k:])
	_ = c.nc.SetDeadline(time.Now().Add(10 * time.Second))
}
