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
// Keys are told apart by their hash within the process: two keys that share one only wait
// for each other. The zero value is ready.
type fences struct {
	mu    sync.Mutex
	keys  map[uint64]int32 // writes in flight by key hash; guarded by mu
	up    atomic.Int32     // fences up: the reader checks without mu while there are none
	ended chan struct{}    // capacity 1: a fence ended while the reader waits; made on first wait
}

// fenceHash is the hash fences know a key by.
func fenceHash(key []byte) uint64 { return keyhash.Sum(key) }

// raise puts up a fence for each write of reqs that may be sent again, and appends the
// hashes to held: the task's, for lower once it is answered.
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
	f.mu.Lock()
	if f.keys == nil {
		f.keys = make(map[uint64]int32, len(held)-first)
	}
	for _, h := range held[first:] {
		f.keys[h]++
	}
	f.up.Add(int32(len(held) - first))
	f.mu.Unlock()
	return held
}

// lower takes down the fences a task raised (held), once its answer is made.
func (f *fences) lower(held []uint64) {
	if len(held) == 0 {
		return
	}
	f.mu.Lock()
	for _, h := range held {
		if f.keys[h]--; f.keys[h] <= 0 {
			delete(f.keys, h)
		}
	}
	f.up.Add(-int32(len(held)))
	ended := f.ended
	f.mu.Unlock()
	if ended != nil {
		select {
		case ended <- struct{}{}:
		default:
		}
	}
}

// wait waits until no fence is up for a key of reqs, calling block once before it first
// blocks. Only the connection's reader waits, and block must let out what the writes it
// waits for need of it (conn.start ends its burst of answers: a multi-get answered part by
// part holds the connection's turn until its parts are written, and a fenced write behind
// it is not dispatched before). The writes are then answered within their timeouts and
// retries, or when the server's context ends.
func (f *fences) wait(reqs []protocol.Request, block func()) {
	if f.up.Load() == 0 {
		return
	}
	for blocked := false; ; blocked = true {
		f.mu.Lock()
		fenced := f.fencedLocked(reqs)
		if fenced && f.ended == nil {
			f.ended = make(chan struct{}, 1)
		}
		ended := f.ended
		f.mu.Unlock()
		if !fenced {
			return
		}
		if !blocked {
			block()
		}
		<-ended
	}
}

// fencedLocked reports whether a key of reqs has a fence up; the caller holds mu.
func (f *fences) fencedLocked(reqs []protocol.Request) bool {
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
