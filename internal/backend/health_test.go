package backend

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestDeadAfterFailureLimitThenProbedBack: consecutive timeouts mark the server dead, after
// which requests fail at once; when it answers again the prober marks it up.
func TestDeadAfterFailureLimitThenProbedBack(t *testing.T) {
	var answering atomic.Bool
	f := startFake(t, func(n int, req *protocol.Request) (*protocol.Response, time.Duration, bool) {
		switch {
		case answering.Load():
			return &protocol.Response{Value: []byte("ok")}, 0, false
		case req.Op == protocol.OpNoop:
			return nil, 0, true // the prober's noop: hang up, so that each probe fails at once
		default:
			return nil, 0, false // swallow the request: the caller times out
		}
	})
	// The timeout is long enough that "at once" cannot be confused with "after the
	// timeout" on a loaded machine; the two requests wait for it side by side.
	const timeout = 2 * time.Second
	s := newServer(t, f.ln.Addr().String(), Options{Connections: 1, Timeout: timeout, FailureLimit: 2, RetryMin: 20 * time.Millisecond, RetryMax: 40 * time.Millisecond})
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, err := getKey(t, s, "a"); errs <- err }()
	}
	for i := range 2 {
		if err := <-errs; !errors.Is(err, ErrTimeout) {
			t.Fatalf("request %d: %v, want a timeout", i, err)
		}
	}
	if s.Up() {
		t.Fatal("server still up after failure_limit timeouts")
	}
	start := time.Now()
	if _, err := getKey(t, s, "a"); !errors.Is(err, ErrDead) {
		t.Fatalf("request to a dead server: %v, want ErrDead", err)
	}
	d := time.Since(start)
	t.Logf("a dead server's request failed after %v (timeout %v)", d, timeout)
	if d >= timeout {
		t.Errorf("a dead server's request took %v, its whole timeout; it must fail at once", d)
	}
	answering.Store(true)
	deadline := time.Now().Add(20 * time.Second)
	for !s.Up() {
		if time.Now().After(deadline) {
			t.Fatal("server answering again but not marked up within 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r, err := getKey(t, s, "a"); err != nil || string(r.Value) != "ok" {
		t.Fatalf("after recovery: %v %q", err, r.Value)
	}
}

// TestRefusedMarksDeadAtOnce: a server nobody listens for is dead after the first dial, not
// after failure_limit failed requests.
func TestRefusedMarksDeadAtOnce(t *testing.T) {
	f := startFake(t, func(int, *protocol.Request) (*protocol.Response, time.Duration, bool) { return nil, 0, false })
	addr := f.ln.Addr().String()
	f.close() // now nothing listens there
	s := newServer(t, addr, Options{Connections: 2, Timeout: time.Second, FailureLimit: 100})
	if _, err := getKey(t, s, "a"); err == nil {
		t.Fatal("request to a refusing address succeeded")
	}
	// The dialer marks it dead, in its own goroutine: the failed request may return first.
	deadline := time.Now().Add(20 * time.Second)
	for s.Up() {
		if time.Now().After(deadline) {
			t.Fatal("refused connections did not mark the server dead within 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestInFlightBound: past MaxInFlight a request waits for room up to its timeout, then
// fails; it never queues without bound, and never goes out beyond the bound.
func TestInFlightBound(t *testing.T) {
	const timeout = 500 * time.Millisecond
	received := make(chan struct{}, 3)
	var server atomic.Pointer[Server] // set once s exists, before any request
	var maxInFlight atomic.Int64      // the most requests in flight when one reached the server
	f := startFake(t, func(n int, req *protocol.Request) (*protocol.Response, time.Duration, bool) {
		cur := server.Load().inFlight.Load()
		for m := maxInFlight.Load(); cur > m && !maxInFlight.CompareAndSwap(m, cur); m = maxInFlight.Load() {
		}
		received <- struct{}{}
		return nil, 0, false // swallow it: the request holds its slot until it times out
	})
	s := newServer(t, f.ln.Addr().String(), Options{Connections: 1, Timeout: timeout, MaxInFlight: 2, FailureLimit: 100})
	server.Store(s)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = getKey(t, s, "slow") }() // hold both slots until they time out
	}
	for range 2 {
		select {
		case <-received:
		case <-time.After(20 * time.Second):
			t.Fatal("the two slow requests never reached the server")
		}
	}
	start := time.Now()
	_, err := getKey(t, s, "third")
	d := time.Since(start)
	// The slow requests time out, freeing their slots, about when the third's wait for room
	// ends: it fails for want of room, or gets a slot and times out on the server.
	if !errors.Is(err, ErrOverload) && !errors.Is(err, ErrTimeout) {
		t.Fatalf("third request: %v, want overload (or a timeout if room freed up meanwhile)", err)
	}
	bound := 4*2*timeout + time.Second // a wait for room, then a timeout: 2×timeout, with margin
	t.Logf("third request: %v after %v (timeout %v)", err, d, timeout)
	if d > bound {
		t.Errorf("third request took %v; bound is its timeout, twice (%v with margin)", d, bound)
	}
	wg.Wait()
	if m := maxInFlight.Load(); m > 2 {
		t.Errorf("%d requests in flight at once with MaxInFlight 2", m)
	}
}

// onRecord is a slog handler that calls each record's message's function, if any.
type onRecord map[string]func()

func (h onRecord) Enabled(context.Context, slog.Level) bool { return true }
func (h onRecord) Handle(_ context.Context, r slog.Record) error {
	if f := h[r.Message]; f != nil {
		f()
	}
	return nil
}
func (h onRecord) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onRecord) WithGroup(string) slog.Handler      { return h }

// TestMetaConnsDialedAsTheServerComesBack: at the instant a dead server is marked up
// again, every meta connection not connected counts as being dialed, as the binary ones
// do, before its dial loop has woken: a meta request made then waits for that dial
// instead of failing for want of a connection (ErrDown). A replicated pool's copy reads
// are meta requests: one failed so just after its server came back, and the write that
// needed it answered a temporary failure.
func TestMetaConnsDialedAsTheServerComesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const conns = 4
		d := newPipeDial(t, false)
		var s *Server
		var idle []int // per round, the meta connections neither connected nor being dialed
		logger := slog.New(onRecord{"backend up again": func() {
			// Within markUp, just after the dial loops were woken.
			n := 0
			s.meta.mu.Lock()
			conns := s.meta.conns
			s.meta.mu.Unlock()
			for _, c := range conns {
				c.mu.Lock()
				if !c.dialing && c.nc == nil {
					n++
				}
				c.mu.Unlock()
			}
			idle = append(idle, n)
		}})
		s = newServer(t, "memcached:11211", Options{Connections: conns, RetryMin: time.Second, RetryMax: time.Second, Logger: logger, dial: d.dial})
		for range conns {
			s.metaConn(nil, true) // every meta connection, by round robin
		}
		const rounds = 5
		for round := range rounds {
			synctest.Wait()
			d.setDown(true)
			d.hangUp() // every connection breaks, and its redial fails: the server is dead
			synctest.Wait()
			if s.Up() {
				t.Fatalf("round %d: the server is up after its connections broke and could not be dialed again", round)
			}
			d.setDown(false)
			// The bubble's clock: this waits for no wall-clock time, only until every
			// goroutine of the bubble is blocked and its clock is past the probe, which finds
			// the server back.
			time.Sleep(2 * time.Second)
			synctest.Wait()
		}
		if len(idle) != rounds {
			t.Fatalf("marked up %d times, want %d", len(idle), rounds)
		}
		if slices.Max(idle) > 0 {
			t.Errorf("meta connections neither connected nor being dialed as the server was marked up, by round: %v", idle)
		}
	})
}
