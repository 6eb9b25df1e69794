package turn

import (
	"context"
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
			ctx := With(context.Background(), &turns[i])
			if a, ok := Affinity(ctx); !ok || a != 3 {
				t.Errorf("affinity %d %v", a, ok)
			}
			Dispatched(ctx)
			Dispatched(ctx) // a second dispatch changes nothing
		}()
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("dispatch %d was request %d", i, got)
		}
	}
}

// TestSplitAndHold: a split turn is given on at its last dispatch; a held one only by
// Release; the zero Turn is in no order.
func TestSplitAndHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		chain := NewChain(0)
		var split, held, after Turn
		chain.Next(&split)
		chain.Next(&held)
		chain.Next(&after)
		split.Wait()
		ctx := With(context.Background(), &split)
		Split(ctx, 3)
		released := make(chan struct{})
		go func() { held.Wait(); close(released) }()
		for i := range 3 {
			synctest.Wait()
			select {
			case <-released:
				t.Fatalf("turn given on after %d of 3 dispatches", i)
			default:
			}
			Dispatched(ctx)
		}
		<-released

		hctx := With(context.Background(), &held)
		held.Hold()
		Split(hctx, 2) // ignored while held
		Dispatched(hctx)
		Dispatched(hctx)
		done := make(chan struct{})
		go func() { after.Wait(); close(done) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("a held turn was given on by a dispatch")
		default:
		}
		held.Release()
		<-done

		var zero Turn
		zero.Wait() // returns at once
		if _, ok := Affinity(With(context.Background(), &zero)); ok || !zero.Zero() {
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
	ctx := With(context.Background(), &tn)
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
		if got := Switch(ctx, s.server, s.path); got != s.want {
			t.Errorf("step %d: Switch = %v, want %v", i, got, s.want)
		}
	}
	if Switch(context.Background(), a, 1) {
		t.Error("a request without a turn switched")
	}
}

// TestSwitchForgets: past maxPaths servers the chain forgets, and then assumes a switch
// for every server it no longer knows.
func TestSwitchForgets(t *testing.T) {
	chain := NewChain(0)
	var tn Turn
	chain.Next(&tn)
	ctx := With(context.Background(), &tn)
	first := new(int)
	Switch(ctx, first, 1)
	for range maxPaths {
		Switch(ctx, new(int), 1)
	}
	if !Switch(ctx, first, 0) {
		t.Error("a forgotten server did not switch")
	}
	if !Switch(ctx, new(int), 0) {
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
	ctx := With(context.Background(), &first)
	Split(ctx, 2)
	a, doneA := Defer(ctx)
	b, doneB := Defer(ctx)
	Dispatched(a)
	Dispatched(b)
	if aff, ok := Affinity(a); !ok || aff != 7 {
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
