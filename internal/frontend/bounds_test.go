package frontend_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// The tests of the connection's bounds: a panic costs its connection alone, a request must
// arrive within RequestTimeout, answers must be taken within WriteTimeout, the byte account
// stays within MaxConnectionBytes and MaxBufferedBytes, and Serve survives accept errors.

// bigValue is the size of the values the byte account tests read: half of
// MaxConnectionBytes, so that one connection holds about two answers.
const bigValue = 512 << 10

// metric is the value of the series name{label="value"} (any series of name when label is
// empty) that reg gathers, 0 when there is none.
func metric(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Errorf("gather: %v", err) // not Fatal: samplePeak calls it from its own goroutine
		return 0
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetName() == label && l.GetValue() == value
			}
			switch {
			case !match:
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			default:
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// closed is moxi_connections_closed_total{reason}.
func closed(t testing.TB, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	return metric(t, reg, "moxi_connections_closed_total", "reason", reason)
}

// buffered is moxi_buffered_bytes.
func buffered(t testing.TB, reg *prometheus.Registry) int64 {
	t.Helper()
	return int64(metric(t, reg, "moxi_buffered_bytes", "", ""))
}

// withMetrics registers s's metrics on a new registry.
func withMetrics(t testing.TB, s *frontend.Server) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	s.RegisterMetrics(reg)
	return reg
}

// dialSmall dials a client whose socket receive buffer is small, set before the handshake
// so that the window it advertises is small from the start: what the client does not read
// soon pushes back on the server's writes instead of filling megabytes of kernel buffers.
func dialSmall(t testing.TB, addr string) *client {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &client{t: t, nc: nc, r: bufio.NewReader(nc)}
}

// readToClose reads what the server sends until it closes the connection (EOF or reset),
// which must happen within 5 s.
func readToClose(t testing.TB, c *client) []byte {
	t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c.r)
	if err != nil && !isReset(err) { // isReset is false for a timeout
		t.Fatalf("waiting for the server to close the connection: %v (got %d bytes)", err, len(b))
	}
	return b
}

// setValue stores value under key through c.
func setValue(c *client, key string, value []byte) {
	c.t.Helper()
	c.send(fmt.Appendf(nil, "set %s 0 0 %d\r\n%s\r\n", key, len(value), value))
	c.expect("STORED\r\n")
}

// bigOf is the value the tests store under the i'th big key: each its own byte, so that an
// answer out of order shows.
func bigOf(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, bigValue) }

// expectBig reads the answer to "get big<i>".
func (c *client) expectBig(i int) {
	c.t.Helper()
	c.expect(fmt.Sprintf("VALUE big%d 0 %d\r\n", i, bigValue))
	if got := c.read(bigValue); !bytes.Equal(got, bigOf(i)) {
		c.t.Fatalf("value of big%d: got bytes %q..., want %q...", i, got[:8], bigOf(i)[:8])
	}
	c.expect("\r\nEND\r\n")
}

// peak samples moxi_buffered_bytes every millisecond until stopped, keeping the largest.
type peak struct {
	max  atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func samplePeak(t testing.TB, reg *prometheus.Registry) *peak {
	p := &peak{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			p.max.Store(max(p.max.Load(), buffered(t, reg)))
			select {
			case <-tick.C:
			case <-p.stop:
				return
			}
		}
	}()
	t.Cleanup(func() { p.end() })
	return p
}

// end stops the sampling and returns the peak.
func (p *peak) end() int64 {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	return p.max.Load()
}

// boomKey reports whether req names the key "boom".
func boomKey(req *protocol.Request) bool {
	if string(req.Key) == "boom" {
		return true
	}
	for _, k := range req.Keys {
		if string(k) == "boom" {
			return true
		}
	}
	return false
}

func panicOnBoom(req *protocol.Request) {
	if boomKey(req) {
		panic("boom")
	}
}

// boomHandler is a Handler that panics on a request for the key "boom".
type boomHandler struct{ frontend.Handler }

func (h boomHandler) Handle(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response) []protocol.Response {
	for i := range reqs {
		panicOnBoom(&reqs[i])
	}
	return h.Handler.Handle(ctx, order, reqs, resps)
}

