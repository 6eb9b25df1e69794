// Package writeguard is moxi's one guard of the writes of a key (Guard): what keeps a copy
// of a value read elsewhere, a shared fetch or a replicated read from landing after a write.
package writeguard

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/moxi-proxy/moxi/internal/keyhash"
)

// Guard counts the writes of each stripe of keys: one per process, so that writes of the
// topologies before and after a reload count in it alike. Each stripe of keys counts its
// writes in flight and its writes ended in one word, which a read takes without a lock
// (Epoch). Its users:
//
//   - the proxy's shared fetches: a get does not join or lead a fetch of its key while a
//     write of the key is in flight (InFlight), since that fetch may reach the server
//     before the write does;
//   - copies into a pool of a value read elsewhere (a warm-up's add, a replica's read
//     repair): the copy lands only when no write of its key began or ended since the read
//     it copies (IfQuiet, under the stripe's lock, which a write that begins meanwhile waits
//     for, then overwrites or deletes the copy);
//   - a replicated pool's writes, serialised by key (Lock), and its reads, which wait for
//     the write of their key in flight (Settled), so that no read answers what a write
//     replaced once a replica acknowledged it.
//
// Keys that share a stripe only cost each other a shared fetch, a copy or a wait, for a
// moment, so there are many: with 1,024 stripes, 8 clients' concurrent sets of distinct
// keys to a replicated pool met about 0.7 % of the time, each then waiting a whole
// replicated write, and their p99 at 8,000 sets/s was 1.85–1.90× a plain pool's
// (BenchmarkReplicaWrites); with 65,536, 1.32–1.37×. 24 bytes each: 1.5 MiB.
//
// A get asks InFlight of a summary instead, 1,024 groups of 64 stripes in 4 KiB that stay
// in the processor's cache: read in the 1.5 MiB of stripes, InFlight cost a cache miss per
// get, 1 % of moxi's CPU under memcaslap. A write in flight in a key's group only costs
// the group's gets their sharing of fetches for a moment.
type Guard struct {
	stripes [writeStripes]writeStripe
	groups  [writeGroups]atomic.Int32 // writes in flight in each group of stripes
}

const (
	writeStripes = 1 << 16
	writeGroups  = 1 << 10 // a divisor of writeStripes: stripe i is in group i % writeGroups
)

type writeStripe struct {
	mu     sync.Mutex    // held by IfQuiet's copy, which a write that begins meanwhile waits for
	serial sync.Mutex    // held by a replicated write throughout (Lock)
	state  atomic.Uint64 // writes in flight << inFlightShift | copying | writes ended
}

// A stripe's state: its writes in flight in the top 16 bits; copying while IfQuiet's fn
// runs; its writes ended (modulo 2^47, far more than a process writes to one stripe) below.
// A write begins without a lock: it counts itself in flight, and only when that addition
// finds copying set does it wait for mu, so that the copy lands first and the write
// overwrites it.
const (
	inFlightShift = 48
	oneInFlight   = uint64(1) << inFlightShift
	copying       = oneInFlight >> 1
	oneEnded      = ^(oneInFlight - 1) + 1 // one more ended, one fewer in flight: 1 - oneInFlight, modulo 2^64
)

func stripeOf(key []byte) int { return keyhash.Stripe(key, writeStripes) }

// Shares reports whether a write of a counts as one of b (their keys share a stripe): a copy
// of either waits for, or gives way to, a write of the other.
func Shares(a, b []byte) bool { return stripeOf(a) == stripeOf(b) }

// count changes the writes of stripe i, and those in flight in its group by inFlight.
func (w *Guard) count(i int, delta uint64, inFlight int32) {
	w.groups[i%writeGroups].Add(inFlight)
	w.stripes[i].state.Add(delta)
}

// Begin counts a write of key in flight, before it is sent; a copy landing under IfQuiet
// finishes first.
func (w *Guard) Begin(key []byte) { w.begin(stripeOf(key)) }

func (w *Guard) begin(i int) {
	w.groups[i%writeGroups].Add(1)
	s := &w.stripes[i]
	if s.state.Add(oneInFlight)&copying != 0 {
		s.mu.Lock() // the copy that set it ends before its IfQuiet lets mu go
		s.mu.Unlock()
	}
}

// End counts the write of key Begin counted as ended, once it is answered. It takes no
// lock: while the write was in flight no IfQuiet of its stripe could run its fn (the state
// it saw had a write in flight), and one that runs after End sees the state End left.
func (w *Guard) End(key []byte) {
	w.count(stripeOf(key), oneEnded, -1)
}

// A Mark is the stripe of a write's key, for a run of writes begun and ended together
// (BeginMarks, EndMarks): each key is hashed once, not at both ends.
type Mark uint32

// MarkOf is key's mark.
func MarkOf(key []byte) Mark { return Mark(stripeOf(key)) }

