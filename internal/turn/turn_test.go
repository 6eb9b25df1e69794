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
