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
		if !answering.Load() {
			return nil, 0, false // swallow the request: the caller times out
		}
		return &protocol.Response{Value: []byte("ok")}, 0, false
	})
	s := newServer(t, f.ln.Addr().String(), Options{Connections: 1, Timeout: 50 * time.Millisecond, FailureLimit: 2, RetryMin: 20 * time.Millisecond, RetryMax: 40 * time.Millisecond})
	for i := range 2 {
		if _, err := getKey(t, s, "a"); !errors.Is(err, ErrTimeout) {
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
	if d := time.Since(start); d > 20*time.Millisecond {
		t.Errorf("a dead server's request took %v; it must fail at once", d)
	}
	answering.Store(true)
	deadline := time.Now().Add(5 * time.Second)
	for !s.Up() {
		if time.Now().After(deadline) {
			t.Fatal("server answering again but not marked up within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r, err := getKey(t, s, "a"); err != nil || string(r.Value) != "ok" {
		t.Fatalf("after recovery: %v %q", err, r.Value)
	}
}

// TestRefusedMarksDeadAtOnce: a server nobody listens for is dead after the first dial.
func TestRefusedMarksDeadAtOnce(t *testing.T) {
	f := startFake(t, func(int, *protocol.Request) (*protocol.Response, time.Duration, bool) { return nil, 0, false })
	addr := f.ln.Addr().String()
	f.close() // now nothing listens there
	s := newServer(t, addr, Options{Connections: 2, Timeout: time.Second})
	if _, err := getKey(t, s, "a"); err == nil {
		t.Fatal("request to a refusing address succeeded")
	}
	if s.Up() {
		t.Error("refused connections did not mark the server dead")
	}
}

// TestInFlightBound: past MaxInFlight a request waits for room up to its timeout, then
// fails; it never queues without bound.
func TestInFlightBound(t *testing.T) {
	release := make(chan struct{})
	f := startFake(t, func(n int, req *protocol.Request) (*protocol.Response, time.Duration, bool) {
		<-release
		return &protocol.Response{Value: []byte("ok")}, 0, false
	})
	defer close(release)
	s := newServer(t, f.ln.Addr().String(), Options{Connections: 1, Timeout: 200 * time.Millisecond, MaxInFlight: 2, FailureLimit: 100})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = getKey(t, s, "slow") }() // hold both slots until they time out
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.inFlight.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two slow requests never got in flight")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	_, err := getKey(t, s, "third")
	if !errors.Is(err, ErrOverload) && !errors.Is(err, ErrTimeout) {
		t.Fatalf("third request: %v, want overload (or a timeout if room freed up meanwhile)", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("third request took %v; bound is its timeout", d)
	}
	wg.Wait()
}