// BeginMarks is Begin of the key of each mark. The stripes' words are first loaded
// together: in the stripes' 1.5 MiB, which other work leaves out of the processor's cache,
// each addition that begins a write would otherwise wait for a miss of its own, one after
// the other (an atomic addition waits for what came before it), where plain loads wait
// for theirs side by side.
func (w *Guard) BeginMarks(marks []Mark) {
	w.touch(marks)
	for _, m := range marks {
		w.begin(int(m))
	}
}

// EndMarks is End of the key of each mark BeginMarks counted.
func (w *Guard) EndMarks(marks []Mark) {
	w.touch(marks)
	for _, m := range marks {
		w.count(int(m), oneEnded, -1)
	}
}

// touch loads the words marks name, so that the additions that follow find them cached.
// (The compiler keeps an atomic load whose value is not used.)
func (w *Guard) touch(marks []Mark) {
	for _, m := range marks {
		_ = w.stripes[m].state.Load()
		_ = w.groups[int(m)%writeGroups].Load()
	}
}

// InFlight reports whether a write of a key of key's group of stripes is in flight.
func (w *Guard) InFlight(key []byte) bool { return w.groups[stripeOf(key)%writeGroups].Load() != 0 }

// Epoch is key's stripe's state, to be noted before a read whose value may be copied
// (IfQuiet). It takes no lock.
func (w *Guard) Epoch(key []byte) uint64 { return w.stripes[stripeOf(key)].state.Load() &^ copying }

// IfQuiet runs fn under key's stripe's lock when no write of the stripe was in flight at
// Epoch's e, and none began or ended since: a write that begins meanwhile waits for fn.
func (w *Guard) IfQuiet(key []byte, e uint64, fn func()) {
	if e >= oneInFlight {
		return
	}
	s := &w.stripes[stripeOf(key)]
	s.mu.Lock()
	defer s.mu.Unlock()
	// The state is e only while no write began or ended since; a write that begins from
	// here on finds copying set, and waits for mu.
	if !s.state.CompareAndSwap(e, e|copying) {
		return
	}
	defer s.state.Add(^(copying - 1)) // less copying, before mu goes
	fn()
}

// HoldQuiet is, for a copy into a replicated pool (a read's repair, a rebuild), IfQuiet
// without a lock held across the copy's round trip: it takes, without waiting, the
// replicated-write lock (Lock's) of each stripe of keys in which a key's writes neither
// began nor ended since its epoch, and reports which keys may be copied (quiet[i]);
// release gives the locks back. Replicated writes of those stripes wait for release; the
// copy may wait for servers meanwhile, which IfQuiet's fn must not: each write of its
// stripe that begins waits for fn. A stripe whose lock a write holds is not quiet.
func (w *Guard) HoldQuiet(keys [][]byte, epochs []uint64) (quiet []bool, release func()) {
	idx := make([]int, len(keys))
	for i, k := range keys {
		idx[i] = stripeOf(k)
	}
	order := slices.Clone(idx)
	slices.Sort(order)
	order = slices.Compact(order)
	quiet = make([]bool, len(keys))
	var held []int
	for _, i := range order {
		s := &w.stripes[i]
		if !s.serial.TryLock() {
			continue // a replicated write of the stripe runs
		}
		s.mu.Lock()
		state := s.state.Load()
		s.mu.Unlock()
		any := false
		for j, si := range idx {
			if si == i && epochs[j] < oneInFlight && state == epochs[j] {
				quiet[j], any = true, true
			}
		}
		if any {
			held = append(held, i)
		} else {
			s.serial.Unlock()
		}
	}
	return quiet, func() {
		for _, i := range held {
			w.stripes[i].serial.Unlock()
		}
	}
}

// Lock begins a replicated write of key, after the one in flight ends; the function it
// returns ends it.
func (w *Guard) Lock(key []byte) func() {
	i := stripeOf(key)
	w.stripes[i].serial.Lock()
	w.begin(i)
	return func() { w.unlock(i) }
}

// TryLock is Lock when it needs no wait; false when it would.
func (w *Guard) TryLock(key []byte) (unlock func(), ok bool) {
	i := stripeOf(key)
	s := &w.stripes[i]
	if !s.serial.TryLock() {
		return nil, false
	}
	if !s.mu.TryLock() { // a copy is landing
		s.serial.Unlock()
		return nil, false
	}
	w.count(i, oneInFlight, 1) // under mu, no copy sets copying meanwhile
	s.mu.Unlock()
	return func() { w.unlock(i) }, true
}

// unlock ends a replicated write: as End, with no lock (see End).
func (w *Guard) unlock(i int) {
	w.count(i, oneEnded, -1)
	w.stripes[i].serial.Unlock()
}

// Settled is key's stripe's state once no replicated write of the stripe runs: a read of
// a replicated pool waits for the write of its key in flight.
func (w *Guard) Settled(key []byte) uint64 {
	s := &w.stripes[stripeOf(key)]
	if e := s.state.Load() &^ copying; e < oneInFlight {
		return e
	}
	s.serial.Lock()
	defer s.serial.Unlock()
	return s.state.Load() &^ copying
}
