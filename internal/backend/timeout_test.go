package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// bigValue fills v with the value stored under big:i, bytes that say which i they are.
func bigValue(v []byte, i int) []byte {
	v[0] = byte(i)
	for n := 1; n < len(v); n *= 2 {
		copy(v[n:], v[:n])
	}
	copy(v, strconv.Itoa(i))
	return v
}

// TestLargeAnswerIsNotATimeout: a 300 MB answer that keeps arriving takes longer than the
// timeout, and is not one; nor are the small requests queued behind it on its connection;
// and the server, which never stopped answering, is not marked dead.
func TestLargeAnswerIsNotATimeout(t *testing.T) {
	const n = 300
	mc := memcachedtest.Start(t, "-m", "1024") // room for 300 MB
	load := newServer(t, mc.Addr, Options{Timeout: 30 * time.Second})
	req := protocol.Request{Op: protocol.OpGet}
	value := make([]byte, 1_000_000)
	for i := range n {
		k := "big:" + strconv.Itoa(i)
		if r := do(t, load, &protocol.Request{Op: protocol.OpSet, Key: []byte(k), Value: bigValue(value, i)}); r.Status != protocol.StatusOK {
			t.Fatalf("set %s: status %d", k, r.Status)
		}
		req.Keys = append(req.Keys, []byte(k))
	}
	load.Close()

	const timeout = 250 * time.Millisecond
	s := newServer(t, mc.Addr, Options{Timeout: timeout, FailureLimit: 2})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var small, slow atomic.Int64 // small set+get pairs done; how many took over the timeout
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := []byte("small:" + strconv.Itoa(g))
			resps := make([]protocol.Response, 1)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				v := []byte(strconv.Itoa(i))
				set := protocol.Request{Op: protocol.OpSet, Key: k, Value: v}
				get := protocol.Request{Op: protocol.OpGet, Keys: [][]byte{k}}
				start := time.Now()
				err := pool.Do(context.Background(), s, nil, &set, resps)
				if err == nil {
					err = pool.Do(context.Background(), s, nil, &get, resps)
				}
				if err == nil && !bytes.Equal(resps[0].Value, v) {
					err = fmt.Errorf("get %s: %q, want %q", k, resps[0].Value, v)
				}
				if err != nil {
					errs <- fmt.Errorf("small request %d of goroutine %d: %w", i, g, err)
					return
				}
				small.Add(1)
				if time.Since(start) > timeout {
					slow.Add(1) // queued behind the big answer
				}
			}
		}()
	}

	resps := make([]protocol.Response, n)
	start := time.Now()
	err := pool.Do(context.Background(), s, nil, &req, resps)
	d := time.Since(start)
	close(stop)
	wg.Wait()
	close(errs)
	t.Logf("a get of %d × 1,000,000 bytes took %v with a timeout of %v", n, d, timeout)
	if err != nil {
		t.Fatalf("big get: %v", err)
	}
	for i, r := range resps {
		if r.Status != protocol.StatusOK || !bytes.Equal(r.Value, bigValue(value, i)) {
			t.Fatalf("big:%d: status %d, %d bytes", i, r.Status, len(r.Value))
		}
	}
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d small set+get meanwhile, %d of them slower than the timeout", small.Load(), slow.Load())
	if c := s.Counters(); !s.Up() || c.Timeouts != 0 {
		t.Errorf("server up %v, %d timeouts; want up, none", s.Up(), c.Timeouts)
	}
}

// TestSlowSteadyReaderIsNotATimeout: a server that takes a large batch of sets in more
// slowly than the timeout allows for the whole batch, but steadily, fails neither the write
// nor the requests.
func TestSlowSteadyReaderIsNotATimeout(t *testing.T) {
	const delay = 100 * time.Millisecond // a tenth of the timeout: room for a loaded machine
	f := startFake(t, func(int, *protocol.Request) (*protocol.Response, time.Duration, bool) {
		return &protocol.Response{}, delay, false // 1 MB per delay
	})
	const timeout = time.Second // the 32 sets take more than 3
	s := newServer(t, f.ln.Addr().String(), Options{Connections: 1, Timeout: timeout, FailureLimit: 1})
	value := make([]byte, 1_000_000)
	errs := make(chan error, 32)
	start := time.Now()
	for i := range cap(errs) {
		go func() {
			var resps [1]protocol.Response
			errs <- pool.Do(context.Background(), s, nil, &protocol.Request{Op: protocol.OpSet, Key: []byte("k" + strconv.Itoa(i)), Value: value}, resps[:])
		}()
	}
	failed := 0
	for range cap(errs) {
		if err := <-errs; err != nil {
			if failed++; failed == 1 {
				t.Error(err)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d sets failed", failed, cap(errs))
	}
	t.Logf("%d sets of 1 MB to a server reading 1 MB per %v took %v, timeout %v; %d writes", cap(errs), delay, time.Since(start), timeout, s.Counters().Writes)
	if !s.Up() {
		t.Error("server marked dead")
	}
}

// TestSilentServerTimesOut: a server that takes requests and never answers still times out
// after about Timeout.
func TestSilentServerTimesOut(t *testing.T) {
	f := startFake(t, func(int, *protocol.Request) (*protocol.Response, time.Duration, bool) { return nil, 0, false })
	const timeout = 200 * time.Millisecond
	s := newServer(t, f.ln.Addr().String(), Options{Connections: 1, Timeout: timeout, FailureLimit: 100})
	for i := range 3 {
		start := time.Now()
		_, err := getKey(t, s, "a")
		d := time.Since(start)
		t.Logf("request %d: %v after %v (timeout %v)", i, err, d, timeout)
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("request %d: %v, want a timeout", i, err)
		}
		if d > timeout+2*time.Second {
			t.Errorf("request %d timed out after %v; timeout %v", i, d, timeout)
		}
	}
}

// TestPausedMemcachedTimesOut: a memcached that stops (SIGSTOP) with requests on their way
// times them out after about Timeout.
func TestPausedMemcachedTimesOut(t *testing.T) {
	mc := memcachedtest.Start(t)
	const timeout = 200 * time.Millisecond
	s := newServer(t, mc.Addr, Options{Connections: 1, Timeout: timeout, FailureLimit: 100})
	do(t, s, &protocol.Request{Op: protocol.OpSet, Key: []byte("a"), Value: []byte("1")})
	if err := mc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer mc.Signal(syscall.SIGCONT)
	// The signal takes effect a moment later: gets answered before it are not the point.
	var err error
	var d time.Duration
	for deadline := time.Now().Add(10 * time.Second); err == nil && time.Now().Before(deadline); {
		start := time.Now()
		_, err = getKey(t, s, "a")
		d = time.Since(start)
	}
	t.Logf("%v after %v (timeout %v)", err, d, timeout)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("get from a paused memcached: %v, want a timeout", err)
	}
	if d > timeout+2*time.Second {
		t.Errorf("timed out after %v; timeout %v", d, timeout)
	}
}
