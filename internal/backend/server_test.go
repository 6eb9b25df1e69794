package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newServer(t *testing.T, addr string, opts Options) *Server {
	t.Helper()
	opts.Addr = addr
	s := New(withDefaults(opts))
	t.Cleanup(func() { s.Close() })
	return s
}

func do(t *testing.T, s *Server, req *protocol.Request) protocol.Response {
	t.Helper()
	resps := make([]protocol.Response, 1)
	if req.Op.IsRetrieval() {
		resps = make([]protocol.Response, len(req.Keys))
	}
	if err := pool.Do(context.Background(), s, nil, req, resps); err != nil {
		t.Fatalf("%s: %v", req.Op, err)
	}
	return resps[0]
}

func keys(ks ...string) [][]byte {
	out := make([][]byte, len(ks))
	for i, k := range ks {
		out[i] = []byte(k)
	}
	return out
}

func TestCommandsAgainstMemcached(t *testing.T) {
	mc := memcachedtest.Start(t)
	s := newServer(t, mc.Addr, Options{Timeout: 2 * time.Second})

	steps := []struct {
		name   string
		req    protocol.Request
		status protocol.Status
		value  string
		number uint64
	}{
		{"set", protocol.Request{Op: protocol.OpSet, Key: []byte("a"), Value: []byte("1"), Flags: 7}, protocol.StatusOK, "", 0},
		{"get hit", protocol.Request{Op: protocol.OpGet, Keys: keys("a")}, protocol.StatusOK, "1", 0},
		{"get miss", protocol.Request{Op: protocol.OpGet, Keys: keys("nope")}, protocol.StatusNotFound, "", 0},
		{"add existing", protocol.Request{Op: protocol.OpAdd, Key: []byte("a"), Value: []byte("x")}, protocol.StatusNotStored, "", 0},
		{"replace missing", protocol.Request{Op: protocol.OpReplace, Key: []byte("nope"), Value: []byte("x")}, protocol.StatusNotStored, "", 0},
		{"append", protocol.Request{Op: protocol.OpAppend, Key: []byte("a"), Value: []byte("0")}, protocol.StatusOK, "", 0},
		{"incr", protocol.Request{Op: protocol.OpIncr, Key: []byte("a"), Delta: 5}, protocol.StatusOK, "", 15},
		{"decr", protocol.Request{Op: protocol.OpDecr, Key: []byte("a"), Delta: 100}, protocol.StatusOK, "", 0},
		{"incr missing", protocol.Request{Op: protocol.OpIncr, Key: []byte("nope"), Delta: 1}, protocol.StatusNotFound, "", 0},
		{"set text", protocol.Request{Op: protocol.OpSet, Key: []byte("t"), Value: []byte("abc")}, protocol.StatusOK, "", 0},
		{"incr non-numeric", protocol.Request{Op: protocol.OpIncr, Key: []byte("t"), Delta: 1}, protocol.StatusNonNumeric, "", 0},
		{"touch", protocol.Request{Op: protocol.OpTouch, Key: []byte("t"), Exptime: 100}, protocol.StatusOK, "", 0},
		{"gat", protocol.Request{Op: protocol.OpGat, Keys: keys("t"), Exptime: 100}, protocol.StatusOK, "abc", 0},
		{"delete", protocol.Request{Op: protocol.OpDelete, Key: []byte("t")}, protocol.StatusOK, "", 0},
		{"delete missing", protocol.Request{Op: protocol.OpDelete, Key: []byte("t")}, protocol.StatusNotFound, "", 0},
		{"cas mismatch", protocol.Request{Op: protocol.OpCas, Key: []byte("a"), Value: []byte("z"), Cas: 1}, protocol.StatusExists, "", 0},
		{"flush", protocol.Request{Op: protocol.OpFlushAll}, protocol.StatusOK, "", 0},
		{"get after flush", protocol.Request{Op: protocol.OpGet, Keys: keys("a")}, protocol.StatusNotFound, "", 0},
	}
	for _, st := range steps {
		r := do(t, s, &st.req)
		if r.Status != st.status || string(r.Value) != st.value || r.Number != st.number {
			t.Errorf("%s: got status %d value %q number %d; want %d %q %d", st.name, r.Status, r.Value, r.Number, st.status, st.value, st.number)
		}
	}

	r := do(t, s, &protocol.Request{Op: protocol.OpVersion})
	if r.Status != protocol.StatusOK || len(r.Value) == 0 {
		t.Errorf("version: %+v", r)
	}
	r = do(t, s, &protocol.Request{Op: protocol.OpStats})
	found := false
	for _, st := range r.Stats {
		found = found || st.Name == "pid"
	}
	if r.Status != protocol.StatusOK || !found {
		t.Errorf("stats: status %d, %d lines, pid found %v", r.Status, len(r.Stats), found)
	}
}

