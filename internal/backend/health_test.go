package backend

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
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