// TestPanicClosesOnlyItsConnection: a request that panics (in PanicHook, or in the Handler)
// closes its own connection, after at most the answers before it; another client keeps
// being served, and the panic is counted once.
func TestPanicClosesOnlyItsConnection(t *testing.T) {
	getBin := func(opcode uint8, opaque uint32, key string) []byte {
		return binRequest(opcode, opaque, nil, []byte(key), nil)
	}
	const opGetKQ = 0x0d
	tests := []struct {
		name      string
		inHandler bool // the Handler panics, not PanicHook
		send      []byte
		// before is the text answer of the requests before the panic, of which the client
		// may get a prefix; for binary, boomOpaque is the opaque of the request that panics,
		// and only answers to lower opaques may arrive.
		before     string
		boomOpaque uint32
	}{
		{name: "text pipelined gets", send: []byte("get a\r\nget boom\r\nget c\r\n"), before: "VALUE a 0 3\r\nAAA\r\nEND\r\n"},
		{name: "text lone get", send: []byte("get boom\r\n")},
		{name: "text lone set", send: []byte("set boom 0 0 1\r\nx\r\n")},
		{name: "text multi-key get", send: []byte("get a boom c\r\n")},
		{name: "text pipelined sets", send: []byte("set s1 0 0 1\r\nx\r\nset boom 0 0 1\r\nx\r\nset s2 0 0 1\r\nx\r\n"), before: "STORED\r\n"},
		{name: "binary pipelined gets", send: bytes.Join([][]byte{getBin(opGet, 1, "a"), getBin(opGet, 2, "boom"), getBin(opGet, 3, "c")}, nil), boomOpaque: 2},
		{name: "binary lone get", send: getBin(opGet, 1, "boom"), boomOpaque: 1},
		{name: "binary lone set", send: binSet(1, "boom", "x", 0), boomOpaque: 1},
		{name: "binary quiet gets", send: bytes.Join([][]byte{getBin(opGetKQ, 1, "a"), getBin(opGetKQ, 2, "boom"), getBin(opGetKQ, 3, "c"), binRequest(opNoop, 4, nil, nil, nil)}, nil), boomOpaque: 2},
		{name: "handler: text pipelined gets", inHandler: true, send: []byte("get a\r\nget boom\r\nget c\r\n"), before: "VALUE a 0 3\r\nAAA\r\nEND\r\n"},
		{name: "handler: text lone get", inHandler: true, send: []byte("get boom\r\n")},
		{name: "handler: binary lone get", inHandler: true, send: getBin(opGet, 1, "boom"), boomOpaque: 1},
		// More keys than a part (see Server.partKeys): answered part by part, the panic in
		// a later part's Handle while the request holds the connection's writer token.
		{name: "handler: text get streamed in parts", inHandler: true, send: []byte("get a c d e f g h boom i\r\n"),
			before: "VALUE a 0 3\r\nAAA\r\nVALUE c 0 3\r\nCCC\r\nVALUE d 0 3\r\nDDD\r\nVALUE e 0 3\r\nEEE\r\nVALUE f 0 3\r\nFFF\r\nVALUE g 0 3\r\nGGG\r\nVALUE h 0 3\r\nHHH\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &frontend.Server{Handler: newProxy(t), Logger: slog.New(slog.DiscardHandler)}
			if tt.inHandler {
				s.Handler = boomHandler{s.Handler}
			} else {
				s.PanicHook = panicOnBoom
			}
			reg := withMetrics(t, s)
			ts := startServer(t, s)

			b := dial(t, ts.addr)
			for _, k := range []string{"a", "c", "d", "e", "f", "g", "h", "i"} {
				setValue(b, k, bytes.Repeat([]byte(strings.ToUpper(k)), 3))
			}
			a := dial(t, ts.addr)
			a.send(tt.send)
			got := readToClose(t, a)
			if tt.boomOpaque == 0 {
				if !strings.HasPrefix(tt.before, string(got)) {
					t.Errorf("before the close got %q, want a prefix of %q", got, tt.before)
				}
			} else {
				for _, p := range parseBinary(t, got) {
					if p.Opaque >= tt.boomOpaque {
						t.Errorf("got an answer to opaque %d, at or past the request that panicked (%d)", p.Opaque, tt.boomOpaque)
					}
				}
			}

			waitFor(t, "the panicking connection to be gone", func() bool { cur, _ := ts.Connections(); return cur == 1 })
			for range 3 {
				b.send([]byte("get a\r\nversion\r\n"))
				b.expect("VALUE a 0 3\r\nAAA\r\nEND\r\n" + versionAnswer)
			}
			if n := metric(t, reg, "moxi_panics_total", "", ""); n != 1 {
				t.Errorf("moxi_panics_total = %v, want 1", n)
			}
			if n := closed(t, reg, "panic"); n != 1 {
				t.Errorf("moxi_connections_closed_total{reason=panic} = %v, want 1", n)
			}
		})
	}
}

