//go:build linux

package backend

import (
	"context"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestAnswersSplitAnywhere: two pipelined answers cut in two at every byte, the second part
// sent only once moxi has read the first, complete their gets exactly as when sent whole:
// answers that came whole are decoded inside the wait for the socket, and one that came in
// part is decoded again, from its first byte, once the rest has come.
func TestAnswersSplitAnywhere(t *testing.T) {
	values := []string{"first value", "second, longer value"}
	answer := func(req *protocol.Request, value string) []byte {
		b := memcachedtest.BinaryHeader(req, 0x81, 0, 4, uint32(4+len(value)))
		return append(append(b, 0, 0, 0, 7), value...) // flags 7
	}
	streamLen := 2*(24+4) + len(values[0]) + len(values[1])
	cuts := make(chan int)
	cutRead := make(chan struct{})
	f := startRawFake(t, func(c net.Conn) {
		var stream []byte
		binaryRequests(c, func(req *protocol.Request) error {
			// Each get's key says which value it wants; its answer takes its opaque.
			stream = append(stream, answer(req, values[req.Keys[0][0]-'0'])...)
			if len(stream) < streamLen {
				return nil
			}
			k := <-cuts
			if _, err := c.Write(stream[:k]); err != nil {
				return err
			}
			<-cutRead
			_, err := c.Write(stream[k:])
			stream = stream[:0]
			return err
		})
	})
	s := newServer(t, f.Addr, Options{Connections: 1, Timeout: 10 * time.Second})
	for k := 1; k < streamLen; k++ {
		var wg sync.WaitGroup
		got, errs := make([]protocol.Response, 2), make([]error, 2)
		for i := range 2 {
			wg.Go(func() {
				errs[i] = pool.Do(context.Background(), s, nil, &protocol.Request{Op: protocol.OpGet, Keys: keys(fmt.Sprint(i))}, got[i:i+1])
			})
		}
		cuts <- k
		nc := s.conns[0].socket()
		waitFor(t, fmt.Sprintf("moxi to read the first %d bytes", k), func() bool { return unread(nc) == 0 })
		cutRead <- struct{}{}
		wg.Wait()
		for i, r := range got {
			if errs[i] != nil {
				t.Fatalf("cut after %d bytes: get %d: %v", k, i, errs[i])
			}
			if string(r.Value) != values[i] || r.Flags != 7 {
				t.Fatalf("cut after %d bytes: get %d answered %q flags %d, want %q flags 7", k, i, r.Value, r.Flags, values[i])
			}
		}
	}
}

// socket is c's connection to the server now.
func (c *conn) socket() net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nc
}

// unread is how many bytes wait in nc's receive queue.
func unread(nc net.Conn) int {
	raw, err := nc.(syscall.Conn).SyscallConn()
	if err != nil {
		return -1
	}
	n := int32(-1)
	_ = raw.Control(func(fd uintptr) {
		_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	})
	return int(n)
}
