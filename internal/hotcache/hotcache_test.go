package hotcache

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/moxi-proxy/moxi/internal/writeguard"
	"go.uber.org/goleak"
)

func TestHotPrefixes(t *testing.T) {
	c := New([]string{"cfg:", "hot:"}, 10, 1<<20, time.Second, new(writeguard.Guard))
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
	c := New([]string{"hot:"}, 10, 1<<20, time.Minute, new(writeguard.Guard))
	val := []byte("v1")
	c.Add("main", []byte("hot:a"), Entry{Value: val, Flags: 3, Cas: 9}, c.Epoch([]byte("hot:a")))
	val[0] = 'X' // the cache copied it
	e, ok := c.Get("main", []byte("hot:a"))
	if !ok || string(e.Value) != "v1" || e.Flags != 3 || e.Cas != 9 {
		t.Fatalf("Get = %+v %v", e, ok)
	}
	c.Drop("main", []byte("hot:a"))
	if _, ok := c.Get("main", []byte("hot:a")); ok {
		t.Fatal("entry served after Drop")
	}
}

// TestLateAddAfterDropRefused is the interleaving the write guard exists for: a read takes
// the key's ticket and fetches; a write begins, drops the key and ends; the read's late
// Add must store nothing. (So must one whose fetch a write overlaps, or a flush_all.)
func TestLateAddAfterDropRefused(t *testing.T) {
	writes := new(writeguard.Guard)
	c := New([]string{"hot:"}, 10, 1<<20, time.Minute, writes)
	epoch := c.Epoch([]byte("hot:a"))
	writes.Begin([]byte("hot:a")) // the proxy's write: begun, dropped, answered, ended
	c.Drop("main", []byte("hot:a"))
	writes.End([]byte("hot:a"))
	c.Add("main", []byte("hot:a"), Entry{Value: []byte("stale")}, epoch)
	if e, ok := c.Get("main", []byte("hot:a")); ok {
		t.Fatalf("a value fetched before the write is served after it: %q", e.Value)
	}
}

func TestTTLAndBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New([]string{"hot:"}, 2, 1<<20, 50*time.Millisecond, new(writeguard.Guard))
		for _, k := range []string{"hot:1", "hot:2", "hot:3"} {
			c.Add("main", []byte(k), Entry{Value: []byte(k)}, c.Epoch([]byte(k)))
		}
		if n := c.Len(); n != 2 {
			t.Fatalf("%d entries with max_items 2", n)
		}
		if _, ok := c.Get("main", []byte("hot:1")); ok {
			t.Error("the least recently used entry was not evicted")
		}
		time.Sleep(49 * time.Millisecond)
		if _, ok := c.Get("main", []byte("hot:3")); !ok {
			t.Fatal("entry dropped before its TTL")
		}
		time.Sleep(time.Millisecond)
		if _, ok := c.Get("main", []byte("hot:3")); ok {
			t.Fatal("entry served at its TTL")
		}
		if c.Len() != 1 || c.Bytes() != 10 {
			t.Fatalf("the expired entry read is still held: %d entries, %d bytes", c.Len(), c.Bytes())
		}
	})
}

// TestPoolsApart: the same key name in two pools is two entries (two listeners with other
// default pools read and write "hot:a"): neither is served for the other, and dropping one
// keeps the other.
func TestPoolsApart(t *testing.T) {
	c := New([]string{"hot:"}, 10, 1<<20, time.Minute, new(writeguard.Guard))
	k := []byte("hot:a")
	c.Add("main", k, Entry{Value: []byte("main's")}, c.Epoch(k))
	if _, ok := c.Get("spare", k); ok {
		t.Fatal("spare's hot:a answered with main's entry")
	}
	c.Add("spare", k, Entry{Value: []byte("spare's")}, c.Epoch(k))
	c.Drop("main", k)
	if e, ok := c.Get("spare", k); !ok || string(e.Value) != "spare's" {
		t.Fatalf("spare's entry after main's drop: %q %v", e.Value, ok)
	}
	if _, ok := c.Get("main", k); ok {
		t.Fatal("main's entry served after its drop")
	}
}