// parseBinary parses the whole response packets in b; a packet cut by the close is ignored.
func parseBinary(t testing.TB, b []byte) []binAnswer {
	t.Helper()
	var out []binAnswer
	for len(b) >= 24 {
		n := 24 + int(binary.BigEndian.Uint32(b[8:]))
		if len(b) < n {
			break
		}
		c := &client{t: t, r: bufio.NewReader(bytes.NewReader(b[:n]))}
		out = append(out, c.readBinary())
		b = b[n:]
	}
	return out
}

// TestRequestTimeout: a request that has begun must arrive whole within RequestTimeout, else
// its connection is closed; an idle connection is not, and a slow request that completes
// in time is served.
func TestRequestTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	start := func(t *testing.T, timeout time.Duration) (*testServer, *prometheus.Registry) {
		s := &frontend.Server{Handler: newProxy(t), RequestTimeout: timeout, Logger: slog.New(slog.DiscardHandler)}
		reg := withMetrics(t, s)
		return startServer(t, s), reg
	}

	t.Run("partial request", func(t *testing.T) {
		getKey := binRequest(opGet, 1, nil, []byte("key"), nil)
		tests := []struct {
			name string
			send []byte
			want string // answered before the close
		}{
			{name: "text value short", send: []byte("set k 0 0 10\r\nabc")},
			{name: "text line without its end", send: []byte("get k")},
			{name: "text second request of a pipeline", send: []byte("version\r\nset k 0 0 10\r\nabc"), want: versionAnswer},
			{name: "binary header cut", send: getKey[:10]},
			{name: "binary body cut", send: getKey[:len(getKey)-1]},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ts, reg := start(t, timeout)
				c := dial(t, ts.addr)
				c.send(tt.send)
				if got := readToClose(t, c); string(got) != tt.want {
					t.Errorf("got %q before the close, want %q", got, tt.want)
				}
				waitFor(t, "the close to be counted", func() bool { return closed(t, reg, "request_timeout") == 1 })
			})
		}
	})

	t.Run("idle connections stay open", func(t *testing.T) {
		ts, reg := start(t, timeout)
		fresh, served := dial(t, ts.addr), dial(t, ts.addr)
		served.send([]byte("version\r\n"))
		served.expect(versionAnswer)
		// Stalled requests on other connections, one after the other, each closed after a
		// timeout: once the third is, three timeouts have passed over the idle connections.
		for i := 1; i <= 3; i++ {
			stalled := dial(t, ts.addr)
			stalled.send([]byte("set k 0 0 10\r\nabc"))
			readToClose(t, stalled)
			waitFor(t, "the stalled connection to be closed", func() bool { return closed(t, reg, "request_timeout") == float64(i) })
		}
		for _, c := range []*client{fresh, served} {
			c.send([]byte("version\r\n"))
			c.expect(versionAnswer)
		}
		if n := closed(t, reg, "request_timeout"); n != 3 {
			t.Errorf("moxi_connections_closed_total{reason=request_timeout} = %v, want 3 (the stalled connections)", n)
		}
	})

	t.Run("slow request in time", func(t *testing.T) {
		// Each request takes about 400 ms to arrive, leaving 600 ms of the timeout to a slow
		// machine; three in a row on one connection take longer than one timeout, which the
		// connection must count from each request's start.
		const timeout = time.Second
		const pieces, gap = 5, 100 * time.Millisecond
		tests := []struct {
			name    string
			request []byte
			answer  func(c *client)
		}{
			{name: "text set", request: []byte("set k 0 0 10\r\n0123456789\r\n"), answer: func(c *client) { c.expect("STORED\r\n") }},
			{name: "binary set", request: binSet(7, "k", "0123456789", 0), answer: func(c *client) {
				if got := c.readBinary(); got.Status != 0 || got.Opaque != 7 {
					t.Errorf("set: %+v", got)
				}
			}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ts, reg := start(t, timeout)
				c := dial(t, ts.addr)
				size := (len(tt.request) + pieces - 1) / pieces
				pace := time.NewTicker(gap) // the client is slow: a piece per gap
				defer pace.Stop()
				for range 3 {
					for p := tt.request; len(p) > 0; {
						n := min(size, len(p))
						c.send(p[:n])
						if p = p[n:]; len(p) > 0 {
							<-pace.C
						}
					}
					tt.answer(c)
				}
				if n := closed(t, reg, "request_timeout"); n != 0 {
					t.Errorf("moxi_connections_closed_total{reason=request_timeout} = %v, want 0", n)
				}
			})
		}
	})
}

