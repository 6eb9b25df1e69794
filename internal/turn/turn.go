// Package turn keeps the pipelined requests of one client connection in the order they
// were sent while they run at once: each request waits for its turn to be dispatched to a
// server, and gives the turn on as soon as it is on its way.
//
// The interleaving it prevents, on one connection: "set k" then "get k" are both in
// flight; the get reaches memcached first (another backend connection, or the set not yet
// written) and answers the old value, though the client sent the set first. So request n
// starts only when request n-1 has been dispatched — queued on a backend connection, in
// order — and requests of one client connection share one backend connection per server
// (Affinity), whose requests memcached executes in order.
package turn

import (
	"sync"
	"sync/atomic"
)

// Chain hands out the turns of one connection, in order. Next is called by the
// connection's reader only; the rest is safe for concurrent use.
type Chain struct {
	affinity uint32

	mu   sync.Mutex
	last *Turn // the newest turn not yet released, nil when every turn is; guarded by mu

	// paths is the path of the last dispatch to each server (see Switch); forgot says
	// entries were dropped to bound it, so a server not in it may have any. Guarded by mu.
	paths      map[any]Path
	forgot     bool
	otherPaths atomic.Bool // a path other than 0 was ever used: paths is not empty
}

// NewChain returns the chain of a connection whose requests go to backend connection
// affinity (modulo their number) of every server.
func NewChain(affinity uint32) *Chain {
	return &Chain{affinity: affinity}
}

// Affinity is the backend connection (modulo their number) c's requests go to.
func (c *Chain) Affinity() uint32 { return c.affinity }

// Remembers reports whether c holds more than its affinity: a turn not given on yet, or a
// path other than 0 taken (whose requests may be in flight still). A chain that does not
// is as good as NewChain(c.Affinity()): a parked connection keeps its affinity alone.
func (c *Chain) Remembers() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last != nil || c.otherPaths.Load()
}

// Turn is one request's place in its connection's order. The zero Turn is not in any
// order: Wait returns at once and Dispatched does nothing. A Turn may be used again for
// another request once released.
type Turn struct {
	chain *Chain
	next  *Turn         // the turn after this one, once there is one; guarded by chain.mu
	ready chan struct{} // receives once when every earlier turn is released; made once

	parts      atomic.Int32 // dispatches still expected after Split
	dispatches atomic.Int32 // calls of Dispatched since Next
	held       atomic.Bool  // an After turn: no dispatch gives it on
	released   atomic.Bool
	taken      bool // Ready found the turn ready: Wait returns at once
}

// Leave takes a released turn out of its chain, so that it is zero again (Zero) until the
// next Next; it keeps its wake-up channel for that.
func (t *Turn) Leave() { t.chain, t.next = nil, nil }

// Zero reports whether t is the zero Turn, in no order.
func (t *Turn) Zero() bool { return t.chain == nil }

// Next makes t the connection's next turn.
func (c *Chain) Next(t *Turn) {
	if t.ready == nil {
		t.ready = make(chan struct{}, 1)
	}
	t.chain, t.next, t.taken = c, nil, false
	t.parts.Store(0)
	t.dispatches.Store(0)
	t.held.Store(false)
	t.released.Store(false)
	c.mu.Lock()
	prev := c.last
	c.last = t
	if prev != nil {
		prev.next = t // prev's Release lets t go
	}
	c.mu.Unlock()
	if prev == nil {
		t.ready <- struct{}{}
	}
}

// Wait blocks until every earlier turn of the chain has been dispatched. Earlier turns are
// released at the latest when their request ends, which every request does within its
// timeouts, so Wait needs no deadline of its own.
func (t *Turn) Wait() {
	if t.chain != nil && !t.taken {
		<-t.ready
	}
}

// Ready reports whether every earlier turn of the chain has been dispatched, without
// waiting; once it has said so, Wait returns at once.
func (t *Turn) Ready() bool {
	if t.chain == nil || t.taken {
		return true
	}
	select {
	case <-t.ready:
		t.taken = true
		return true
	default:
		return false
	}
}

// Release gives the turn on; the next request may start. Idempotent. A turn is released
// after its Wait returned, so turns are released in order.
func (t *Turn) Release() {
	if t.chain == nil || t.released.Swap(true) {
		return
	}
	c := t.chain
	c.mu.Lock()
	next := t.next
	if c.last == t {
		c.last = nil
	}
	c.mu.Unlock()
	if next != nil {
		next.ready <- struct{}{}
	}
}