// TestStartsNoGoroutine: a cache is built per topology, so anything it started would
// outlive a reload.
func TestStartsNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := New([]string{"hot:"}, 10, 1<<20, time.Millisecond, new(writeguard.Guard))
	c.Add("main", []byte("hot:a"), Entry{Value: []byte("v")}, c.Epoch([]byte("hot:a")))
}

// TestByteBound: past max_bytes the least recently used entries go, whatever max_items
// allows; an entry larger than max_bytes is not cached; a replaced entry counts once.
func TestByteBound(t *testing.T) {
	const maxBytes = 100 // keys "hot:N" are 5 bytes: an entry of a 20-byte value is 25
	tests := []struct {
		name  string
		adds  []string // keys added, each with a 20-byte value unless in big
		big   map[string]int
		gets  []string // read after the 4th add, which keeps them recent
		want  []string // cached at the end
		bytes int64
	}{
		{name: "under the bound", adds: []string{"hot:1", "hot:2"}, want: []string{"hot:1", "hot:2"}, bytes: 50},
		{name: "least recently used go", adds: []string{"hot:1", "hot:2", "hot:3", "hot:4", "hot:5"},
			want: []string{"hot:2", "hot:3", "hot:4", "hot:5"}, bytes: 100},
		{name: "a read keeps an entry", adds: []string{"hot:1", "hot:2", "hot:3", "hot:4", "hot:5"}, gets: []string{"hot:1"},
			want: []string{"hot:1", "hot:3", "hot:4", "hot:5"}, bytes: 100},
		{name: "larger than max_bytes is not cached", adds: []string{"hot:1", "hot:2"}, big: map[string]int{"hot:2": 96},
			want: []string{"hot:1"}, bytes: 25},
		{name: "max_bytes exactly fits alone", adds: []string{"hot:1", "hot:2"}, big: map[string]int{"hot:2": 95},
			want: []string{"hot:2"}, bytes: 100},
		{name: "a replaced entry counts once", adds: []string{"hot:1", "hot:1", "hot:1"}, want: []string{"hot:1"}, bytes: 25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New([]string{"hot:"}, 100, maxBytes, time.Minute, new(writeguard.Guard))
			for i, k := range tt.adds {
				n := 20
				if b, ok := tt.big[k]; ok {
					n = b
				}
				c.Add("main", []byte(k), Entry{Value: make([]byte, n)}, c.Epoch([]byte(k)))
				if i == 3 {
					for _, g := range tt.gets {
						c.Get("main", []byte(g))
					}
				}
			}
			for _, k := range []string{"hot:1", "hot:2", "hot:3", "hot:4", "hot:5"} {
				_, ok := c.Get("main", []byte(k))
				if want := slices.Contains(tt.want, k); ok != want {
					t.Errorf("%s cached: %v, want %v", k, ok, want)
				}
			}
			if c.Bytes() != tt.bytes || c.Len() != len(tt.want) {
				t.Errorf("%d entries of %d bytes, want %d of %d", c.Len(), c.Bytes(), len(tt.want), tt.bytes)
			}
			c.Purge()
			if c.Bytes() != 0 {
				t.Errorf("%d bytes held after Purge", c.Bytes())
			}
		})
	}
}

func BenchmarkGetHit(b *testing.B) {
	c := New([]string{"hot:"}, 100, 1<<20, time.Minute, new(writeguard.Guard))
	key := []byte("hot:config")
	c.Add("main", key, Entry{Value: make([]byte, 100)}, c.Epoch(key))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := c.Get("main", key); !ok {
			b.Fatal("miss")
		}
	}
}

// TestLateAddAfterPurgeRefused: a value fetched before a flush_all is not cached after it;
// nor one whose fetch a write of its key overlaps.
func TestLateAddAfterPurgeRefused(t *testing.T) {
	writes := new(writeguard.Guard)
	c := New([]string{"hot:"}, 10, 1<<20, time.Minute, writes)
	k := []byte("hot:a")
	ticket := c.Epoch(k)
	c.Purge()
	c.Add("main", k, Entry{Value: []byte("stale")}, ticket)
	if _, ok := c.Get("main", k); ok {
		t.Error("a value fetched before a flush_all is served after it")
	}
	writes.Begin(k)
	ticket = c.Epoch(k) // taken while the write is in flight
	writes.End(k)
	c.Add("main", k, Entry{Value: []byte("either")}, ticket)
	if _, ok := c.Get("main", k); ok {
		t.Error("a value whose fetch a write overlapped was cached")
	}
	c.Add("main", k, Entry{Value: []byte("fresh")}, c.Epoch(k))
	if e, ok := c.Get("main", k); !ok || string(e.Value) != "fresh" {
		t.Error("a value fetched with no write about was not cached")
	}
}