// smallSendBuffers hands out connections whose socket send buffer is small, so that a
// client's pace of reading shows in the server's writes at once.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(16 << 10)
	}
	return nc, err
}

// TestWriteTimeout: a client that takes none of its answers is closed after WriteTimeout;
// one that reads slowly, but at least writeProgress (64 KiB) per WriteTimeout, gets every
// answer; and a third client is served meanwhile.
func TestWriteTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// MaxConnectionBytes only keeps the memory the non-reader makes the server hold small;
	// the write timeout does not depend on it.
	s := &frontend.Server{Handler: newProxy(t), WriteTimeout: timeout, MaxConnectionBytes: 4 << 20, Logger: slog.New(slog.DiscardHandler)}
	reg := withMetrics(t, s)
	ts := serveOn(t, s, smallSendBuffers{ln})

	setter := dial(t, ts.addr)
	for i := range 4 {
		setValue(setter, fmt.Sprintf("big%d", i), bigOf(i))
	}

	stuck := dialSmall(t, ts.addr)
	stuck.send(bytes.Repeat([]byte("get big0\r\n"), 200))

	// The slow reader takes 128 KiB every 100 ms: 12 times writeProgress per WriteTimeout.
	const gets = 8
	slow := dialSmall(t, ts.addr)
	_ = slow.nc.SetDeadline(time.Now().Add(60 * time.Second))
	var req []byte
	for i := range gets {
		req = fmt.Appendf(req, "get big%d\r\n", i%4)
	}
	slow.send(req)
	slowDone := make(chan error, 1)
	var slowGot bytes.Buffer
	total := gets * (len("VALUE big0 0 524288\r\n") + bigValue + len("\r\nEND\r\n"))
	go func() { // ends at the latest with slow's deadline, or its close by the cleanup
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for slowGot.Len() < total {
			<-tick.C
			if _, err := io.CopyN(&slowGot, slow.r, int64(min(128<<10, total-slowGot.Len()))); err != nil {
				slowDone <- err
				return
			}
		}
		slowDone <- nil
	}()

	// Meanwhile another client is served, whether the stuck one is closed yet or not.
	other := dial(t, ts.addr)
	for range 3 {
		other.send([]byte("get big1\r\nversion\r\n"))
		other.expectBig(1)
		other.expect(versionAnswer)
	}

	waitFor(t, "the stuck client to be closed", func() bool { return closed(t, reg, "write_timeout") == 1 })
	readToClose(t, stuck)

	select {
	case err := <-slowDone:
		if err != nil {
			t.Fatalf("slow reader: %v after %d bytes", err, slowGot.Len())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("slow reader still reading after 60 s")
	}
	check := &client{t: t, r: bufio.NewReader(&slowGot)}
	for i := range gets {
		check.expectBig(i % 4)
	}
	other.send([]byte("version\r\n"))
	other.expect(versionAnswer)
	if n := closed(t, reg, "write_timeout"); n != 1 {
		t.Errorf("moxi_connections_closed_total{reason=write_timeout} = %v, want 1 (the stuck client only)", n)
	}
}

// waitStill waits until value has not changed for a second (within 30 s): the server has
// done what it can and waits, for clients that do not read.
func waitStill(t testing.TB, what string, value func() int64) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	last, since := value(), time.Now()
	for time.Since(since) < time.Second {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s did not stop changing", what)
		}
		if n := value(); n != last {
			last, since = n, time.Now()
		}
	}
}