func TestMultiGetOrderRepeatsAndCas(t *testing.T) {
	mc := memcachedtest.Start(t)
	s := newServer(t, mc.Addr, Options{Timeout: 2 * time.Second})
	for i := range 50 {
		if i%5 == 0 {
			continue // misses
		}
		do(t, s, &protocol.Request{Op: protocol.OpSet, Key: []byte("k" + strconv.Itoa(i)), Value: []byte("v" + strconv.Itoa(i)), Flags: uint32(i)})
	}
	var ks []string
	for i := 49; i >= 0; i-- {
		ks = append(ks, "k"+strconv.Itoa(i))
	}
	ks = append(ks, "k1", "k1", "k0") // repeats of a hit and a miss
	before := memcachedtest.Stats(t, mc.Addr)["cmd_get"]
	req := protocol.Request{Op: protocol.OpGets, Keys: keys(ks...)}
	resps := make([]protocol.Response, len(ks))
	if err := pool.Do(context.Background(), s, nil, &req, resps); err != nil {
		t.Fatal(err)
	}
	for j, k := range ks {
		i, _ := strconv.Atoi(k[1:])
		r := resps[j]
		if string(r.Key) != k {
			t.Fatalf("answer %d is for %q, want %q", j, r.Key, k)
		}
		if i%5 == 0 {
			if r.Status != protocol.StatusNotFound {
				t.Errorf("%s: status %d, want miss", k, r.Status)
			}
			continue
		}
		if r.Status != protocol.StatusOK || string(r.Value) != "v"+k[1:] || r.Flags != uint32(i) || r.Cas == 0 {
			t.Errorf("%s: %+v", k, r)
		}
	}
	after := memcachedtest.Stats(t, mc.Addr)["cmd_get"]
	b, _ := strconv.Atoi(before)
	a, _ := strconv.Atoi(after)
	if a-b != 50 {
		t.Errorf("memcached counted %d gets for 50 distinct keys (53 asked)", a-b)
	}
}

// TestConcurrentPipelining runs many callers over two connections and checks that every
// caller gets its own answers: no answer goes to the wrong request.
func TestConcurrentPipelining(t *testing.T) {
	mc := memcachedtest.Start(t)
	s := newServer(t, mc.Addr, Options{Connections: 2, Timeout: 5 * time.Second})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resps := make([]protocol.Response, 3)
			for i := range 200 {
				k := fmt.Sprintf("g%d:%d", g, i)
				set := protocol.Request{Op: protocol.OpSet, Key: []byte(k), Value: []byte(k)}
				if err := pool.Do(context.Background(), s, nil, &set, resps[:1]); err != nil || resps[0].Status != protocol.StatusOK {
					errs <- fmt.Errorf("set %s: %v %+v", k, err, resps[0])
					return
				}
				get := protocol.Request{Op: protocol.OpGet, Keys: keys(k, "missing", k)}
				if err := pool.Do(context.Background(), s, nil, &get, resps); err != nil {
					errs <- err
					return
				}
				if string(resps[0].Value) != k || string(resps[2].Value) != k || resps[1].Status != protocol.StatusNotFound {
					errs <- fmt.Errorf("get %s: got %q / %q / %d", k, resps[0].Value, resps[2].Value, resps[1].Status)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// fakeServer is a binary-protocol server whose answers the test controls.
type fakeServer struct {
	ln      net.Listener
	handle  func(n int, req *protocol.Request) (resp *protocol.Response, delay time.Duration, hangup bool)
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
	count   int
	accepts int
}

func startFake(t *testing.T, handle func(n int, req *protocol.Request) (*protocol.Response, time.Duration, bool)) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{ln: ln, handle: handle}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *fakeServer) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		f.accepts++
		f.mu.Unlock()
		f.wg.Add(1)
		go f.serve(c)
	}
}

