package hotcache

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/moxi-proxy/moxi/internal/writeguard"
)

// TestHolds: Holds answers as Get would, without Get's effects: the LRU order stays (the
// entry Holds looked at is still the one evicted first), and an entry past serving is
// reported, not dropped.
func TestHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		writes := new(writeguard.Guard)
		c := New([]string{"hot:"}, 2, 1<<20, time.Minute, writes)
		add := func(k string) { c.Add("main", []byte(k), Entry{Value: []byte("v")}, c.Epoch([]byte(k))) }
		add("hot:a")
		add("hot:b")
		if !c.Holds("main", []byte("hot:a")) || c.Holds("other", []byte("hot:a")) || c.Holds("main", []byte("hot:c")) {
			t.Fatal("Holds does not answer as the entries are: main's hot:a and hot:b")
		}
		add("hot:c") // the least recently used goes: hot:a, which Holds did not touch
		if c.Holds("main", []byte("hot:a")) || !c.Holds("main", []byte("hot:b")) {
			t.Fatal("Holds changed the LRU order: hot:b was evicted before hot:a")
		}
		writes.Begin([]byte("hot:b"))
		writes.End([]byte("hot:b"))
		if c.Holds("main", []byte("hot:b")) {
			t.Error("an entry fetched before a write of its key is held")
		}
		if c.Len() != 2 {
			t.Errorf("Holds dropped an entry: %d left, want 2", c.Len())
		}
		time.Sleep(time.Minute)
		if c.Holds("main", []byte("hot:c")) {
			t.Error("an entry as old as the TTL is held")
		}
		var none *Cache
		if none.Holds("main", []byte("hot:c")) {
			t.Error("a nil cache holds a key")
		}
	})
}