// TestConnectionBytesBound: a client that pipelines more large gets than it reads makes its
// connection hold at most about MaxConnectionBytes, and once it reads, every answer arrives,
// in order, and the account goes back to zero.
func TestConnectionBytesBound(t *testing.T) {
	const maxConn = 1 << 20
	s := &frontend.Server{Handler: newProxy(t), MaxConnectionBytes: maxConn}
	reg := withMetrics(t, s)
	ts := startServer(t, s)

	setter := dial(t, ts.addr)
	const keys, gets = 10, 300
	for i := range keys {
		setValue(setter, fmt.Sprintf("big%d", i), bigOf(i))
	}

	p := samplePeak(t, reg)
	c := dial(t, ts.addr)
	_ = c.nc.SetDeadline(time.Now().Add(60 * time.Second))
	var req []byte
	for i := range gets {
		req = fmt.Appendf(req, "get big%d\r\n", i%keys)
	}
	c.send(req)
	waitFor(t, "the connection", func() bool { cur, _ := ts.Connections(); return cur == 2 })
	server := ts.ln.conn(1)
	waitStill(t, "the server's writes to a client that does not read", server.writes.Load)

	// The connection holds at most its bound, or past it a request admitted with nothing
	// queued (its reservation) and the answer being written meanwhile (one value).
	bound := int64(maxConn + 2*bigValue)
	stalled := p.max.Load()
	t.Logf("peak buffered bytes while the client did not read: %d (bound %d)", stalled, bound)
	if stalled > bound {
		t.Errorf("moxi_buffered_bytes reached %d, want at most %d", stalled, bound)
	}

	for i := range gets {
		c.expectBig(i % keys)
	}
	if peak := p.end(); peak > bound {
		t.Errorf("moxi_buffered_bytes reached %d while the client read, want at most %d", peak, bound)
	}
	waitFor(t, "the account to go back to zero", func() bool { return buffered(t, reg) == 0 })
}

// The global bound's tests: 2 MiB over all connections, 1 MiB for one. The total passes the
// global bound by at most what one connection may take past it: a connection under its
// share is let in whole, up to its own bound (one connection's worth), with the answer it
// is writing when it gets there (one answer).
const (
	globalMaxConn  = 1 << 20
	globalMaxTotal = 2 << 20
	globalBound    = globalMaxTotal + globalMaxConn + bigValue + 64
)

// TestGlobalBoundServesSmallClients: while clients that do not read hold the global bound,
// one that sets and gets small values is still answered, and the total stays bounded.
func TestGlobalBoundServesSmallClients(t *testing.T) {
	s := &frontend.Server{Handler: newProxy(t), MaxConnectionBytes: globalMaxConn, MaxBufferedBytes: globalMaxTotal}
	reg := withMetrics(t, s)
	ts := startServer(t, s)

	setter := dial(t, ts.addr)
	setValue(setter, "big0", bigOf(0))

	p := samplePeak(t, reg)
	for range 6 {
		c := dialSmall(t, ts.addr)
		c.send(bytes.Repeat([]byte("get big0\r\n"), 300))
	}
	// The small client comes once they are stalled, holding what they could take of the
	// global account and waiting for the rest: its answers must pass theirs.
	waitStill(t, "moxi_buffered_bytes", func() int64 { return buffered(t, reg) })
	t.Logf("buffered bytes once the clients that do not read are stalled: %d", buffered(t, reg))

	small := dial(t, ts.addr)
rounds:
	for i := range 50 {
		v := fmt.Sprintf("value%05d", i)
		steps := []struct{ name, send, want string }{
			{name: "set", send: "set small 0 0 10\r\n" + v + "\r\n", want: "STORED\r\n"},
			{name: "get", send: "get small\r\n", want: "VALUE small 0 10\r\n" + v + "\r\nEND\r\n"},
		}
		for _, step := range steps {
			_ = small.nc.SetDeadline(time.Now().Add(5 * time.Second))
			small.send([]byte(step.send))
			got := make([]byte, len(step.want))
			if n, err := io.ReadFull(small.r, got); err != nil || string(got) != step.want {
				t.Errorf("round %d, %s: got %q, %v; want %q within 5 s (moxi_buffered_bytes %d)",
					i, step.name, got[:n], err, step.want, buffered(t, reg))
				break rounds
			}
		}
	}
	peak := p.end()
	t.Logf("peak buffered bytes: %d (bound %d)", peak, globalBound)
	if peak > globalBound {
		t.Errorf("moxi_buffered_bytes reached %d, want at most %d", peak, globalBound)
	}
}

