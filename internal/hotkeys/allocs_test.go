//go:build !race

// Allocation counts: built without -race, under which they say nothing about a normal
// build. make test runs them in a step of their own.

package hotkeys

import (
	"strconv"
	"testing"
)

// TestObserveAllocs: an unsampled request allocates nothing, and neither does a sampled
// one of a key that already has a counter (only a key taking a counter is copied).
func TestObserveAllocs(t *testing.T) {
	key := []byte("user:1234567:profile")
	unsampled := New(Config{Sample: 1e-12})
	if allocs := testing.AllocsPerRun(1000, func() { unsampled.Observe(key, 100) }); allocs != 0 {
		t.Errorf("an unsampled Observe allocates %v times", allocs)
	}
	sampled := New(Config{Sample: 1})
	sampled.Observe(key, 100)
	if allocs := testing.AllocsPerRun(1000, func() { sampled.Observe(key, 100) }); allocs != 0 {
		t.Errorf("a sampled Observe of a counted key allocates %v times", allocs)
	}
}

// TestHotAllocs: Hot allocates nothing, for a hot key or a cold one.
func TestHotAllocs(t *testing.T) {
	s := New(Config{Sample: 1})
	for i := range 1000 {
		s.Observe([]byte("hot"), 10)
		s.Observe([]byte("cold:"+strconv.Itoa(i)), 10)
	}
	hot, cold := []byte("hot"), []byte("cold:7")
	if !s.Hot(hot) || s.Hot(cold) {
		t.Fatalf("Hot(hot) %v, Hot(cold) %v", s.Hot(hot), s.Hot(cold))
	}
	if allocs := testing.AllocsPerRun(1000, func() { s.Hot(hot); s.Hot(cold) }); allocs != 0 {
		t.Errorf("Hot allocates %v times", allocs)
	}
}
