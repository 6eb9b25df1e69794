package frontend_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testVersion is the release of the proxy behind the test servers; versionAnswer, its
// answer to version.
const testVersion = "1.2.3"

const versionAnswer = "VERSION " + testVersion + " moxi\r\n"

// newProxy is the request path over two embedded shards, the shape of moxi's default.
func newProxy(t testing.TB) *proxy.Proxy {
	t.Helper()
	members := []pool.Member{
		{Name: "shard0", Addr: "embedded/0", Weight: 1, Server: memstore.New(memstore.Options{})},
		{Name: "shard1", Addr: "embedded/1", Weight: 1, Server: memstore.New(memstore.Options{})},
	}
	p, err := pool.New("main", pool.Options{}, members)
	if err != nil {
		t.Fatal(err)
	}
	return proxy.New(&topology.Topology{Pools: []*pool.Pool{p}, Default: p}, proxy.Options{Release: testVersion})
}

// countingListener hands out connections that count the server's Write calls.
type countingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*countingConn // guarded by mu, in accept order
}

func (l *countingListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &countingConn{Conn: nc}
	l.mu.Lock()
	l.conns = append(l.conns, c)
	l.mu.Unlock()
	return c, nil
}

// conn is the i'th accepted connection.
func (l *countingListener) conn(i int) *countingConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[i]
}

// countingConn counts the server's writes, through Write and through its socket (the
// frontend serves it as the TCP connection it wraps, writing to the socket directly).
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func (c *countingConn) SyscallConn() (syscall.RawConn, error) {
	raw, err := c.Conn.(syscall.Conn).SyscallConn()
	return countingRaw{raw, &c.writes}, err
}

type countingRaw struct {
	syscall.RawConn
	writes *atomic.Int64
}

func (r countingRaw) Write(f func(fd uintptr) bool) error {
	r.writes.Add(1)
	return r.RawConn.Write(f)
}

// testServer is a frontend.Server serving on a loopback port until the test ends.
type testServer struct {
	*frontend.Server
	addr   string
	ln     *countingListener
	served chan error
}

// startServer serves s on 127.0.0.1:0; the test's cleanup shuts it down (unless the test
// already did) and checks that Serve returned ErrServerClosed.
func startServer(t testing.TB, s *frontend.Server) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, s, ln)
}

// serveOn serves s on ln, a listener of the test's making, until the test ends.
func serveOn(t testing.TB, s *frontend.Server, ln net.Listener) *testServer {
	t.Helper()
	ts := &testServer{Server: s, addr: ln.Addr().String(), ln: &countingListener{Listener: ln}, served: make(chan error, 1)}
	go func() { ts.served <- s.Serve(ts.ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-ts.served; !errors.Is(err, frontend.ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return ts
}

// startProxy serves the two-shard proxy.
func startProxy(t testing.TB) *testServer {
	t.Helper()
	return startServer(t, &frontend.Server{Handler: newProxy(t)})
}

// client is one test connection with a deadline on everything it does.
type client struct {
	t  testing.TB
	nc net.Conn
	r  *bufio.Reader
}

func dial(t testing.TB, addr string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &client{t: t, nc: nc, r: bufio.NewReader(nc)}
}

func (c *client) send(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// read returns exactly n bytes of answer.
func (c *client) read(n int) []byte {
	c.t.Helper()
	b := make([]byte, n)
	if got, err := io.ReadFull(c.r, b); err != nil {
		c.t.Fatalf("read %d bytes: %v (got %q)", n, err, b[:got])
	}
	return b
}

// expect checks that the next answer bytes are exactly want.
func (c *client) expect(want string) {
	c.t.Helper()
	if got := c.read(len(want)); string(got) != want {
		c.t.Fatalf("got %q\nwant %q", got, want)
	}
}

// expectEOF checks that the server closed the connection with nothing more to say.
func (c *client) expectEOF() {
	c.t.Helper()
	b, err := io.ReadAll(c.r)
	if err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		c.t.Fatalf("waiting for close: %v (got %q)", err, b)
	}
	if len(b) > 0 {
		c.t.Fatalf("got %q before close, want nothing", b)
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// Binary protocol packets, built and parsed here so that the tests do not trust the codec
// they exercise.

const (
	opGet     = 0x00
	opSet     = 0x01
	opQuit    = 0x07
	opNoop    = 0x0a
	opVersion = 0x0b
	opGetK    = 0x0c
	opGetQ    = 0x09
	opQuitQ   = 0x17
)

// binRequest is a request packet with magic 0x80.
func binRequest(opcode uint8, opaque uint32, ext, key, value []byte) []byte {
	return binPacket(0x80, opcode, opaque, ext, key, value, len(ext)+len(key)+len(value))
}

func binPacket(magic, opcode uint8, opaque uint32, ext, key, value []byte, bodyLen int) []byte {
	h := make([]byte, 24)
	h[0], h[1] = magic, opcode
	binary.BigEndian.PutUint16(h[2:], uint16(len(key)))
	h[4] = uint8(len(ext))
	binary.BigEndian.PutUint32(h[8:], uint32(bodyLen))
	binary.BigEndian.PutUint32(h[12:], opaque)
	return append(append(append(h, ext...), key...), value...)
}

// binSet is a set of key to value with flags and no expiry.
func binSet(opaque uint32, key, value string, flags uint32) []byte {
	ext := make([]byte, 8)
	binary.BigEndian.PutUint32(ext, flags)
	return binRequest(opSet, opaque, ext, []byte(key), []byte(value))
}

// binAnswer is a parsed response packet.
type binAnswer struct {
	Opcode uint8
	Status uint16
	Opaque uint32
	Ext    string
	Key    string
	Value  string
}

func (c *client) readBinary() binAnswer {
	c.t.Helper()
	h := c.read(24)
	if h[0] != 0x81 {
		c.t.Fatalf("response magic %#x, header %x", h[0], h)
	}
	keyLen := int(binary.BigEndian.Uint16(h[2:]))
	extLen := int(h[4])
	body := c.read(int(binary.BigEndian.Uint32(h[8:])))
	return binAnswer{
		Opcode: h[1],
		Status: binary.BigEndian.Uint16(h[6:]),
		Opaque: binary.BigEndian.Uint32(h[12:]),
		Ext:    string(body[:extLen]),
		Key:    string(body[extLen : extLen+keyLen]),
		Value:  string(body[extLen+keyLen:]),
	}
}

// flagsExt is the 4-byte extras of a get hit.
func flagsExt(flags uint32) string {
	return string(binary.BigEndian.AppendUint32(nil, flags))
}

// waitFor polls cond, which reads state owned by other goroutines (a counter the server
// updates when it notices a close), until it holds or 20 s pass (a generous bound: the test
// machine may be busy).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

var crlf = []byte("\r\n")

// lines splits a text answer into lines without their "\r\n".
func lines(b []byte) []string {
	var out []string
	for _, l := range bytes.SplitAfter(b, crlf) {
		if len(l) > 0 {
			out = append(out, string(bytes.TrimSuffix(l, crlf)))
		}
	}
	return out
}