// TestGlobalBoundInFlight: requests in flight on many connections, each reserving room for
// an answer, keep the total within the same bound, before any answer has told the server
// how large values are.
func TestGlobalBoundInFlight(t *testing.T) {
	gate := newGate()
	release := sync.OnceFunc(func() { close(gate.release) })
	defer release()
	s := &frontend.Server{Handler: gate, MaxConnectionBytes: globalMaxConn, MaxBufferedBytes: globalMaxTotal}
	reg := withMetrics(t, s)
	ts := startServer(t, s)

	const clients = 6
	cs := make([]*client, clients)
	for i := range cs {
		cs[i] = dial(t, ts.addr)
		cs[i].send([]byte("get k\r\n"))
	}
	waitStill(t, "moxi_buffered_bytes", func() int64 { return buffered(t, reg) })
	if n := buffered(t, reg); n > globalBound {
		t.Errorf("moxi_buffered_bytes = %d with %d gets in flight (%d in the handler), want at most %d",
			n, clients, len(gate.entered), globalBound)
	}
	release()
	for _, c := range cs {
		c.expect("VALUE k 0 4\r\ngate\r\nEND\r\n")
	}
	waitFor(t, "the account to go back to zero", func() bool { return buffered(t, reg) == 0 })
}

// flakyListener fails its first fails Accept calls with err.
type flakyListener struct {
	net.Listener
	err   error
	fails atomic.Int32
	calls atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.calls.Add(1)
	if l.fails.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

// TestAcceptErrorsRetried: Serve goes on after any accept error but a closed listener.
func TestAcceptErrorsRetried(t *testing.T) {
	opErr := func(errno syscall.Errno) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
	}
	tests := []struct {
		name string
		err  error
	}{
		{name: "ENFILE", err: opErr(syscall.ENFILE)},
		{name: "EMFILE", err: opErr(syscall.EMFILE)},
		{name: "ENOBUFS", err: opErr(syscall.ENOBUFS)},
		{name: "ECONNABORTED", err: opErr(syscall.ECONNABORTED)},
		{name: "not a system call's", err: errors.New("something else")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln := &flakyListener{Listener: inner, err: tt.err}
			ln.fails.Store(3)
			ts := serveOn(t, &frontend.Server{Handler: newProxy(t), Logger: slog.New(slog.DiscardHandler)}, ln)
			c := dial(t, ts.addr)
			c.send([]byte("version\r\n"))
			c.expect(versionAnswer)
			if n := ln.calls.Load(); n < 4 {
				t.Errorf("Accept called %d times, want the 3 failures and then the client's", n)
			}
			select {
			case err := <-ts.served:
				ts.served <- err // for the cleanup's check
				t.Fatalf("Serve returned %v", err)
			default:
			}
		})
	}
}

// TestTrainedEstimateBounded: a client that first reads small values, so that its estimate
// per key falls to the floor, and then pipelines gets of large values without reading
// holds at most two runs of the keys of unknown answer allowed in flight (32 with these
// limits) past its bound: one being written when the next, then lone, was admitted. Not
// the 256 keys its window would otherwise admit at a trained estimate.
func TestTrainedEstimateBounded(t *testing.T) {
	const maxConn = 1 << 20 // with max_value_bytes 1 MiB: 32 keys of unknown answer in flight
	s := &frontend.Server{Handler: newProxy(t), MaxConnectionBytes: maxConn}
	reg := withMetrics(t, s)
	ts := startServer(t, s)

	setter := dial(t, ts.addr)
	setValue(setter, "big0", bigOf(0))
	setValue(setter, "small", []byte("0123456789"))

	c := dial(t, ts.addr)
	_ = c.nc.SetDeadline(time.Now().Add(60 * time.Second))
	const small, gets = 200, 300
	c.send(bytes.Repeat([]byte("get small\r\n"), small))
	for range small {
		c.expect("VALUE small 0 10\r\n0123456789\r\nEND\r\n")
	}
	p := samplePeak(t, reg)
	c.send(bytes.Repeat([]byte("get big0\r\n"), gets))
	waitStill(t, "the server's writes to a client that does not read", ts.ln.conn(1).writes.Load)

	bound := int64(maxConn + (2*32+1)*bigValue)
	stalled := p.max.Load()
	t.Logf("peak buffered bytes after training: %d (bound %d; a window of 256 keys would be %d)", stalled, bound, 256*bigValue)
	if stalled > bound {
		t.Errorf("moxi_buffered_bytes reached %d, want at most %d", stalled, bound)
	}
	for range gets {
		c.expectBig(0)
	}
	if peak := p.end(); peak > bound {
		t.Errorf("moxi_buffered_bytes reached %d while the client read, want at most %d", peak, bound)
	}
	waitFor(t, "the account to go back to zero", func() bool { return buffered(t, reg) == 0 })
}

