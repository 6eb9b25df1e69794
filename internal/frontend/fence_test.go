package frontend

import (
	"testing"
	"testing/synctest"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestFences: a request of a key that a write in flight may be retried for waits until
// that write is answered; requests of other keys, and writes that are never sent again
// (incr), hold nothing.
func TestFences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var f fences
		set := []protocol.Request{{Op: protocol.OpSet, Key: []byte("k")}, {Op: protocol.OpIncr, Key: []byte("n")}}
		held := f.raise(set, nil)
		if len(held) != 1 {
			t.Fatalf("%d fences for a set and an incr, want 1 (the set's)", len(held))
		}
		f.wait([]protocol.Request{{Op: protocol.OpGet, Keys: [][]byte{[]byte("other"), []byte("n")}}}, func() { t.Error("a get of other keys blocked") })

		var passed bool
		go func() {
			f.wait([]protocol.Request{{Op: protocol.OpGet, Keys: [][]byte{[]byte("a"), []byte("k")}}}, func() {})
			passed = true
		}()
		synctest.Wait()
		if passed {
			t.Fatal("a get of k started while a set of k that may be retried is in flight")
		}
		f.lower(held)
		synctest.Wait()
		if !passed {
			t.Fatal("the get of k still waits after the set was answered")
		}
		f.collect()
		if len(f.keys) != 0 || len(f.lowered) != 0 {
			t.Fatalf("fences left up: %v, %v", f.keys, f.lowered)
		}
	})
}
