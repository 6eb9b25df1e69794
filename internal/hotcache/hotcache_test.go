package hotcache

import (
	"testing"
	"time"
)

func TestHotPrefixes(t *testing.T) {
	c := New([]string{"cfg:", "hot:"}, 10, time.Second)
	for key, want := range map[string]bool{"cfg:a": true, "hot:": true, "cold:a": false, "cf": false} {
		if got := c.Hot([]byte(key)); got != want {
			t.Errorf("Hot(%q) = %v", key, got)
		}
	}
	var none *Cache
	if none.Hot([]byte("cfg:a")) {
		t.Error("a nil cache claims a key")
	}
}

func TestAddGetDrop(t *testing.T) {
	c := New([]string{"hot:"}, 10, time.Minute)
	val := []byte("v1")
	c.Add([]byte("hot:a"), Entry{Value: val, Flags: 3, Cas: 9}, c.Epoch([]byte("hot:a")))
	val[0] = 'X' // the cache copied it
	e, ok := c.Get([]byte("hot:a"))
	if !ok || string(e.Value) != "v1" || e.Flags != 3 || e.Cas != 9 {
		t.Fatalf("Get = %+v %v", e, ok)
	}
	c.Drop([]byte("hot:a"))
	if _, ok := c.Get([]byte("hot:a")); ok {
		t.Fatal("entry served after Drop")
	}
}

// TestLateAddAfterDropRefused is the interleaving the epoch exists for: a read takes the
// epoch and fetches; a write drops the key; the read's late Add must store nothing.
func TestLateAddAfterDropRefused(t *testing.T) {
	c := New([]string{"hot:"}, 10, time.Minute)
	epoch := c.Epoch([]byte("hot:a"))
	c.Drop([]byte("hot:a"))
	c.Add([]byte("hot:a"), Entry{Value: []byte("stale")}, epoch)
	if e, ok := c.Get([]byte("hot:a")); ok {
		t.Fatalf("a value fetched before the write is served after it: %q", e.Value)
	}
}

func TestTTLAndBound(t *testing.T) {
	c := New([]string{"hot:"}, 2, 50*time.Millisecond)
	for _, k := range []string{"hot:1", "hot:2", "hot:3"} {
		c.Add([]byte(k), Entry{Value: []byte(k)}, c.Epoch([]byte(k)))
	}
	if n := c.Len(); n != 2 {
		t.Fatalf("%d entries with max_items 2", n)
	}
	if _, ok := c.Get([]byte("hot:1")); ok {
		t.Error("the least recently used entry was not evicted")
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		if _, ok := c.Get([]byte("hot:3")); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("entry still served 2s after a 50ms TTL")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func BenchmarkGetHit(b *testing.B) {
	c := New([]string{"hot:"}, 100, time.Minute)
	key := []byte("hot:config")
	c.Add(key, Entry{Value: make([]byte, 100)}, c.Epoch(key))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := c.Get(key); !ok {
			b.Fatal("miss")
		}
	}
}