// doneThenPanic is a Handler whose Start has its run answered (done called) and then
// panics, for a run with the key "boom": a panic after done, when the task may already
// serve the connection's next request.
type doneThenPanic struct{ frontend.Handler }

func (h doneThenPanic) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, done func()) bool {
	boom := false
	for i := range reqs {
		boom = boom || boomKey(&reqs[i]) // read before done: reqs are the task's until then
	}
	answered := make(chan struct{})
	if !h.Handler.(frontend.Starter).Start(ctx, order, reqs, resps, func() { done(); close(answered) }) {
		return false
	}
	<-answered
	if boom {
		panic("boom after done")
	}
	return true
}

// TestPanicAfterDone: a handler that panics after its run was answered closes its
// connection and is counted once, without touching the task its answer was made in (which
// may serve the connection's next request by then); other clients are served.
func TestPanicAfterDone(t *testing.T) {
	for _, send := range []string{"get boom\r\n", "get boom a\r\n", "set boom 0 0 1\r\nx\r\nget a\r\n"} {
		t.Run(strings.TrimSpace(strings.ReplaceAll(send, "\r\n", " ")), func(t *testing.T) {
			s := &frontend.Server{Handler: doneThenPanic{newProxy(t)}, Logger: slog.New(slog.DiscardHandler)}
			reg := withMetrics(t, s)
			ts := startServer(t, s)
			b := dial(t, ts.addr)
			setValue(b, "a", []byte("AAA"))
			a := dial(t, ts.addr)
			a.send([]byte(send))
			readToClose(t, a)
			waitFor(t, "the panicking connection to be gone", func() bool { cur, _ := ts.Connections(); return cur == 1 })
			// Tasks are pooled by the server: one the panic had touched after its done
			// would answer one of these early, or twice.
			pipeline := strings.Repeat("get a\r\nversion\r\n", 50)
			for range 20 {
				b.send([]byte(pipeline))
				b.expect(strings.Repeat("VALUE a 0 3\r\nAAA\r\nEND\r\n"+versionAnswer, 50))
			}
			if n := metric(t, reg, "moxi_panics_total", "", ""); n != 1 {
				t.Errorf("moxi_panics_total = %v, want 1", n)
			}
		})
	}
}

// TestFencedBehindStream: a multi-get answered part by part, then a set of k and a get of
// k, in one write, 20 times over. The get waits for the set (its write may be retried, see
// fences), the set for its turn, which the multi-get holds until its parts are written: the
// reader, waiting, lets the answers out, and the get answers the set's value. (Over remote
// servers, TestPipelineDifferential hung here before the reader ended its burst.)
func TestFencedBehindStream(t *testing.T) {
	s := &frontend.Server{Handler: newProxy(t), Logger: slog.New(slog.DiscardHandler)}
	ts := startServer(t, s)
	c := dial(t, ts.addr)
	keys := []string{"a", "c", "d", "e", "f", "g", "h", "i", "j"} // more than a part
	var want strings.Builder
	for _, k := range keys {
		setValue(c, k, bytes.Repeat([]byte(k), 3))
		fmt.Fprintf(&want, "VALUE %s 0 3\r\n%s\r\n", k, strings.Repeat(k, 3))
	}
	want.WriteString("END\r\nSTORED\r\nVALUE k 0 1\r\nx\r\nEND\r\n")
	for range 20 {
		c.send([]byte("get " + strings.Join(keys, " ") + "\r\nset k 0 0 1\r\nx\r\nget k\r\n"))
		c.expect(want.String())
	}
}
