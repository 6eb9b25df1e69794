package backend

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// TestTurnsKeepClientOrder: the pipelined requests of one client connection, run at once
// as the frontend runs them (each waits for its turn, then Do, then gives the turn on),
// reach memcached in the order the client sent them, over a server with four connections:
// every get sees the set sent just before it. Without affinity a get can go out on another
// backend connection, another memcached thread, and be executed before its set.
func TestTurnsKeepClientOrder(t *testing.T) {
	mc := memcachedtest.Start(t)
	s := newServer(t, mc.Addr, Options{Connections: 4, Timeout: 10 * time.Second})
	const n = 1000 // alternating set k vN, get k
	chain := turn.NewChain(1)
	turns := make([]turn.Turn, n)
	resps := make([]protocol.Response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		tn := &turns[i]
		chain.Next(tn) // by the "reader", in the order the client sent the requests
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := protocol.Request{Op: protocol.OpGet, Keys: keys("k")}
			if i%2 == 0 {
				req = protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("v" + strconv.Itoa(i/2))}
			}
			tn.Wait()
			errs[i] = pool.Do(context.Background(), s, tn, &req, resps[i:i+1])
			tn.Release()
		}()
	}
	wg.Wait()
	out := 0
	for i := range n {
		switch {
		case errs[i] != nil:
			t.Errorf("request %d: %v", i, errs[i])
		case i%2 == 0 && resps[i].Status != protocol.StatusOK:
			t.Errorf("set %d: status %d", i, resps[i].Status)
		case i%2 == 1 && string(resps[i].Value) != "v"+strconv.Itoa(i/2):
			out++
			if out <= 5 {
				t.Errorf("get %d: %q (status %d), want the value of the set before it, %q", i, resps[i].Value, resps[i].Status, "v"+strconv.Itoa(i/2))
			}
		}
	}
	if out > 0 {
		t.Errorf("%d of %d gets out of order", out, n/2)
	}
}

// TestDoDispatchesOnce: Do gives its request's turn on exactly once, whether the request
// is sent or fails before it could be.
func TestDoDispatchesOnce(t *testing.T) {
	answer := startFake(t, func(int, *protocol.Request) (*protocol.Response, time.Duration, bool) {
		return &protocol.Response{Value: []byte("ok")}, 0, false
	})
	swallow := startFake(t, func(int, *protocol.Request) (*protocol.Response, time.Duration, bool) { return nil, 0, false })
	refused := memcachedtest.FreeAddr(t)
	get := func(ctx context.Context, order *turn.Turn, s *Server) error {
		var resps [1]protocol.Response
		return pool.Do(ctx, s, order, &protocol.Request{Op: protocol.OpGet, Keys: keys("a")}, resps[:])
	}
	cases := []struct {
		name string
		do   func(t *testing.T, order *turn.Turn) error
		want error // nil: answered
	}{
		{"answered", func(t *testing.T, order *turn.Turn) error {
			return get(context.Background(), order, newServer(t, answer.ln.Addr().String(), Options{Connections: 2}))
		}, nil},
		{"timeout", func(t *testing.T, order *turn.Turn) error {
			return get(context.Background(), order, newServer(t, swallow.ln.Addr().String(), Options{Timeout: 50 * time.Millisecond}))
		}, ErrTimeout},
		{"canceled", func(t *testing.T, order *turn.Turn) error {
			s := newServer(t, answer.ln.Addr().String(), Options{})
			if err := get(context.Background(), nil, s); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return get(ctx, order, s)
		}, context.Canceled},
		{"dead", func(t *testing.T, order *turn.Turn) error {
			s := newServer(t, refused, Options{})
			_ = get(context.Background(), nil, s) // the refused dial marks it dead
			return get(context.Background(), order, s)
		}, ErrDead},
		{"no room", func(t *testing.T, order *turn.Turn) error {
			received := make(chan struct{}, 1)
			f := startFake(t, func(int, *protocol.Request) (*protocol.Response, time.Duration, bool) {
				received <- struct{}{}
				return nil, 0, false
			})
			s := newServer(t, f.ln.Addr().String(), Options{MaxInFlight: 1, Timeout: time.Second})
			held := make(chan error)
			go func() { held <- get(context.Background(), nil, s) }() // takes the one slot, until it times out
			defer func() { <-held }()
			<-received
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			return get(ctx, order, s)
		}, context.DeadlineExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			chain := turn.NewChain(0)
			var order turn.Turn
			chain.Next(&order)
			order.Wait()
			err := tc.do(t, &order)
			if n := order.Dispatches(); n != 1 {
				t.Errorf("Do gave the turn on %d times, want once", n)
			}
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("Do: %v, want %v", err, tc.want)
			}
		})
	}
}
