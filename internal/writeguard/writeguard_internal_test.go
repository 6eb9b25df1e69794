package writeguard

import (
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// The guard of copies (a warm-up's add, a replica's read repair): a copy runs only when no
// write of its key's stripe was in flight when the reader noted the epoch, and none began
// or ended since.
func TestWriteStripesGuard(t *testing.T) {
	k := []byte("k")
	for _, tc := range []struct {
		name  string
		steps func(w *Guard) uint64 // returns the epoch the copy noted
		want  bool
	}{
		{"quiet", func(w *Guard) uint64 { return w.Epoch(k) }, true},
		{"write ended since", func(w *Guard) uint64 {
			e := w.Epoch(k)
			w.Begin(k)
			w.End(k)
			return e
		}, false},
		{"write in flight at the copy", func(w *Guard) uint64 {
			e := w.Epoch(k)
			w.Begin(k)
			return e
		}, false},
		{"write in flight at the read", func(w *Guard) uint64 {
			w.Begin(k)
			e := w.Epoch(k)
			w.End(k)
			return e
		}, false},
		{"write ended before the read", func(w *Guard) uint64 {
			w.Begin(k)
			w.End(k)
			return w.Epoch(k)
		}, true},
		{"a run's write in flight at the copy", func(w *Guard) uint64 {
			e := w.Epoch(k)
			w.BeginMarks([]Mark{MarkOf([]byte("run")), MarkOf(k)})
			return e
		}, false},
		{"a run's write ended since", func(w *Guard) uint64 {
			e := w.Epoch(k)
			marks := []Mark{MarkOf(k), MarkOf([]byte("run"))}
			w.BeginMarks(marks)
			w.EndMarks(marks)
			return e
		}, false},
		{"a run's writes ended before the read", func(w *Guard) uint64 {
			marks := []Mark{MarkOf(k), MarkOf(k)}
			w.BeginMarks(marks)
			w.EndMarks(marks)
			if w.InFlight(k) {
				panic("a write still counted in flight after its run ended")
			}
			return w.Epoch(k)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w Guard
			e := tc.steps(&w)
			ran := false
			w.IfQuiet(k, e, func() { ran = true })
			if ran != tc.want {
				t.Errorf("copy ran = %v, want %v", ran, tc.want)
			}
			// The held form: k twice (one stripe, taken once) beside a quiet key.
			other := []byte("other")
			keys := [][]byte{k, other, k}
			quiet, release := w.HoldQuiet(keys, []uint64{e, w.Epoch(other), e})
			if want := []bool{tc.want, true, tc.want}; !slices.Equal(quiet, want) {
				t.Errorf("held copy quiet = %v, want %v", quiet, want)
			}
			// Held: a replicated write of a quiet key waits for release; a read does not.
			if _, ok := w.TryLock(other); ok {
				t.Error("a replicated write began while a copy held its stripe")
			}
			release()
			unlock, ok := w.TryLock(other)
			if !ok {
				t.Fatal("the stripe is still held after release")
			}
			unlock()
		})
	}
}

// A replicated write waits for the one in flight of its key, and a read for both.
func TestWritesSerialised(t *testing.T) {
	var w Guard
	k := []byte("k")
	unlock := w.Lock(k)
	if _, ok := w.TryLock(k); ok {
		t.Fatal("a second replicated write of the key began while the first runs")
	}
	if !w.InFlight(k) {
		t.Fatal("a replicated write is not in flight")
	}
	settled := make(chan uint64)
	go func() { settled <- w.Settled(k) }()
	unlock()
	if e := <-settled; e >= oneInFlight || e != w.Epoch(k) {
		t.Errorf("a read settled at %x, with a write in flight or since (now %x)", e, w.Epoch(k))
	}
	unlock, ok := w.TryLock(k)
	if !ok {
		t.Fatal("no replicated write may begin once the last ended")
	}
	unlock()
}

// A write that begins while a copy lands waits for the copy, and so overwrites it; a copy
// of a read older than a write begun since never lands. One writer of a key (its writes
// are ordered, as a client's are) and copiers of what they read, concurrently: the server
// holds, after each write is answered, what that write sent, and a copy lands nothing older
// than a write answered before it.
func TestCopiesNeverLandStale(t *testing.T) {
	var (
		w               Guard
		k               = []byte("k")
		server, version atomic.Uint64 // what the server holds; the last write sent
		answered        atomic.Uint64 // the last write answered
		done            = make(chan struct{})
		wg              sync.WaitGroup
		landed, stale   atomic.Int64
	)
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				e := w.Epoch(k)
				read := version.Load() // a read elsewhere of the value
				w.IfQuiet(k, e, func() {
					if read < answered.Load() {
						stale.Add(1)
					}
					server.Store(read)
					landed.Add(1)
				})
			}
		})
	}
	for v := uint64(1); v <= 20000; v++ {
		w.Begin(k)
		version.Store(v)
		server.Store(v)
		w.End(k)
		answered.Store(v)
		if got := server.Load(); got != v {
			t.Fatalf("after write %d was answered the server holds %d", v, got)
		}
		if v%64 == 0 {
			runtime.Gosched() // let copies land between writes too
		}
	}
	close(done)
	wg.Wait()
	if n := stale.Load(); n > 0 {
		t.Errorf("%d copies landed older than a write answered before them", n)
	}
	if landed.Load() == 0 {
		t.Error("no copy landed: the test shows nothing")
	}
}

// A write's cost to the guard: Begin and End of one of 100 keys, as a pipelined run's.
func BenchmarkBeginEnd(b *testing.B) {
	var w Guard
	keys := make([][]byte, 100)
	for i := range keys {
		keys[i] = []byte("key:" + strconv.Itoa(i))
	}
	for i := 0; b.Loop(); i++ {
		k := keys[i%len(keys)]
		w.Begin(k)
		w.End(k)
	}
}
