// Package dedup coalesces identical concurrent reads: a caller asking for a key that is
// already being fetched waits for that fetch instead of starting its own.
//
// It is a keyed form of golang.org/x/sync/singleflight split into Start and Finish, so
// that one caller can lead the fetch of many keys at once (a multi-get sends one batch for
// all the keys it leads) and follow others' fetches for the rest.
//
// A fetch nobody joins, the common case, allocates nothing: flights are reused, found by a
// hash of the key rather than a string made from it, and a flight's channel is made only
// when a follower needs one.
package dedup

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"

	"github.com/moxi-proxy/moxi/internal/keyhash"
)

// Group is a set of fetches in progress, by space (a pool's name) and key: the same key
// name in two pools is two items, and a fetch of one never answers the other. The zero value is ready to use; a Group
// is safe for concurrent use.
type Group[V any] struct {
	mu      sync.Mutex
	flights map[uint64]*Flight[V] // by keyhash.Sum of the key, chained; guarded by mu
	// chains is len(flights), stored under mu after each change: Forget reads it without
	// the lock, so that writes while no read is in flight (most of them) cost no lock.
	chains atomic.Int32
	free   sync.Pool // finished flights nobody followed
}

// Flight is one fetch in progress. Val and Err are written by the leader before Finish and
// read by followers after Wait; they are shared, so neither side may modify them.
type Flight[V any] struct {
	Val V
	Err error

	// Guarded by the Group's mu.
	space string        // the key's pool
	key   []byte        // a copy of the key
	hash  uint64        // of space and key
	next  *Flight[V]    // the next flight whose key has the same hash
	done  chan struct{} // made by the first follower; closed by Finish
	then  []func()      // followers' callbacks (Then), called by Finish
	ended bool          // Finish ran: a Then calls its callback at once
}

// Start joins the fetch of key of space in progress, or starts one and makes the caller
// its leader. A leader must call Finish exactly once, whatever happens, and not use the
// flight after.
func (g *Group[V]) Start(space string, key []byte) (f *Flight[V], leader bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flights == nil {
		g.flights = make(map[uint64]*Flight[V])
	}
	h := keyhash.In(space, key)
	if f := g.find(h, space, key); f != nil {
		if f.done == nil {
			f.done = make(chan struct{})
		}
		return f, false
	}
	f, _ = g.free.Get().(*Flight[V])
	if f == nil {
		f = new(Flight[V])
	}
	f.space, f.key, f.hash = space, append(f.key[:0], key...), h
	f.next = g.flights[h]
	g.flights[h] = f
	g.chains.Store(int32(len(g.flights)))
	return f, true
}

// find is the flight of key of space, or nil; the caller holds mu.
func (g *Group[V]) find(h uint64, space string, key []byte) *Flight[V] {
	for f := g.flights[h]; f != nil; f = f.next {
		if f.space == space && bytes.Equal(f.key, key) {
			return f
		}
	}
	return nil
}

// unlink takes f out of the group, if it is still in; the caller holds mu.
func (g *Group[V]) unlink(f *Flight[V]) {
	first := g.flights[f.hash]
	switch {
	case first == f && f.next == nil:
		delete(g.flights, f.hash)
	case first == f:
		g.flights[f.hash] = f.next
	default:
		for p := first; p != nil; p = p.next {
			if p.next == f {
				p.next = f.next
				break
			}
		}
	}
	f.next = nil
	g.chains.Store(int32(len(g.flights)))
}

// Finish publishes the leader's result to the followers and ends the flight.
func (g *Group[V]) Finish(f *Flight[V]) {
	g.mu.Lock()
	g.unlink(f)
	done, then := f.done, f.then
	f.ended, f.then = done != nil, nil
	g.mu.Unlock()
	if done != nil {
		close(done)
		for _, fn := range then {
			fn()
		}
		return
	}
	// Nobody followed, and nobody can now: the flight is free for the next fetch.
	var zero V
	f.Val, f.Err = zero, nil
	g.free.Put(f)
}

// Forget makes the fetch of key of space in progress unjoinable: callers that Start after Forget
// returns fetch anew. A write calls it once the server has acknowledged, before answering
// its client, so that no read that starts after the write can get a value read before it.
//
// With no fetch in progress it returns without the lock: a Start that this load does not
// see stores after it, so its fetch is sent after the write was acknowledged, and reads
// the new value.
func (g *Group[V]) Forget(space string, key []byte) {
	if g.chains.Load() == 0 {
		return
	}
	g.mu.Lock()
	if f := g.find(keyhash.In(space, key), space, key); f != nil {
		g.unlink(f)
	}
	g.mu.Unlock()
}

// Wait waits for the leader's result, or for ctx. Only a follower waits: Start made the
// channel it waits on.
func (f *Flight[V]) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Then calls fn once the leader's result is in: at once, on the caller's goroutine, when it
// is already; else on the leader's, in Finish. Only a follower calls it (f from Start with
// leader false): a follower that must not wait.
func (g *Group[V]) Then(f *Flight[V], fn func()) {
	g.mu.Lock()
	if !f.ended {
		f.then = append(f.then, fn)
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	fn()
}

// Idle reports whether no fetch is in progress, without the lock: what Forget would find
// of any key, for a caller about to Forget many (see Forget).
func (g *Group[V]) Idle() bool { return g.chains.Load() == 0 }

// ForgetAll makes every fetch in progress unjoinable (after flush_all).
func (g *Group[V]) ForgetAll() {
	g.mu.Lock()
	clear(g.flights) // a flight's Finish then finds it in no chain
	g.chains.Store(0)
	g.mu.Unlock()
}
