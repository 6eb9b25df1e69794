package route

import (
	"fmt"
	"math"
	"testing"
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
