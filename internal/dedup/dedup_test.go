package dedup

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

func TestConcurrentCallersShareOneFetch(t *testing.T) {
	var g Group[string]
	var fetches atomic.Int32
	release := make(chan struct{})
	const callers = 50
	var wg sync.WaitGroup
	results := make([]string, callers)
	started := make(chan struct{}, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, leader := g.Start("main", []byte("k"))
			started <- struct{}{}
			if leader {
				fetches.Add(1)
				<-release
				f.Val = "v"
				g.Finish(f)
			} else if err := f.Wait(context.Background()); err != nil {
				t.Error(err)
			}
			results[i] = f.Val
		}()
	}
	for range callers {
		<-started
	}
	close(release)
	wg.Wait()
	if n := fetches.Load(); n != 1 {
		t.Errorf("%d fetches for %d concurrent callers, want 1", n, callers)
	}
	for i, r := range results {
		if r != "v" {
			t.Fatalf("caller %d got %q", i, r)
		}
	}
}

func TestForgetStartsAnewAndFinishLeavesNewFlight(t *testing.T) {
	var g Group[int]
	old, leader := g.Start("main", []byte("k"))
	if !leader {
		t.Fatal("first Start is not the leader")
	}
	g.Forget("main", []byte("k")) // a write was acknowledged
	fresh, leader := g.Start("main", []byte("k"))
	if !leader || fresh == old {
		t.Fatal("a read after Forget joined the flight that started before the write")
	}
	old.Val = 1
	g.Finish(old) // must not end the fresh flight
	joined, leader := g.Start("main", []byte("k"))
	if leader || joined != fresh {
		t.Fatal("finishing the old flight removed the fresh one")
	}
	fresh.Val = 2
	g.Finish(fresh)
	if joined.Val != 2 {
		t.Fatalf("follower of the fresh flight got %d", joined.Val)
	}
}

func TestDifferentKeysNeverShare(t *testing.T) {
	var g Group[int]
	a, la := g.Start("main", []byte("a"))
	b, lb := g.Start("main", []byte("b"))
	if !la || !lb || a == b {
		t.Fatal("two keys share a flight")
	}
	g.Finish(a)
	g.Finish(b)
}

// TestSameKeyInTwoPoolsNeverShares: a key name is two items in two pools (two listeners
// with different default pools read "k" at once): neither fetch answers the other, and a
// write of one forgets only its own.
func TestSameKeyInTwoPoolsNeverShares(t *testing.T) {
	var g Group[int]
	a, la := g.Start("main", []byte("k"))
	b, lb := g.Start("spare", []byte("k"))
	if !la || !lb || a == b {
		t.Fatal("the same key in two pools shares a flight")
	}
	g.Forget("spare", []byte("k"))
	if f, leader := g.Start("main", []byte("k")); leader || f != a {
		t.Fatal("a write of spare's k forgot main's fetch of k")
	}
	g.Finish(a)
	g.Finish(b)
}

func TestWaitHonoursContext(t *testing.T) {
	var g Group[int]
	f, _ := g.Start("main", []byte("k"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.Wait(ctx); err == nil {
		t.Fatal("Wait ignored a canceled context")
	}
	g.Finish(f)
}

func BenchmarkStartFinishUncontended(b *testing.B) {
	var g Group[int]
	key := []byte("user:1234:profile")
	b.ReportAllocs()
	for b.Loop() {
		f, _ := g.Start("main", key)
		g.Finish(f)
	}
}

func TestUnfollowedFetchAllocatesNothing(t *testing.T) {
	var g Group[int]
	key := []byte("user:1234:profile")
	f, _ := g.Start("main", key)
	g.Finish(f)
	if n := testing.AllocsPerRun(1000, func() {
		f, _ := g.Start("main", key)
		g.Finish(f)
	}); n != 0 {
		t.Errorf("%v allocations per unfollowed fetch, want 0", n)
	}
}

func TestCollidingFlightsStayApart(t *testing.T) {
	// Flights chained under one hash: unlink from the front, the middle and the end.
	var g Group[int]
	keys := [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d")}
	flights := make([]*Flight[int], len(keys))
	for i, k := range keys {
		flights[i], _ = g.Start("main", k)
	}
	g.mu.Lock()
	for i := range flights { // force one chain: every flight under the first one's hash
		g.unlink(flights[i])
	}
	for i := len(flights) - 1; i >= 0; i-- {
		f := flights[i]
		f.hash, f.next = flights[0].hash, g.flights[flights[0].hash]
		g.flights[f.hash] = f
	}
	g.mu.Unlock()
	for _, i := range []int{1, 0, 3} {
		g.Finish(flights[i])
		g.mu.Lock()
		for j, k := range keys {
			got := g.find(flights[0].hash, "main", k)
			if gone := j == 1 || j == 0 && i != 1 || j == 3 && i == 3; gone != (got == nil) {
				t.Fatalf("after finishing %q: flight of %q present=%v", keys[i], k, got != nil)
			}
		}
		g.mu.Unlock()
	}
	g.mu.Lock()
	left := g.find(flights[0].hash, "main", keys[2])
	g.mu.Unlock()
	if left != flights[2] {
		t.Fatal("the remaining flight is lost")
	}
	g.Finish(flights[2])
	if len(g.flights) != 0 {
		t.Fatalf("%d chains left after every flight finished", len(g.flights))
	}
}

// TestThenCallsBackOnce: a follower's callback runs once the leader finishes — on the
// leader's goroutine when it was registered before, at once when after — and sees the
// leader's result.
func TestThenCallsBackOnce(t *testing.T) {
	var g Group[string]
	f, leader := g.Start("main", []byte("k"))
	if !leader {
		t.Fatal("the first Start does not lead")
	}
	joined, leader := g.Start("main", []byte("k"))
	if leader || joined != f {
		t.Fatal("the second Start does not follow the first")
	}
	var got []string
	g.Then(joined, func() { got = append(got, "before:"+joined.Val) })
	if len(got) != 0 {
		t.Fatal("the callback ran before the leader finished")
	}
	f.Val = "v"
	g.Finish(f)
	g.Then(joined, func() { got = append(got, "after:"+joined.Val) })
	if want := []string{"before:v", "after:v"}; !slices.Equal(got, want) {
		t.Fatalf("callbacks ran %q, want %q", got, want)
	}
}
