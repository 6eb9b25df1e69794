package procs

import (
	"context"
	"math"
	"runtime"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name       string
		procs, max int
		busy       float64
		wait       time.Duration
		want       int
	}{
		{"one thread keeping up", 1, 4, 0.9, 100 * time.Microsecond, 1},
		{"one thread behind", 1, 4, 0.9, time.Millisecond, 2},
		{"waits, but the thread is not busy (a pause)", 1, 4, 0.5, time.Millisecond, 1},
		{"at the most", 4, 4, 3.9, 10 * time.Millisecond, 4},
		{"two threads, half used: one does", 2, 4, 0.4, 0, 1},
		{"two threads, well used", 2, 4, 1.1, 0, 2},
		{"three threads, little used", 3, 4, 0.9, 0, 2},
		{"one thread idle stays one", 1, 4, 0, 0, 1},
	} {
		if got := decide(tc.procs, tc.max, tc.busy, tc.wait); got != tc.want {
			t.Errorf("%s: decide(%d, %d, %.2f, %v) = %d, want %d", tc.name, tc.procs, tc.max, tc.busy, tc.wait, got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	buckets := []float64{0, 1e-6, 1e-5, 1e-4, 1e-3}
	before := []uint64{5, 5, 5, 5}
	// Since before: 80 waits under 1 µs, 15 under 10 µs, 4 under 100 µs, 1 under 1 ms.
	counts := []uint64{85, 20, 9, 6}
	if got := percentile(counts, before, buckets, 0.9); got != 10*time.Microsecond {
		t.Errorf("p90 = %v, want 10µs", got)
	}
	if got := percentile(counts, before, buckets, 0.99); got != 1*time.Millisecond {
		t.Errorf("p99 = %v, want 1ms", got)
	}
	if got := percentile(before, before, buckets, 0.9); got != 0 {
		t.Errorf("no waits since: %v, want 0", got)
	}
	// The runtime's last bucket ends at +Inf: a wait there counts as its lower bound.
	inf := []float64{0, 1e-6, 1e-3, math.Inf(1)}
	if got := percentile([]uint64{0, 0, 10}, nil, inf, 0.9); got != time.Millisecond {
		t.Errorf("p90 in the last bucket = %v, want 1ms", got)
	}
}

// TestRunLeavesAnOperatorsChoice: with GOMAXPROCS set, Run changes nothing; without, it
// starts from one thread and gives the original count back when it ends.
func TestRunLeavesAnOperatorsChoice(t *testing.T) {
	original := runtime.GOMAXPROCS(0)
	if original < 2 {
		runtime.GOMAXPROCS(2)
		defer runtime.GOMAXPROCS(original)
	}
	want := runtime.GOMAXPROCS(0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Run(ctx, func(string) string { return "2" }, func(int) { t.Error("changed with GOMAXPROCS set") })
	if got := runtime.GOMAXPROCS(0); got != want {
		t.Errorf("GOMAXPROCS %d after Run with the variable set, want %d", got, want)
	}

	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, func(string) string { return "" }, nil)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for runtime.GOMAXPROCS(0) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("Run never went to one thread")
		}
		runtime.Gosched()
	}
	cancel()
	<-done
	if got := runtime.GOMAXPROCS(0); got != want {
		t.Errorf("GOMAXPROCS %d after Run ended, want %d", got, want)
	}
}
