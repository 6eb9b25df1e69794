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
		if f.up != 0 || len(f.keys) != 0 || len(f.solo) != 0 || len(f.lowered) != 0 {
			t.Fatalf("fences left up: %d, %v, %v, %v", f.up, f.keys, f.solo, f.lowered)
		}
	})
}

// TestFencesOfTwoTasks: fences raised by one task alone, then by a second while the first's
// are up, are taken down task by task: a key stays fenced while a task that wrote it is
// unanswered, whichever task was answered first.
func TestFencesOfTwoTasks(t *testing.T) {
	sets := func(keys ...string) []protocol.Request {
		var reqs []protocol.Request
		for _, k := range keys {
			reqs = append(reqs, protocol.Request{Op: protocol.OpSet, Key: []byte(k)})
		}
		return reqs
	}
	fenced := func(f *fences, key string) bool {
		f.collect()
		f.tableSolo()
		return f.fenced(sets(key))
	}
	for _, firstDown := range []bool{true, false} {
		var f fences
		a := f.raise(sets("k1", "k2"), nil)
		if len(f.solo) != 2 || len(f.keys) != 0 {
			t.Fatalf("one task's fences: solo %v, table %v; want them in solo", f.solo, f.keys)
		}
		b := f.raise(sets("k2", "k3"), nil)
		if f.up != 4 {
			t.Fatalf("%d fences up, want 4", f.up)
		}
		first, second, onlyFirst, onlySecond := a, b, "k1", "k3"
		if !firstDown {
			first, second, onlyFirst, onlySecond = b, a, "k3", "k1"
		}
		f.lower(first)
		if fenced(&f, onlyFirst) || !fenced(&f, "k2") || !fenced(&f, onlySecond) {
			t.Errorf("after one task's answer: %s fenced %v, k2 %v, %s %v; want false, true, true",
				onlyFirst, fenced(&f, onlyFirst), fenced(&f, "k2"), onlySecond, fenced(&f, onlySecond))
		}
		f.lower(second)
		f.collect()
		if f.up != 0 || len(f.keys) != 0 || len(f.solo) != 0 {
			t.Errorf("after both answers: %d up, table %v, solo %v", f.up, f.keys, f.solo)
		}
		// Nothing up: the next task's fences go to solo again.
		f.lower(f.raise(sets("k4"), nil))
		f.collect()
		if f.up != 0 || len(f.solo) != 0 {
			t.Errorf("a lone task after them: %d up, solo %v", f.up, f.solo)
		}
	}
}
