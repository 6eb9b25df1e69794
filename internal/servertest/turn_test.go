package servertest

import (
	"context"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/turn"
)

// bound is how long anything the tests wait for may take: a call that takes longer is a
// hang, and fails the test instead of stopping the suite.
const bound = 10 * time.Second

// client is one client connection's pipelined requests, with turns as the frontend gives
// them: each request's turn already has the next request's turn behind it when the request
// runs, so that the server's dispatch is what lets the next one start.
type client struct {
	chain *turn.Chain
	next  *turn.Turn // the turn of the client's next request: in the chain, its Wait returned
	reqs  []*request // every request made, to look for dispatches after their call returned
}

func newClient(t *testing.T) *client {
	t.Helper()
	c := &client{chain: turn.NewChain(0), next: new(turn.Turn)}
	c.chain.Next(c.next)
	within(t, "the first request's turn", c.next.Wait)
	return c
}

// request is one client request: its context, its turn, and the turn of the client's
// request behind it, whose Wait returns once the server gives the request's turn on.
//
// Why count calls (turn.Turn.Dispatches) rather than watch the next turn: what the next
// turn observes cannot tell one dispatch from two (the second is a no-op on a released
// turn). A second dispatch matters where the turn was split (Turn.Split, a multi-key get
// over several servers): it gives the turn on before the other shares are on their way.
// The count says exactly what pool.Server's doc says: one call per request, or per batch.
type request struct {
	ctx         context.Context
	own, behind *turn.Turn
	returned    int32 // own's dispatches when the call returned; owned by the test goroutine
}

// request makes the client's next request, with ctx, and the turn of the one after it.
func (c *client) request(ctx context.Context) *request {
	r := &request{ctx: ctx, own: c.next}
	c.next = new(turn.Turn)
	c.chain.Next(c.next)
	r.behind = c.next
	c.reqs = append(c.reqs, r)
	return r
}

// dispatches is how many times the server called Dispatched on the request's turn.
func (r *request) dispatches() int32 { return r.own.Dispatches() }

// settled checks, once the call made with r has returned, that it dispatched r exactly
// once and that this let the client's next request start.
func (r *request) settled(t *testing.T) {
	t.Helper()
	n := r.dispatches()
	r.returned = n
	if n != 1 {
		t.Errorf("turn.Dispatched called %d times for the request, want exactly once", n)
	}
	if n == 0 {
		r.own.Release() // on the server's behalf, so that the client's next request is checked
	}
	within(t, "the next request's turn", r.behind.Wait)
}

// noLateDispatches checks that no request was dispatched again after its call returned
// (by a goroutine the server left running with the request's context).
func (c *client) noLateDispatches(t *testing.T) {
	t.Helper()
	for i, r := range c.reqs {
		if n := r.dispatches(); n != r.returned {
			t.Errorf("request %d: %d calls of turn.Dispatched after its call returned", i, n-r.returned)
		}
	}
}

// within runs f and fails the test if f does not return within bound, or panics (a server
// that writes past the responses it was given).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }() // nil when f returned
		f()
	}()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case p := <-done:
		if p != nil {
			t.Fatalf("%s panicked: %v", what, p)
		}
	case <-timer.C:
		t.Fatalf("%s did not return within %v", what, bound)
	}
}

// eventually polls cond, which reads state other goroutines change, until it holds or
// bound passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s: not within %v", what, bound)
		}
	}
}
