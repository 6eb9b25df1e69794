// Package hotcache keeps recent answers for hot keys in the proxy, for at most a TTL, so
// that reads of them need no round trip to memcached.
package hotcache

import (
	"bytes"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/moxi-proxy/moxi/internal/auth"
)

// Entry is a cached value. Value is owned by the cache and never modified: readers may
// hand it out without copying.
type Entry struct {
	Value []byte
	Flags uint32
	Cas   uint64
	// Expires is when the item expires on its server (zero: never, or not known): the entry
	// is not served from then on, whatever the TTL.
	Expires time.Time
}

// Cache is an LRU of entries for keys with the configured prefixes, each entry dropped once
// it is older than the TTL, bounded in entries and in bytes of keys and values. Safe for
// concurrent use.
//
// An entry is named by its pool and its key (as stored: a namespace is part of it): the
// same key name in two pools is two entries, so a listener whose default pool is another
// one never reads this pool's value.
//
// A write must never be followed by a read of the value it replaced. The interleaving to
// guard against: a read fetches v1 from memcached; a write of v2 is acknowledged and drops
// the key; then the read, late, stores v1, which would be served for a whole TTL. So a
// read takes the key's epoch in the process's guard of writes (Writes) before it fetches,
// and Add stores nothing if a write of the key was in flight then, or began or ended
// since; a flush_all (Purge) refuses what was fetched before it too.
//
// Expired entries are dropped when read or when the LRU needs room: the cache starts no
// goroutine, so nothing outlives it (one is built per topology).
type Cache struct {
	// Namespaced, set before the cache is used, makes the prefixes match a key's part
	// after its namespace: keys are stored as "<user>:<key>" (auth.namespaces).
	Namespaced bool

	prefixes [][]byte
	maxBytes int64
	ttl      time.Duration
	writes   Writes

	mu     sync.Mutex                         // guards the fields below
	lru    *simplelru.LRU[string, timedEntry] // by name (pool, NUL, key)
	held   int64                              // bytes of the entries in lru
	purges uint64                             // Purge calls
}

// Writes is the process's guard of writes by key (writeguard.Guard) as the cache consults it.
type Writes interface {
	// Epoch is key's epoch, taken without a lock before a read whose value may be cached.
	Epoch(key []byte) uint64
	// IfQuiet runs fn when no write of key was in flight at epoch e, and none began or
	// ended since; a write that begins meanwhile waits for fn.
	IfQuiet(key []byte, e uint64, fn func())
}

// Ticket is what a read takes before it fetches a value it may cache (Epoch), and gives Add.
type Ticket struct {
	write  uint64 // the key's epoch in Writes
	purges uint64
}

// timedEntry is an entry, when it was added and what it counts against maxBytes: its key
// and value (the pool's name, shared by many, is not counted).
type timedEntry struct {
	Entry
	added time.Time
	size  int64
	epoch uint64 // the key's epoch in Writes when it was fetched
}

// New returns a cache for keys starting with one of prefixes, holding at most maxItems
// entries and maxBytes (> 0) of keys and values, each entry for at most ttl, and filled
// only where writes (the process's guard) allows.
func New(prefixes []string, maxItems, maxBytes int, ttl time.Duration, writes Writes) *Cache {
	c := &Cache{maxBytes: int64(maxBytes), ttl: ttl, writes: writes}
	// The eviction callback runs under mu: every call that evicts holds it.
	c.lru, _ = simplelru.NewLRU(max(maxItems, 1), func(_ string, e timedEntry) { c.held -= e.size })
	for _, p := range prefixes {
		c.prefixes = append(c.prefixes, []byte(p))
	}
	return c
}

