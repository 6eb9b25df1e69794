package servertest

import (
	"context"
	"reflect"
	"runtime"
	"sync/atomic"
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

// request is the context of one client request: it carries the request's turn (answering
// turn.ContextKey itself, as the turn package allows) and counts the calls of
// turn.Dispatched made for it.
//
// Why count calls rather than watch the turn: what the next turn observes cannot tell one
// dispatch from two (the second is a no-op on a released turn), and the unexported released
// flag cannot be read from here. A second dispatch matters where the turn was split
// (turn.Split, a multi-key get over several servers): it gives the turn on before the other
// shares are on their way. The count says exactly what the contract says: one call per
// request, or per batch.
type request struct {
	context.Context
	own, behind *turn.Turn

	dispatches atomic.Int32 // calls of turn.Dispatched with this context, or one derived from it
	returned   int32        // dispatches when the call returned; owned by the test goroutine
}

// request makes the context of the client's next request, and the turn of the one after it.
func (c *client) request(parent context.Context) *request {
	r := &request{Context: parent, own: c.next}
	c.next = new(turn.Turn)
	c.chain.Next(c.next)
	r.behind = c.next
	c.reqs = append(c.reqs, r)
	return r
}

func (r *request) Value(key any) any {
	if _, ok := key.(turn.ContextKey); !ok {
		return r.Context.Value(key)
	}
	if inDispatched() {
		r.dispatches.Add(1)
	}
	return r.own
}

// dispatchedName is turn.Dispatched's name in stack traces.
var dispatchedName = runtime.FuncForPC(reflect.ValueOf(turn.Dispatched).Pointer()).Name()

// inDispatched reports whether turn.Dispatched is looking the turn up: it is among the few
// frames above Value (turn.From, and the context package's frames of the contexts a server
// derived from the request's). Inlined frames are reported too.
func inDispatched() bool {
	var pcs [16]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs[:])])
	for {
		f, more := frames.Next()
		if f.Function == dispatchedName {
			return true
		}
		if !more {
			return false
		}
	}
}

// settled checks, once the call made with r has returned, that it dispatched r exactly
// once and that this let the client's next request start.
func (r *request) settled(t *testing.T) {
	t.Helper()
	n := r.dispatches.Load()
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
		if n := r.dispatches.Load(); n != r.returned {
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

// TestRequestCounts: the probe counts the calls of turn.Dispatched for its request, through
// contexts derived from it and through turn.Defer's done, and nothing else that reads the
// turn; and settled sees the next request's turn given on.
func TestRequestCounts(t *testing.T) {
	c := newClient(t)
	r := c.request(context.Background())
	derived, cancel := context.WithTimeout(r, bound)
	defer cancel()
	turn.Affinity(derived)
	turn.Switch(derived, c, 1)
	each, done := turn.Defer(derived)
	turn.Dispatched(each) // the deferred dispatches are not the request's
	turn.Dispatched(each)
	if n := r.dispatches.Load(); n != 0 {
		t.Fatalf("counted %d dispatches before done, want 0", n)
	}
	done()
	if n := r.dispatches.Load(); n != 1 {
		t.Fatalf("counted %d dispatches after done, want 1", n)
	}
	r.settled(t)

	twice := c.request(context.Background())
	turn.Dispatched(twice)
	turn.Dispatched(twice)
	if n := twice.dispatches.Load(); n != 2 {
		t.Fatalf("counted %d of 2 dispatches", n)
	}
	within(t, "the next request's turn", twice.behind.Wait)
}
