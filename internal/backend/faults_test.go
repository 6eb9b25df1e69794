package backend

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/sockpeek"
)

// startRawFake is a server whose every connection serve handles, byte for byte; the
// connection is closed when serve returns.
func startRawFake(t *testing.T, serve func(c net.Conn)) *memcachedtest.Fake {
	return memcachedtest.StartFake(t, func(c net.Conn) {
		defer c.Close()
		serve(c)
	})
}

// binaryRequests calls answer for each binary request read from c, until either fails.
func binaryRequests(c net.Conn, answer func(req *protocol.Request) error) {
	dec := protocol.NewBinaryReader(bufio.NewReader(c), protocol.DefaultLimits())
	var req protocol.Request
	for dec.Read(&req) == nil && answer(&req) == nil {
	}
}

// dripFrom sends head, then a byte per 100 ms until the connection fails: an answer that
// never ends, and is never silent for long.
func dripFrom(c net.Conn, head []byte) error {
	if _, err := c.Write(head); err != nil {
		return err
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		if _, err := c.Write([]byte{'x'}); err != nil {
			return err
		}
	}
	return nil
}

// TestDrippingAnswerTimesOut: a server that announces a 1 MB answer and then sends a byte
// per 100 ms fails its request as a timeout, binary and meta alike, long before the
// timeout (which measures silence, and a drip is never silent); failure_limit such
// answers mark the server dead.
func TestDrippingAnswerTimesOut(t *testing.T) {
	tests := []struct {
		name  string
		serve func(c net.Conn)
		req   func(t *testing.T) *protocol.Request
	}{
		{"binary", func(c net.Conn) {
			binaryRequests(c, func(req *protocol.Request) error {
				return dripFrom(c, memcachedtest.BinaryHeader(req, 0x81, 0, 0, 1_000_000))
			})
		}, func(*testing.T) *protocol.Request { return &protocol.Request{Op: protocol.OpGet, Keys: keys("k")} }},
		{"meta", func(c net.Conn) {
			if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
				_ = dripFrom(c, []byte("VA 1000000\r\n"))
			}
		}, func(t *testing.T) *protocol.Request { return metaRequest(t, "mg k v\r\n") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := startRawFake(t, tt.serve)
			const timeout = 10 * time.Second
			s := newServer(t, f.Addr, Options{Connections: 1, Timeout: timeout, FailureLimit: 2, RetryMin: time.Hour, RetryMax: time.Hour})
			for i := range 2 {
				// The connection the first answer closed is redialed in the background: a
				// request before that would find it down (a failure of its own).
				waitFor(t, "the connection redialed", func() bool { return s.Counters().ConnectionsUp > 0 && metaUp(s) })
				start := time.Now()
				var resps [1]protocol.Response
				err := pool.Do(context.Background(), s, nil, tt.req(t), resps[:])
				d := time.Since(start)
				t.Logf("request %d: %v after %v (pace %d KiB per %v, timeout %v)", i, err, d, answerPaceBytes>>10, answerPaceWindow, timeout)
				if !errors.Is(err, errSlowAnswer) || !errors.Is(err, ErrTimeout) {
					t.Fatalf("request %d: %v, want a slow answer, as a timeout", i, err)
				}
				if d >= timeout {
					t.Errorf("request %d failed after %v, the silence timeout; the pace must end it sooner", i, d)
				}
			}
			if c := s.Counters(); c.Timeouts != 2 || s.Up() {
				t.Errorf("%d timeouts, up %v; want 2, dead", c.Timeouts, s.Up())
			}
		})
	}
}