func (f *fakeServer) serve(c net.Conn) {
	defer f.wg.Done()
	defer c.Close()
	br := bufio.NewReader(c)
	dec := protocol.NewBinaryReader(br, protocol.DefaultLimits())
	var req protocol.Request
	for {
		if err := dec.Read(&req); err != nil {
			return
		}
		f.mu.Lock()
		n := f.count
		f.count++
		f.mu.Unlock()
		resp, delay, hangup := f.handle(n, &req)
		if hangup {
			return
		}
		if delay > 0 {
			time.Sleep(delay) // the fake server is slow on purpose
		}
		if resp != nil {
			if _, err := c.Write(protocol.AppendBinaryResponse(nil, &req, resp)); err != nil {
				return
			}
		}
	}
}

func (f *fakeServer) close() {
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func getKey(t *testing.T, s *Server, key string) (protocol.Response, error) {
	t.Helper()
	var resps [1]protocol.Response
	err := pool.Do(context.Background(), s, nil, &protocol.Request{Op: protocol.OpGet, Keys: keys(key)}, resps[:])
	return resps[0], err
}

// TestTimeoutLateAnswerDropped: an answer that arrives after its request timed out is
// recognised by its opaque and dropped; the next request on the connection gets its own.
func TestTimeoutLateAnswerDropped(t *testing.T) {
	release := make(chan struct{})
	f := startFake(t, func(n int, req *protocol.Request) (*protocol.Response, time.Duration, bool) {
		if n == 0 {
			<-release // answer the first request only after its caller gave up
		}
		return &protocol.Response{Value: req.Keys[0], Key: req.Keys[0]}, 0, false
	})
	s := newServer(t, f.ln.Addr().String(), Options{Connections: 1, Timeout: 100 * time.Millisecond})
	start := time.Now()
	_, err := getKey(t, s, "slow")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("slow get: err %v, want timeout", err)
	}
	if d := time.Since(start); d > 10*time.Second { // a hang, not a slow machine
		t.Errorf("a timeout of 100ms took %v", d)
	}
	close(release)
	// The late "slow" answer reaches the connection first; this caller must get "fast".
	r, err := getKey(t, s, "fast")
	if err != nil || string(r.Value) != "fast" {
		t.Fatalf("next get: %v %q", err, r.Value)
	}
}

// TestTimeoutLateRunAnswersDropped: the answers of a run (binary sets, answered one by one;
// meta sets) go straight to the caller's answers as they arrive, so those that arrive after
// the run timed out must not: the caller has its answers back, and uses them again at once.
func TestTimeoutLateRunAnswersDropped(t *testing.T) {
	for _, meta := range []bool{false, true} {
		t.Run(map[bool]string{false: "binary", true: "meta"}[meta], func(t *testing.T) {
			release := make(chan struct{})
			var addr string
			if meta {
				addr = startLateMeta(t, release)
			} else {
				f := startFake(t, func(n int, req *protocol.Request) (*protocol.Response, time.Duration, bool) {
					if n == 0 {
						<-release // answer the run only after its caller gave up
					}
					return &protocol.Response{Cas: 777}, 0, false
				})
				addr = f.ln.Addr().String()
			}
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free) // before the fake's own, which waits for its connections to end
			s := newServer(t, addr, Options{Connections: 1, Timeout: 100 * time.Millisecond, FailureLimit: 100})
			const n = 3
			reqs := make([]protocol.Request, n)
			for i := range reqs {
				reqs[i] = protocol.Request{Op: protocol.OpSet, Key: []byte("k" + strconv.Itoa(i)), Value: []byte("v"), Binary: true}
				if meta {
					reqs[i] = *metaRequest(t, "ms k"+strconv.Itoa(i)+" 1\r\nv\r\n")
				}
			}
			resps := make([]protocol.Response, n)
			errs := make([]error, n)
			pool.DoBatch(context.Background(), s, nil, reqs, resps, errs)
			for i, err := range errs {
				if !errors.Is(err, ErrTimeout) {
					t.Fatalf("set %d: %v, want a timeout", i, err)
				}
			}
			for i := range resps {
				resps[i] = protocol.Response{Status: protocol.StatusNotStored} // the caller's again
			}
			free()
			// The late answers reach the connection first; once this get is answered they
			// have been read.
			var after [1]protocol.Response
			get := &protocol.Request{Op: protocol.OpGet, Keys: keys("after")}
			if meta {
				get = metaRequest(t, "mg after v\r\n")
			}
			if err := pool.Do(context.Background(), s, nil, get, after[:]); err != nil {
				t.Fatalf("get after the late answers: %v", err)
			}
			for i := range resps {
				if resps[i].Status != protocol.StatusNotStored || resps[i].Cas != 0 {
					t.Errorf("answer %d changed after its run timed out: %+v", i, resps[i])
				}
			}
		})
	}
}