// Hot reports whether key is cached here at all (has one of the prefixes).
func (c *Cache) Hot(key []byte) bool {
	if c == nil {
		return false
	}
	if c.Namespaced {
		key = auth.ClientKey(key)
	}
	for _, p := range c.prefixes {
		if bytes.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// Get returns the entry for key of pool, if one younger than the TTL is cached.
func (c *Cache) Get(pool string, key []byte) (Entry, bool) {
	name := nameOf(pool, key)
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.lru.Get(name)
	if !ok {
		return Entry{}, false
	}
	// A write of the key (or of one sharing its stripe) since the fetch ends the entry, even
	// one nobody dropped: a key served because it is hot (hot_keys.cache) may cool, be
	// written while not hot, and turn hot again; and POST /invalidate moves the epoch only.
	if !c.servable(&e, key, time.Now()) {
		c.lru.Remove(name)
		return Entry{}, false
	}
	return e.Entry, true
}

// servable reports whether e, the entry of key, may be served at now: younger than the TTL,
// its item not expired, and no write of the key since it was fetched.
func (c *Cache) servable(e *timedEntry, key []byte, now time.Time) bool {
	return now.Sub(e.added) < c.ttl && (e.Expires.IsZero() || now.Before(e.Expires)) && c.writes.Epoch(key) == e.epoch
}

// Holds reports whether Get would answer key of pool now, without Get's effects: the LRU
// order is left as it is, and an entry past serving is not dropped. For the admin views.
func (c *Cache) Holds(pool string, key []byte) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.lru.Peek(nameOf(pool, key))
	return ok && c.servable(&e, key, time.Now())
}

// Epoch is the ticket of key, to be taken before fetching a value of it to Add.
func (c *Cache) Epoch(key []byte) Ticket {
	c.mu.Lock()
	purges := c.purges
	c.mu.Unlock()
	return Ticket{write: c.writes.Epoch(key), purges: purges}
}

// Add caches a value of key of pool fetched after Epoch returned t, unless a write of the
// key overlapped the fetch, or a Purge came since, or the entry alone is larger than
// maxBytes; the least recently used entries go to make room. The value is copied.
func (c *Cache) Add(pool string, key []byte, e Entry, t Ticket) {
	size := int64(len(key) + len(e.Value))
	if size > c.maxBytes {
		return
	}
	e.Value = bytes.Clone(e.Value)
	c.writes.IfQuiet(key, t.write, func() { c.add(nameOf(pool, key), e, size, t.purges, t.write) })
}

// add is Add under the write guard.
func (c *Cache) add(name string, e Entry, size int64, purges, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.purges != purges {
		return
	}
	// Replacing an entry does not call the eviction callback: remove it first, so that
	// held counts each key once.
	c.lru.Remove(name)
	c.lru.Add(name, timedEntry{e, time.Now(), size, epoch})
	c.held += size
	for c.held > c.maxBytes {
		// Never e itself: it is the newest, and alone it fits.
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
}

// SetExpires sets when the entry of key of pool that a fetch after Epoch returned t cached
// stops being served, once its item's expiry is known: zero for never (the TTL alone), a
// past instant drops it. An entry a later write replaced is left alone.
func (c *Cache) SetExpires(pool string, key []byte, t Ticket, expires time.Time) {
	name := nameOf(pool, key)
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.lru.Peek(name)
	if !ok || e.epoch != t.write {
		return
	}
	if !expires.IsZero() && !expires.After(time.Now()) {
		c.lru.Remove(name)
		return
	}
	e.Expires = expires
	c.lru.Add(name, e) // an update in place: the eviction callback is not called
}

// Drop forgets key of pool. (What a read fetched before a write is refused by the write
// guard, see Add.)
func (c *Cache) Drop(pool string, key []byte) {
	name := nameOf(pool, key)
	c.mu.Lock()
	c.lru.Remove(name)
	c.mu.Unlock()
}

// Len is the number of entries cached, expired ones not yet dropped included.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Bytes is the bytes of keys and values cached, expired ones not yet dropped included.
func (c *Cache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held
}

// nameOf is an entry's name in the LRU: pool and key, apart.
func nameOf(pool string, key []byte) string {
	b := make([]byte, 0, len(pool)+1+len(key))
	b = append(append(append(b, pool...), 0), key...)
	return string(b)
}

// Purge drops every entry, and refuses values fetched before now (after flush_all).
func (c *Cache) Purge() {
	c.mu.Lock()
	c.purges++
	c.lru.Purge()
	c.mu.Unlock()
}