// Defer returns a turn for dispatches made one after the other on behalf of t's request —
// each on the connection's affinity, minding its paths (Switch) — that do not give t on,
// and done, which counts them as the request's one dispatch (see Dispatched: with Split,
// that need not give the turn on either). Call done after the last of them, or after
// it failed. A nil t gives nil and a done that does nothing.
func (t *Turn) Defer() (each *Turn, done func()) {
	if t == nil || t.chain == nil {
		return nil, func() {}
	}
	return t.After(), t.Dispatched
}

// After returns a turn for the dispatches a request makes after its own, on its behalf (a
// backup read, a warm-up copy): on the connection's affinity, minding its paths, and never
// giving t on, which the request's own dispatch does (or did). nil for a nil t.
func (t *Turn) After() *Turn {
	if t == nil || t.chain == nil {
		return nil
	}
	stand := &Turn{chain: t.chain} // same connection, but never released by a dispatch
	stand.held.Store(true)
	return stand
}

// Dispatched tells the request's turn that one of its dispatches is on its way: queued on
// a backend connection, or executed by an in-process store. A server calls it exactly once
// per request it is given, whether it sends it or fails it at once (Dispatches counts the
// calls, for the tests that check it). A nil t is no order: nothing happens.
func (t *Turn) Dispatched() {
	if t == nil {
		return
	}
	t.dispatches.Add(1)
	if t.held.Load() {
		return
	}
	if t.parts.Load() > 0 && t.parts.Add(-1) > 0 {
		return
	}
	t.Release()
}

// Dispatches is how many times Dispatched was called on t since Next (0 for a nil t).
func (t *Turn) Dispatches() int32 {
	if t == nil {
		return 0
	}
	return t.dispatches.Load()
}

// Split says that the request is about to make n dispatches in parallel (a multi-key get
// over n servers): its turn is given on when all n are on their way.
func (t *Turn) Split(n int) {
	if t != nil && n > 1 && !t.held.Load() {
		t.parts.Store(int32(n))
	}
}

// Affinity is the backend connection index t's connection uses, when the request is
// pipelined (it has a turn).
func (t *Turn) Affinity() (uint32, bool) {
	if t == nil || t.chain == nil {
		return 0, false
	}
	return t.chain.affinity, true
}

// Path is one of a server's kinds of connection. A server may keep more than one (the
// backend's binary connections and its meta-protocol ones), and memcached keeps order only
// within a connection.
type Path uint8

// maxPaths bounds the servers a Chain remembers paths for.
const maxPaths = 64

// WouldSwitch reports what Switch would, without recording anything: a caller that can
// only go on when no wait is needed asks first.
func (t *Turn) WouldSwitch(server any, path Path) bool {
	c := t.pathsOf(path)
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.differs(server, path)
}

// Switch records that the request is about to be dispatched to server on path, and reports
// whether the connection's previous pipelined request to server may have gone on another
// path. That one may not have been executed yet, so the caller first waits for it (a round
// trip on that path) and only then sends this one. Path 0 is the common one: a server the
// connection never used another path for costs no bookkeeping. A request without a turn
// never switches: nothing of its connection is in flight.
func (t *Turn) Switch(server any, path Path) bool {
	c := t.pathsOf(path)
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.differs(server, path) {
		return false
	}
	if c.paths == nil {
		c.paths = make(map[any]Path)
		c.otherPaths.Store(true)
	} else if _, known := c.paths[server]; !known && len(c.paths) >= maxPaths {
		clear(c.paths)
		c.forgot = true
	}
	c.paths[server] = path
	return true
}

// pathsOf is the chain whose paths a dispatch on path must consult, nil when none: the
// request has no turn, or it takes path 0 on a connection that never took another.
func (t *Turn) pathsOf(path Path) *Chain {
	if t == nil || t.chain == nil || path == 0 && !t.chain.otherPaths.Load() {
		return nil
	}
	return t.chain
}

// differs reports whether the connection's last dispatch to server may have taken another
// path than path; the caller holds mu.
func (c *Chain) differs(server any, path Path) bool {
	last, known := c.paths[server]
	switch {
	case known && last == path:
		return false
	case !known && path == 0 && !c.forgot:
		return false // only ever used path 0, unrecorded
	}
	return true // unknown and not path 0: path 0 may have requests in flight
}
