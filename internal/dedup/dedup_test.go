package dedup

import (
	"context"
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
			f, leader := g.Start([]byte("k"))
			started <- struct{}{}
			if leader {
				fetches.Add(1)
				<-release
				f.Val = "v"
				g.Finish([]byte("k"), f)
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
	old, leader := g.Start([]byte("k"))
	if !leader {
		t.Fatal("first Start is not the leader")
	}
	g.Forget([]byte("k")) // a write was acknowledged
	fresh, leader := g.Start([]byte("k"))
	if !leader || fresh == old {
		t.Fatal("a read after Forget joined the flight that started before the write")
	}
	old.Val = 1
	g.Finish([]byte("k"), old) // must not end the fresh flight
	joined, leader := g.Start([]byte("k"))
	if leader || joined != fresh {
		t.Fatal("finishing the old flight removed the fresh one")
	}
	fresh.Val = 2
	g.Finish([]byte("k"), fresh)
	if joined.Val != 2 {
		t.Fatalf("follower of the fresh flight got %d", joined.Val)
	}
}

func TestDifferentKeysNeverShare(t *testing.T) {
	var g Group[int]
	a, la := g.Start([]byte("a"))
	b, lb := g.Start([]byte("b"))
	if !la || !lb || a == b {
		t.Fatal("two keys share a flight")
	}
	g.Finish([]byte("a"), a)
	g.Finish([]byte("b"), b)
}

func TestWaitHonoursContext(t *testing.T) {
	var g Group[int]
	f, _ := g.Start([]byte("k"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.Wait(ctx); err == nil {
		t.Fatal("Wait ignored a canceled context")
	}
	g.Finish([]byte("k"), f)
}

func BenchmarkStartFinishUncontended(b *testing.B) {
	var g Group[int]
	key := []byte("user:1234:profile")
	b.ReportAllocs()
	for b.Loop() {
		f, _ := g.Start(key)
		g.Finish(key, f)
	}
}
