package turn

import (
	"sync"
	"testing"
	"testing/synctest"
)

// TestTurnsRunInOrder: requests started at once, each waiting for its turn and giving it
// on when dispatched, dispatch in the order of their turns.
func TestTurnsRunInOrder(t *testing.T) {
	const n = 200
	chain := NewChain(3)
	turns := make([]Turn, n)
	for i := range turns {
		chain.Next(&turns[i])
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := n - 1; i >= 0; i-- { // started in reverse, to give disorder a chance
		wg.Add(1)
		go func() {
			defer wg.Done()
			turns[i].Wait()
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			order := &turns[i]
			if a, ok := order.Affinity(); !ok || a != 3 {
				t.Errorf("affinity %d %v", a, ok)
			}
			order.Dispatched()
			order.Dispatched() // a second dispatch changes nothing
		}()
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("dispatch %d was request %d", i, got)
		}
	}
}

// TestSplitAndDefer: a split turn is given on at its last dispatch; one whose dispatches
// are deferred only by its done, whatever the deferred turn dispatches; the zero Turn is in
// no order.
func TestSplitAndDefer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		chain := NewChain(0)
		var split, deferred, after Turn
		chain.Next(&split)
		chain.Next(&deferred)
		chain.Next(&after)
		split.Wait()
		order := &split
		order.Split(3)
		released := make(chan struct{})
		go func() { deferred.Wait(); close(released) }()
		for i := range 3 {
			synctest.Wait()
			select {
			case <-released:
				t.Fatalf("turn given on after %d of 3 dispatches", i)
			default:
			}
			order.Dispatched()
		}
		<-released

		each, given := deferred.Defer()
		each.Split(2) // ignored: a deferred turn is never given on by a dispatch
		each.Dispatched()
		each.Dispatched()
		done := make(chan struct{})
		go func() { after.Wait(); close(done) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("a deferred turn's dispatches gave the turn on")
		default:
		}
		given()
		<-done

		var zero Turn
		zero.Wait() // returns at once
		if _, ok := (&zero).Affinity(); ok || !zero.Zero() {
			t.Error("the zero Turn has an affinity")
		}
	})
}

// TestSwitch: a request switches when its connection's previous pipelined request to the
// same server may have gone on another path; path 0 to a server never used otherwise is
// free.
func TestSwitch(t *testing.T) {
	chain := NewChain(0)
	var tn Turn
	chain.Next(&tn)
	order := &tn
	a, b := new(int), new(int)
	steps := []struct {
		server any
		path   Path
		want   bool
	}{
		{a, 0, false}, // binary only so far
		{a, 0, false},
		{a, 1, true}, // binary requests to a may be in flight
		{a, 1, false},
		{b, 0, false}, // b: only binary
		{a, 0, true},  // meta requests to a may be in flight
		{b, 1, true},
		{b, 1, false},
		{a, 0, false},
	}
	for i, s := range steps {
		if got := order.Switch(s.server, s.path); got != s.want {
			t.Errorf("step %d: Switch = %v, want %v", i, got, s.want)
		}
	}
	if (*Turn)(nil).Switch(a, 1) {
		t.Error("a request without a turn switched")
	}
}

// TestSwitchForgets: past maxPaths servers the chain forgets, and then assumes a switch
// for every server it no longer knows.
func TestSwitchForgets(t *testing.T) {
	chain := NewChain(0)
	var tn Turn
	chain.Next(&tn)
	order := &tn
	first := new(int)
	order.Switch(first, 1)
	for range maxPaths {
		order.Switch(new(int), 1)
	}
	if !order.Switch(first, 0) {
		t.Error("a forgotten server did not switch")
	}
	if !order.Switch(new(int), 0) {
		t.Error("an unknown server did not switch after the chain forgot")
	}
}

// TestDefer: dispatches made under Defer give nothing on; done counts as one dispatch, so
// that with Split the turn waits for every share's done.
func TestDefer(t *testing.T) {
	chain := NewChain(7)
	var first, second Turn
	chain.Next(&first)
	chain.Next(&second)
	order := &first
	order.Split(2)
	a, doneA := order.Defer()
	b, doneB := order.Defer()
	a.Dispatched()
	b.Dispatched()
	if aff, ok := a.Affinity(); !ok || aff != 7 {
		t.Fatalf("deferred context lost the affinity: %d %v", aff, ok)
	}
	if first.released.Load() {
		t.Fatal("a deferred dispatch gave the turn on")
	}
	doneA()
	if first.released.Load() {
		t.Fatal("the turn went on with one share of two done")
	}
	doneB()
	if !first.released.Load() {
		t.Fatal("the turn did not go on when both shares were done")
	}
	second.Wait() // returns: first was released
}

// TestDispatches: Dispatches counts the calls of Dispatched on the turn since Next: the
// dispatches made under Defer or After are not the request's, Defer's done is one, and a
// second call on a released turn still counts (servers must make exactly one).
func TestDispatches(t *testing.T) {
	chain := NewChain(0)
	var order Turn
	chain.Next(&order)
	order.Wait()
	each, done := order.Defer()
	each.Dispatched()
	order.After().Dispatched()
	if n := order.Dispatches(); n != 0 {
		t.Fatalf("%d dispatches before done, want 0", n)
	}
	done()
	order.Dispatched()
	if n := order.Dispatches(); n != 2 {
		t.Fatalf("%d dispatches, want 2", n)
	}
	order.Leave()
	chain.Next(&order) // the turn used again: counted afresh
	order.Wait()
	if n := order.Dispatches(); n != 0 {
		t.Fatalf("%d dispatches of a new turn, want 0", n)
	}
	var none *Turn
	none.Dispatched() // no order: nothing happens
	if none.Dispatches() != 0 {
		t.Fatal("a nil turn counted a dispatch")
	}
}
