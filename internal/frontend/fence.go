package frontend

import (
	"sync"
	"sync/atomic"

	"github.com/moxi-proxy/moxi/internal/keyhash"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// fences are the keys of a connection's writes that the proxy may send again (a write that
// got no answer is retried, see protocol.Op.Repeatable), from their admission until their
// answer is made. A later request of the connection naming one of those keys is started
// only once they are answered. The interleaving it prevents: "set k v1" is dispatched,
// then "set k v2"; v1's server connection breaks; v2 goes on the redialed connection and
// is stored; v1 is retried and stored after it. The client saw v1, then v2 acknowledged,
// and k holds v1. Requests of other keys are not held: only a key written twice (or
// written and read) within one pipeline waits.
//
// The table of fences up is the reader's alone: raise and wait run on it. Whoever makes an
// answer only hands the fences to take down over (lower, a copy under a short lock); the
// reader takes them down before it next looks (collect). Keys are told apart by their
// hash within the process: two keys that share one only wait for each other. The zero value
// is ready.
//
// A client that sends a pipeline and reads its answers before the next has one task's
// fences up at a time, never looked up: those stay a list (solo), put in the table only
// when another task raises fences or a key is looked up while they are up, and are taken
// down all at once.
type fences struct {
	keys map[uint64]int32 // fences up by key hash, but solo's; owned by the reader
	solo []uint64         // the fences of the one task that raised fences while none were up; owned by the reader
	up   int              // fences up, in keys and solo; owned by the reader

	mu      sync.Mutex
	lowered []uint64      // fences to take down, handed over by lower; guarded by mu
	ended   chan struct{} // capacity 1: signalled by lower while waiting; made by the first wait
	waiting bool          // the reader waits on ended; guarded by mu
	pending atomic.Int32  // len(lowered): the reader collects only when there are some
}

// fenceHash is the hash fences know a key by.
func fenceHash(key []byte) uint64 { return keyhash.Sum(key) }

// raise puts up a fence for each write of reqs that may be sent again, and appends the
// hashes to held: the task's, for lower once it is answered. The reader calls it.
func (f *fences) raise(reqs []protocol.Request, held []uint64) []uint64 {
	first := len(held)
	for i := range reqs {
		if r := &reqs[i]; r.Op.ChangesKey() && r.Op.Repeatable() {
			held = append(held, fenceHash(r.Key))
		}
	}
	if len(held) == first {
		return held
	}
	if f.up == 0 {
		f.solo = append(f.solo[:0], held[first:]...)
	} else {
		f.tableSolo()
		for _, h := range held[first:] {
			f.keys[h]++
		}
	}
	f.up += len(held) - first
	return held
}

// tableSolo puts the fences of solo in the table. The reader calls it.
func (f *fences) tableSolo() {
	if len(f.solo) == 0 {
		return
	}
	if f.keys == nil {
		f.keys = make(map[uint64]int32, len(f.solo))
	}
	for _, h := range f.solo {
		f.keys[h]++
	}
	f.solo = f.solo[:0]
}

// lower hands the fences a task raised (held) over to the reader to take down, once the
// task's answer is made. Any goroutine calls it.
func (f *fences) lower(held []uint64) {
	if len(held) == 0 {
		return
	}
	f.mu.Lock()
	f.lowered = append(f.lowered, held...)
	f.pending.Store(int32(len(f.lowered)))
	wake := f.waiting
	f.mu.Unlock()
	if wake {
		select {
		case f.ended <- struct{}{}:
		default:
		}
	}
}

// collect takes down the fences lower handed over. The reader calls it.
func (f *fences) collect() {
	if f.pending.Load() == 0 {
		return
	}
	f.mu.Lock()
	if len(f.lowered) == f.up { // every fence up is down: nothing to count off one by one
		f.solo = f.solo[:0]
		if len(f.keys) > 0 {
			clear(f.keys)
		}
	} else {
		f.tableSolo()
		for _, h := range f.lowered {
			if f.keys[h]--; f.keys[h] <= 0 {
				delete(f.keys, h)
			}
		}
	}
	f.up -= len(f.lowered)
	f.lowered = f.lowered[:0]
	f.pending.Store(0)
	f.mu.Unlock()
}

// wait waits until no fence is up for a key of reqs, calling block once before it first
// blocks. Only the connection's reader waits, and block must let out what the writes it
// waits for need of it (conn.start ends its burst of answers: a multi-get answered part by
// part holds the connection's turn until its parts are written, and a fenced write behind
// it is not dispatched before). The writes are then answered within their timeouts and
// retries, or when the server's context ends.
func (f *fences) wait(reqs []protocol.Request, block func()) {
	f.collect()
	if f.up == 0 {
		return
	}
	f.tableSolo()
	if !f.fenced(reqs) {
		return
	}
	block()
	for {
		f.mu.Lock()
		if f.ended == nil {
			f.ended = make(chan struct{}, 1)
		}
		wait := f.pending.Load() == 0 // else collect at once: a fence may be down already
		f.waiting = wait
		ended := f.ended
		f.mu.Unlock()
		if wait {
			<-ended // a token left by an earlier wait only makes the loop look again
		}
		f.collect()
		if !f.fenced(reqs) {
			f.mu.Lock()
			f.waiting = false
			f.mu.Unlock()
			return
		}
	}
}

// fenced reports whether a key of reqs has a fence up. The reader calls it.
func (f *fences) fenced(reqs []protocol.Request) bool {
	for i := range reqs {
		r := &reqs[i]
		if r.Op.IsRetrieval() {
			for _, k := range r.Keys {
				if f.keys[fenceHash(k)] > 0 {
					return true
				}
			}
		} else if r.Key != nil && f.keys[fenceHash(r.Key)] > 0 {
			return true
		}
	}
	return false
}
