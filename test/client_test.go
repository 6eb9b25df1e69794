package test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// textClient is a minimal memcached text client whose errors are values, for load loops
// running outside the test goroutine.
type textClient struct {
	c net.Conn
	r *bufio.Reader
}

func dialText(addr string) (*textClient, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	return &textClient{c: c, r: bufio.NewReader(c)}, nil
}

func (tc *textClient) Close() error { return tc.c.Close() }

// line sends cmd and returns the first line of the answer (for get: the value, or "" for a
// miss), or the SERVER_ERROR/CLIENT_ERROR line.
func (tc *textClient) call(cmd string) (string, error) {
	_ = tc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := tc.c.Write([]byte(cmd)); err != nil {
		return "", err
	}
	line, err := tc.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if !strings.HasPrefix(line, "VALUE ") {
		if line == "END" {
			return "", nil
		}
		return line, nil
	}
	var key string
	var flags, n int
	if _, err := fmt.Sscanf(line, "VALUE %s %d %d", &key, &flags, &n); err != nil {
		return "", fmt.Errorf("bad VALUE line %q", line)
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(tc.r, buf); err != nil {
		return "", err
	}
	end, err := tc.r.ReadString('\n')
	if err != nil || end != "END\r\n" {
		return "", fmt.Errorf("after value: %q %v", end, err)
	}
	return string(buf[:n]), nil
}

func (tc *textClient) get(key string) (string, error) { return tc.call("get " + key + "\r\n") }

func (tc *textClient) set(key, value string) (string, error) {
	return tc.call(fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", key, len(value), value))
}

// withClients runs f on n goroutines, each with a text connection of its own to addr (w is
// the goroutine's number), and waits for them.
func withClients(t testing.TB, addr string, n int, f func(w int, tc *textClient)) {
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tc, err := dialText(addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer tc.Close()
			f(w, tc)
		}()
	}
	wg.Wait()
}

// binaryRequest is a binary-protocol request header with its extras and key, announcing
// a value of valueLen bytes that does not follow.
func binaryRequest(opcode byte, key string, extras []byte, valueLen int) []byte {
	h := make([]byte, 24, 24+len(extras)+len(key))
	h[0], h[1] = 0x80, opcode
	binary.BigEndian.PutUint16(h[2:], uint16(len(key)))
	h[4] = byte(len(extras))
	binary.BigEndian.PutUint32(h[8:], uint32(len(extras)+len(key)+valueLen))
	h = append(h, extras...)
	return append(h, key...)
}
