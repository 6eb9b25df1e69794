// Package dedup coalesces identical concurrent reads: a caller asking for a key that is
// already being fetched waits for that fetch instead of starting its own.
//
// It is a keyed form of golang.org/x/sync/singleflight split into Start and Finish, so
// that one caller can lead the fetch of many keys at once (a multi-get sends one batch for
// all the keys it leads) and follow others' fetches for the rest.
package dedup

import (
	"context"
	"sync"
)

// Group is a set of fetches in progress, by key. The zero value is ready to use; a Group
// is safe for concurrent use.
type Group[V any] struct {
	mu      sync.Mutex
	flights map[string]*Flight[V] // guarded by mu
}

// Flight is one fetch in progress. Val and Err are written by the leader before Finish and
// read by followers after Wait; they are shared, so neither side may modify them.
type Flight[V any] struct {
	done chan struct{}
	Val  V
	Err  error
}

// Start joins the fetch of key in progress, or starts one and makes the caller its leader.
// A leader must call Finish exactly once, whatever happens.
func (g *Group[V]) Start(key []byte) (f *Flight[V], leader bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f, ok := g.flights[string(key)]; ok {
		return f, false
	}
	if g.flights == nil {
		g.flights = make(map[string]*Flight[V])
	}
	f = &Flight[V]{done: make(chan struct{})}
	g.flights[string(key)] = f
	return f, true
}

// Finish publishes the leader's result to the followers and ends the flight.
func (g *Group[V]) Finish(key []byte, f *Flight[V]) {
	g.mu.Lock()
	if g.flights[string(key)] == f {
		delete(g.flights, string(key))
	}
	g.mu.Unlock()
	close(f.done)
}

// Forget makes the fetch of key in progress unjoinable: callers that Start after Forget
// returns fetch anew. A write calls it once the server has acknowledged, before answering
// its client, so that no read that starts after the write can get a value read before it.
func (g *Group[V]) Forget(key []byte) {
	g.mu.Lock()
	if len(g.flights) > 0 { // writes without reads in flight skip hashing the key
		delete(g.flights, string(key))
	}
	g.mu.Unlock()
}

// Wait waits for the leader's result, or for ctx.
func (f *Flight[V]) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ForgetAll makes every fetch in progress unjoinable (after flush_all).
func (g *Group[V]) ForgetAll() {
	g.mu.Lock()
	clear(g.flights)
	g.mu.Unlock()
}
