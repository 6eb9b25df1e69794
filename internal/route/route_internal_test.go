package route

import (
	"fmt"
	"math"
	"testing"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// The guard of warm-up copies (see warmup.go): a copy runs only when no write of its
// key's stripe began or ended since the reader noted the epoch.
func TestWriteStripesGuard(t *testing.T) {
	k := []byte("k")
	for _, tc := range []struct {
		name  string
		steps func(w *Writes) uint64 // returns the epoch the copy noted
		want  bool
	}{
		{"quiet", func(w *Writes) uint64 { return w.epoch(k) }, true},
		{"write ended since", func(w *Writes) uint64 {
			e := w.epoch(k)
			w.Begin(k)
			w.End(k)
			return e
		}, false},
		{"write in flight at the copy", func(w *Writes) uint64 {
			e := w.epoch(k)
			w.Begin(k)
			return e
		}, false},
		{"write in flight at the read", func(w *Writes) uint64 {
			w.Begin(k)
			e := w.epoch(k)
			w.End(k)
			return e
		}, false},
		{"write ended before the read", func(w *Writes) uint64 {
			w.Begin(k)
			w.End(k)
			return w.epoch(k)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w Writes
			e := tc.steps(&w)
			ran := false
			w.ifQuiet(k, e, func() { ran = true })
			if ran != tc.want {
				t.Errorf("copy ran = %v, want %v", ran, tc.want)
			}
		})
	}
}

func TestShadowedFraction(t *testing.T) {
	const n = 200_000
	for _, f := range []float64{0, 0.01, 0.1, 0.5, 1} {
		hits := 0
		for i := range n {
			if shadowed([]byte(fmt.Sprintf("key:%d", i)), f) {
				hits++
			}
		}
		got := float64(hits) / n
		if math.Abs(got-f) > 0.005 {
			t.Errorf("fraction %v: %v of keys shadowed", f, got)
		}
	}
	// Stable: the same keys every time, and a smaller fraction's keys are among a larger's.
	for i := range 10_000 {
		k := []byte(fmt.Sprintf("key:%d", i))
		if shadowed(k, 0.1) && !shadowed(k, 0.2) {
			t.Fatalf("%s is shadowed at 0.1 but not at 0.2", k)
		}
	}
}

func TestParseOld(t *testing.T) {
	for _, tc := range []struct {
		flags string
		want  oldItem
	}{
		{" f7 t-1", oldItem{found: true, flags: 7, ttl: -1}},
		{" f0 t30", oldItem{found: true, ttl: 30}},
		{" t5 f4294967295", oldItem{found: true, flags: math.MaxUint32, ttl: 5}},
	} {
		resp := protocol.Response{Meta: protocol.MetaAnswer{Code: protocol.MetaVA, Flags: []byte(tc.flags)}}
		if got := parseOld(&resp); got.found != tc.want.found || got.flags != tc.want.flags || got.ttl != tc.want.ttl {
			t.Errorf("%q: %+v, want %+v", tc.flags, got, tc.want)
		}
	}
	if _, ok := copyExptime(0); ok {
		t.Error("an item with under a second left is copied")
	}
	if e, _ := copyExptime(40 * 24 * 3600); e < 1e9 {
		t.Errorf("a TTL over 30 days is copied as %d, want an absolute time", e)
	}
}
