package route

import (
	"sync"
	"sync/atomic"

	"github.com/moxi-proxy/moxi/internal/keyhash"
)

// Writes counts the writes in flight by stripe of their key, so that reads of a key being
// written do not share fetches (the proxy's dedup), and counts the writes ended, so that a
// warm-up copy can tell whether a write of its key began or ended since it read
// (warmup.go). A stripe shared by other keys only costs those keys their sharing, or a
// copy, for a moment. The zero value is ready.
type Writes struct{ keyhash.Stripes[writeStripe] }

type writeStripe struct {
	mu     sync.Mutex
	n      atomic.Int32 // writes in flight; changed under mu, read without it by InFlight
	epochs uint64       // writes ended; guarded by mu
}

// Begin counts a write of key in flight, before it is sent.
func (w *Writes) Begin(key []byte) {
	s := w.Of(key)
	s.mu.Lock()
	s.n.Add(1)
	s.mu.Unlock()
}

// End counts the write of key Begin counted as ended, once it is answered.
func (w *Writes) End(key []byte) {
	s := w.Of(key)
	s.mu.Lock()
	s.n.Add(-1)
	s.epochs++
	s.mu.Unlock()
}

// InFlight reports whether a write of key's stripe is in flight.
func (w *Writes) InFlight(key []byte) bool { return w.Of(key).n.Load() != 0 }

// busy is an epoch no stripe reaches: epoch's answer while a write is in flight.
const busy = ^uint64(0)

// epoch is the count of key's stripe's ended writes, or busy while one is in flight.
func (w *Writes) epoch(key []byte) uint64 {
	s := w.Of(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n.Load() != 0 {
		return busy
	}
	return s.epochs
}

// ifQuiet runs fn under key's stripe's lock when no write of the stripe began or ended
// since epoch returned e: a write that begins meanwhile waits for fn.
func (w *Writes) ifQuiet(key []byte, e uint64, fn func()) {
	s := w.Of(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n.Load() == 0 && s.epochs == e {
		fn()
	}
}
