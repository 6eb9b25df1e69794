package test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// faultProxy is a TCP relay between moxi and a memcached that delays what moxi sends by a
// random time up to maxDelay and resets every connection it holds every cutEvery: a flaky
// network. What moxi sent is never delivered after its connection was closed, by moxi or
// by a reset; and what was delivered before is executed by memcached before anything else
// is delivered on any connection: a closed connection's server side is half-closed and
// drained to its end first (memcached executes the requests it has, then hangs up), so
// that a request moxi gave up on cannot land after one it sent later.
type faultProxy struct {
	ln       net.Listener
	target   string
	maxDelay time.Duration
	cuts     atomic.Int64 // resets so far

	mu        sync.Mutex
	pairs     []*relayPair // open, guarded by mu
	undrained int          // closed pairs whose server side has not ended; guarded by mu
	drained   sync.Cond    // broadcast when undrained drops; L is &mu
	wg        sync.WaitGroup
	stop      chan struct{}
}

// relayPair is one relayed connection: moxi's side and the server's.
type relayPair struct {
	client, server *net.TCPConn
	closed         atomic.Bool // moxi's side closed (by moxi or a reset): deliver nothing more
}

func startFaultProxy(t testing.TB, target string, maxDelay, cutEvery time.Duration) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	f := &faultProxy{ln: ln, target: target, maxDelay: maxDelay, stop: make(chan struct{})}
	f.drained.L = &f.mu
	f.wg.Add(2)
	go f.accept()
	go f.cutLoop(cutEvery)
	t.Cleanup(f.close)
	return f
}

func (f *faultProxy) addr() string { return f.ln.Addr().String() }

func (f *faultProxy) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		p := &relayPair{client: c.(*net.TCPConn), server: s.(*net.TCPConn)}
		f.mu.Lock()
		f.pairs = append(f.pairs, p)
		f.mu.Unlock()
		f.wg.Add(2)
		go f.upstream(p)
		go f.downstream(p)
	}
}

// closeClient ends moxi's side of p; the first call counts p as undrained until its server
// side ends (downstream).
func (f *faultProxy) closeClient(p *relayPair) {
	if p.closed.Swap(true) {
		return
	}
	f.mu.Lock()
	f.undrained++
	f.mu.Unlock()
	p.client.Close()
}

// upstream relays moxi's requests to the server, each chunk after a random delay and once
// every closed connection is drained, until moxi's side closes; then it half-closes the
// server side, which makes memcached execute what it has and hang up.
func (f *faultProxy) upstream(p *relayPair) {
	defer f.wg.Done()
	type chunk struct {
		b  []byte
		at time.Time
	}
	chunks := make(chan chunk, 1024)
	go func() { // the reader: ends with moxi's side
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := p.client.Read(buf)
			if n > 0 {
				chunks <- chunk{buf[:n], time.Now().Add(time.Duration(rand.Int64N(int64(f.maxDelay) + 1)))}
			}
			if err != nil {
				f.closeClient(p)
				return
			}
		}
	}()
	var last time.Time
	for c := range chunks {
		at := c.at
		if at.Before(last) {
			at = last // a stream stays in order
		}
		last = at
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		f.mu.Lock()
		for f.undrained > 0 && !p.closed.Load() {
			f.drained.Wait()
		}
		f.mu.Unlock()
		if p.closed.Load() {
			continue // never delivered after a close: drain what the reader still holds
		}
		if _, err := p.server.Write(c.b); err != nil {
			f.closeClient(p)
		}
	}
	p.server.CloseWrite()
}

// downstream relays the server's answers to moxi until the server hangs up (discarding
// them once moxi's side is closed), then ends p.
func (f *faultProxy) downstream(p *relayPair) {
	defer f.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		p.server.SetReadDeadline(time.Now().Add(10 * time.Second)) // a memcached that never hangs up
		n, err := p.server.Read(buf)
		if n > 0 && !p.closed.Load() {
			if _, werr := p.client.Write(buf[:n]); werr != nil {
				f.closeClient(p)
			}
		}
		if err != nil {
			break
		}
	}
	f.closeClient(p)
	p.server.Close()
	f.mu.Lock()
	f.undrained--
	f.drained.Broadcast()
	f.mu.Unlock()
}

// cutLoop resets every relayed connection every cutEvery, until close.
func (f *faultProxy) cutLoop(every time.Duration) {
	defer f.wg.Done()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-tick.C:
		}
		f.closeAll()
		f.cuts.Add(1)
	}
}