// TestWriteEndsUndroppedEntry: an entry whose key was written since its fetch is not served,
// though nobody dropped it (a hot key that cooled and was written meanwhile; a peer's
// invalidation, which moves the epoch only).
func TestWriteEndsUndroppedEntry(t *testing.T) {
	w := new(writeguard.Guard)
	c := New(nil, 10, 1<<20, time.Minute, w)
	key := []byte("k")
	c.Add("main", key, Entry{Value: []byte("v1")}, c.Epoch(key))
	if _, ok := c.Get("main", key); !ok {
		t.Fatal("entry not served before any write")
	}
	w.Begin(key)
	if _, ok := c.Get("main", key); ok {
		t.Fatal("entry served while a write of its key is in flight")
	}
	w.End(key)
	if _, ok := c.Get("main", key); ok {
		t.Fatal("entry served after a write of its key ended")
	}
	c.Add("main", key, Entry{Value: []byte("v2")}, c.Epoch(key))
	if e, ok := c.Get("main", key); !ok || string(e.Value) != "v2" {
		t.Fatalf("a fetch after the write: Get = %q %v", e.Value, ok)
	}
}

// TestItemExpiry: an entry is not served past its item's own expiry, however long the TTL.
func TestItemExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New([]string{"hot:"}, 10, 1<<20, time.Minute, new(writeguard.Guard))
		key := []byte("hot:a")
		c.Add("main", key, Entry{Value: []byte("v"), Expires: time.Now().Add(3 * time.Second)}, c.Epoch(key))
		time.Sleep(2 * time.Second)
		if _, ok := c.Get("main", key); !ok {
			t.Fatal("entry not served before its item expires")
		}
		time.Sleep(time.Second)
		if _, ok := c.Get("main", key); ok {
			t.Fatal("entry served once its item expired")
		}
	})
}

// TestSetExpires: the expiry learnt after the fill bounds the entry, never applies to one a
// write replaced, and a past one (or zero: never) drops it (or lets the TTL alone bound it).
func TestSetExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := new(writeguard.Guard)
		c := New(nil, 10, 1<<20, time.Minute, w)
		key := []byte("k")
		tk := c.Epoch(key)
		c.Add("main", key, Entry{Value: []byte("v1"), Expires: time.Now().Add(time.Second)}, tk)
		c.SetExpires("main", key, tk, time.Time{}) // never expires: the TTL bounds it
		time.Sleep(10 * time.Second)
		if _, ok := c.Get("main", key); !ok {
			t.Fatal("an entry whose item never expires was dropped before its TTL")
		}
		c.SetExpires("main", key, tk, time.Now().Add(2*time.Second))
		time.Sleep(2 * time.Second)
		if _, ok := c.Get("main", key); ok {
			t.Fatal("served past the expiry set")
		}
		tk = c.Epoch(key)
		c.Add("main", key, Entry{Value: []byte("v2")}, tk)
		c.SetExpires("main", key, tk, time.Now().Add(-time.Second))
		if _, ok := c.Get("main", key); ok {
			t.Fatal("served after a past expiry was set")
		}
		// An ask for an older fill does not touch the entry of a fill after a write.
		old := c.Epoch(key)
		w.Begin(key)
		w.End(key)
		tk = c.Epoch(key)
		c.Add("main", key, Entry{Value: []byte("v3")}, tk)
		c.SetExpires("main", key, old, time.Now().Add(-time.Second))
		if e, ok := c.Get("main", key); !ok || string(e.Value) != "v3" {
			t.Fatalf("Get = %q %v: an older fill's expiry dropped a newer entry", e.Value, ok)
		}
	})
}