// startLateMeta is a meta-protocol server on a free loopback port that answers each ms
// HD, and the first only once release is closed, and every other request EN; it returns
// its address.
func startLateMeta(t *testing.T, release chan struct{}) string {
	var first sync.Once
	return memcachedtest.StartFake(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			answer := "EN\r\n"
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "ms" {
				n, _ := strconv.Atoi(f[2])
				if _, err := io.CopyN(io.Discard, br, int64(n)+2); err != nil {
					return
				}
				first.Do(func() { <-release })
				answer = "HD\r\n"
			}
			if _, err := io.WriteString(c, answer); err != nil {
				return
			}
		}
	}).Addr
}

// TestBrokenConnectionFailsInFlight: when the server hangs up, every request in flight on
// the connection fails at once, and the connection comes back by itself.
func TestBrokenConnectionFailsInFlight(t *testing.T) {
	f := startFake(t, func(n int, req *protocol.Request) (*protocol.Response, time.Duration, bool) {
		if n == 0 {
			return nil, 0, true // hang up on the first request
		}
		return &protocol.Response{Value: []byte("ok")}, 0, false
	})
	const timeout = 30 * time.Second
	s := newServer(t, f.ln.Addr().String(), Options{Connections: 1, Timeout: timeout, RetryMin: 10 * time.Millisecond})
	start := time.Now()
	_, err := getKey(t, s, "a")
	if err == nil {
		t.Fatal("get on a connection the server closed succeeded")
	}
	if d := time.Since(start); d >= timeout || errors.Is(err, ErrTimeout) {
		t.Errorf("failing took %v (%v); a broken connection must fail it, not its timeout of %v", d, err, timeout)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := getKey(t, s, "b")
		if err == nil {
			if string(r.Value) != "ok" {
				t.Fatalf("after reconnect: %q", r.Value)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect within 5s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRefusedFailsFast: nothing listens; requests fail without waiting for their timeout.
func TestRefusedFailsFast(t *testing.T) {
	addr := memcachedtest.FreeAddr(t)
	const timeout = 30 * time.Second
	s := newServer(t, addr, Options{Connections: 2, Timeout: timeout})
	for range 3 {
		start := time.Now()
		_, err := getKey(t, s, "a")
		if err == nil {
			t.Fatal("get to a refusing address succeeded")
		}
		if d := time.Since(start); d >= timeout || errors.Is(err, ErrTimeout) {
			t.Fatalf("refused get took %v (timeout %v): %v", d, timeout, err)
		}
	}
}

// withDefaults fills the settings opts leaves zero with the config's defaults.
func withDefaults(opts Options) Options {
	d := config.NewPool("")
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	if opts.Connections == 0 {
		opts.Connections = d.Connections
	}
	if opts.FailureLimit == 0 {
		opts.FailureLimit = d.FailureLimit
	}
	set(&opts.ConnectTimeout, d.ConnectTimeout)
	set(&opts.Timeout, d.Timeout)
	set(&opts.RetryMin, d.DeadBackoff)
	set(&opts.RetryMax, max(d.DeadBackoffMax, opts.RetryMin))
	return opts
}
