package route

import (
	"fmt"
	"math"
	"testing"
)

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