// TestLateReaderIsNotASlowAnswer: an answer that arrives in full while moxi is busy
// elsewhere past a pace window is read whole: the delay is moxi's.
func TestLateReaderIsNotASlowAnswer(t *testing.T) {
	answer := make([]byte, 4<<20) // more than the socket buffers hold: the server waits for moxi
	f := startRawFake(t, func(c net.Conn) { _, _ = c.Write(answer) })
	nc, err := net.Dial("tcp", f.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := &pacedReader{nc: nc}
	buf := make([]byte, len(answer))
	if _, err := io.ReadFull(r, buf[:1]); err != nil {
		t.Fatal(err)
	}
	r.begin()
	for n := 1; n < len(buf); {
		// moxi was busy elsewhere past the window's end, a few times in the answer: the
		// window is made to have ended (its deadline passed) while the bytes wait.
		if n < 4*answerPaceBytes {
			waitFor(t, "bytes waiting in the socket", func() bool { return sockpeek.Waiting(nc) })
			r.timed = true
			_ = nc.SetReadDeadline(time.Now().Add(-time.Second))
		}
		m, err := r.Read(buf[n:min(len(buf), n+answerPaceBytes)])
		if err != nil {
			t.Fatalf("after %d bytes: %v", n, err)
		}
		n += m
	}
	r.end()
}

// TestOwnDialErrorsSpareTheServer: a dial that fails for want of moxi's own resources fails
// the requests that wait for it, binary and meta, counted as overload; the server is not
// marked dead even with a failure_limit of 1, the connections dial again by themselves, and
// serve once the resources are back.
func TestOwnDialErrorsSpareTheServer(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		t.Run(errno.Error(), func(t *testing.T) {
			f := startFake(t, func(int, *protocol.Request) (*protocol.Response, time.Duration, bool) {
				return &protocol.Response{Value: []byte("ok")}, 0, false
			})
			addr := f.ln.Addr().String()
			var exhausted atomic.Bool
			var dials atomic.Int32
			exhausted.Store(true)
			s := newServer(t, addr, Options{Connections: 2, Timeout: 2 * time.Second, FailureLimit: 1, dial: func(ctx context.Context) (net.Conn, error) {
				dials.Add(1)
				if exhausted.Load() {
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", errno)}
				}
				return Dial(ctx, addr, time.Second, nil)
			}})
			_, since := s.State()

			reqs := []*protocol.Request{{Op: protocol.OpGet, Keys: keys("a")}, metaRequest(t, "mg a v\r\n"), {Op: protocol.OpGet, Keys: keys("b")}}
			for _, req := range reqs {
				var resps [1]protocol.Response
				if err := pool.Do(context.Background(), s, nil, req, resps[:]); !errors.Is(err, errno) {
					t.Fatalf("%s while out of resources: %v, want %v", req.Op, err, errno)
				}
			}
			waitFor(t, "connections dialing again", func() bool { return dials.Load() >= 6 })
			if c := s.Counters(); c.Connect != 0 || c.Timeouts != 0 || c.IO != 0 || c.Overload != uint64(len(reqs)) {
				t.Errorf("counters %+v; want %d overloads and nothing else", c, len(reqs))
			}

			exhausted.Store(false)
			waitFor(t, "a request served", func() bool {
				r, err := getKey(t, s, "a")
				return err == nil && string(r.Value) == "ok"
			})
			if up, now := s.State(); !up || !now.Equal(since) {
				t.Errorf("up %v since %v, want up since %v: the server was marked dead", up, now, since)
			}
		})
	}
}

// metaUp reports whether every meta connection s has opened is up (Counters counts the
// binary ones only).
func metaUp(s *Server) bool {
	s.meta.mu.Lock()
	defer s.meta.mu.Unlock()
	for _, c := range s.meta.conns {
		if c != nil && !c.up.Load() {
			return false
		}
	}
	return true
}

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(20 * time.Second); !cond(); <-tick.C {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 20s", what)
		}
	}
}

// TestServerErrorText: a server's answer that is not one closes its connection and fails
// the request without reaching the caller's answer; an error text with line breaks is
// an answer, put on one line. Either way the next request gets its own answer.
func TestServerErrorText(t *testing.T) {
	forged := "oops\r\nVALUE k 0 6\r\nforged\r\nEND"
	tests := []struct {
		name   string
		first  func(req *protocol.Request) []byte
		closes bool   // the answer closes the connection
		msg    string // else the answer's Msg
	}{
		{"bad magic", func(req *protocol.Request) []byte {
			return append(memcachedtest.BinaryHeader(req, 0x80, 0, 0, 9), "VALUE k 0"...)
		}, true, ""},
		{"extras past the body", func(req *protocol.Request) []byte {
			return append(memcachedtest.BinaryHeader(req, 0x81, 0, 200, 9), "\r\nEND\r\n\r\n"...)
		}, true, ""},
		{"forged error text", func(req *protocol.Request) []byte {
			return append(memcachedtest.BinaryHeader(req, 0x81, 0x86, 0, uint32(len(forged))), forged...)
		}, false, strings.NewReplacer("\r", " ", "\n", " ").Replace(forged)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var answered atomic.Int32
			f := startRawFake(t, func(c net.Conn) {
				binaryRequests(c, func(req *protocol.Request) error {
					out := append(memcachedtest.BinaryHeader(req, 0x81, 0, 4, 6), 0, 0, 0, 0, 'o', 'k')
					if answered.Add(1) == 1 {
						out = tt.first(req)
					}
					_, err := c.Write(out)
					return err
				})
			})
			s := newServer(t, f.Addr, Options{Connections: 1, Timeout: 5 * time.Second, FailureLimit: 100, RetryMin: 10 * time.Millisecond})
			r, err := getKey(t, s, "k")
			switch {
			case tt.closes && (err == nil || errors.Is(err, ErrTimeout)):
				t.Fatalf("get: %v %+v; want the connection failed", err, r)
			case !tt.closes && (err != nil || r.Status != protocol.StatusTempFailure || r.Msg != tt.msg):
				t.Fatalf("get: %v status %d msg %q; want status %d msg %q", err, r.Status, r.Msg, protocol.StatusTempFailure, tt.msg)
			}
			t.Logf("get: %v %q", err, r.Msg)
			waitFor(t, "answer to the next request", func() bool {
				r, err := getKey(t, s, "k")
				return err == nil && string(r.Value) == "ok"
			})
			want := 1
			if tt.closes {
				want = 2
			}
			if n := f.Accepts(); n != want {
				t.Errorf("%d connections, want %d", n, want)
			}
		})
	}
}