func (f *faultProxy) closeAll() {
	f.mu.Lock()
	pairs := f.pairs
	f.pairs = nil
	f.mu.Unlock()
	for _, p := range pairs {
		f.closeClient(p)
	}
}

func (f *faultProxy) close() {
	close(f.stop)
	f.ln.Close()
	f.closeAll()
	f.wg.Wait()
}

// TestRetriedWritesKeepOrder: clients pipeline pairs of writes of one key ("set k v1",
// a get of other keys, "set k v2") through moxi to a memcached behind a flaky network
// (connections reset every 30 ms, bytes delayed up to 3 ms, less than the timeout). A
// write that got no answer is retried (retries: 1); a retried write must never take effect
// after a later request of its key: every key ends at the last version acknowledged.
func TestRetriedWritesKeepOrder(t *testing.T) {
	mc := memcachedtest.Start(t)
	link := startFaultProxy(t, mc.Addr, 3*time.Millisecond, 30*time.Millisecond)
	moxi := startMoxi(t, "--config", writeConfig(t, fmt.Sprintf(`watch_config: false
pools:
  main: {timeout: 2s, retries: 1, failure_limit: 1000000, failover: false, servers: [%q]}
`, link.addr())))
	const clients, pairs, perWrite = 8, 1250, 25
	acked := make([][]int, clients) // by client, by pair: the last version acknowledged (0: none)
	var wg sync.WaitGroup
	for c := range clients {
		acked[c] = make([]int, pairs)
		wg.Go(func() {
			if err := writePairs(moxi.addr, c, acked[c], perWrite); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	direct, err := dialText(mc.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	older, ackedPairs, failed := 0, 0, 0
	for c := range clients {
		for i, v := range acked[c] {
			switch v {
			case 0:
				failed++
				continue
			case 2:
				ackedPairs++
			}
			got, err := direct.get(pairKey(c, i))
			if err != nil {
				t.Fatal(err)
			}
			if got < fmt.Sprintf("v%d", v) { // "" (gone), or v1 where v2 was acknowledged
				older++
				if older <= 5 {
					t.Errorf("%s: %q on the server, v%d acknowledged last", pairKey(c, i), got, v)
				}
			}
		}
	}
	t.Logf("%d pairs through %d connection resets: both writes acknowledged for %d, neither for %d; %d keys older than acknowledged",
		clients*pairs, link.cuts.Load(), ackedPairs, failed, older)
	if older > 0 {
		t.Errorf("%d keys ended older than their last acknowledged write", older)
	}
	if ackedPairs < clients*pairs/2 {
		t.Errorf("only %d of %d pairs acknowledged: the test did not test much", ackedPairs, clients*pairs)
	}
}

func pairKey(client, i int) string { return fmt.Sprintf("pair:%d:%d", client, i) }

// writePairs writes client's pairs through addr, perWrite pairs pipelined in one write,
// and records in acked the last version of each pair's key that moxi acknowledged.
func writePairs(addr string, client int, acked []int, perWrite int) error {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	r := bufio.NewReader(nc)
	var b []byte
	for first := 0; first < len(acked); first += perWrite {
		last := min(first+perWrite, len(acked))
		b = b[:0]
		for i := first; i < last; i++ {
			k := pairKey(client, i)
			// The get between the two sets ends the run of pipelined writes: the sets are
			// two requests of their own, each retried on its own.
			b = fmt.Appendf(b, "set %s 0 0 2\r\nv1\r\nget other:%d other:%d\r\nset %s 0 0 2\r\nv2\r\n", k, i, i+1, k)
		}
		nc.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := nc.Write(b); err != nil {
			return err
		}
		for i := first; i < last; i++ {
			for v := 1; v <= 2; v++ {
				line, err := r.ReadString('\n')
				if err != nil {
					return err
				}
				if line == "STORED\r\n" {
					acked[i] = v
				} else if !strings.HasPrefix(line, "SERVER_ERROR") {
					return fmt.Errorf("set %s v%d: %q", pairKey(client, i), v, line)
				}
				if v == 2 {
					break
				}
				for { // the get's answer: its values (none are stored), then END or an error
					line, err := r.ReadString('\n')
					if err != nil {
						return err
					}
					if line == "END\r\n" || strings.HasPrefix(line, "SERVER_ERROR") {
						break
					}
					return fmt.Errorf("get other: %q", line)
				}
			}
		}
	}
	return nil
}
