// Package hotcache keeps recent answers for hot keys in the proxy, for at most a TTL, so
// that reads of them need no round trip to memcached.
package hotcache

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/moxi-proxy/moxi/internal/auth"
)

// Entry is a cached value. Value is owned by the cache and never modified: readers may
// hand it out without copying.
type Entry struct {
	Value []byte
	Flags uint32
	Cas   uint64
}

// Cache is an LRU of entries for keys with the configured prefixes, each entry dropped once
// it is older than the TTL, bounded in entries and in bytes of keys and values. Safe for
// concurrent use.
//
// A write must never be followed by a read of the value it replaced. The interleaving to
// guard against: a read fetches v1 from memcached; a write of v2 is acknowledged and drops
// the key; then the read, late, stores v1, which would be served for a whole TTL. So
// every drop bumps the key's epoch, a read takes the epoch before it fetches, and Add
// stores nothing if the epoch moved meanwhile.
type Cache struct {
	// Namespaced, set before the cache is used, makes the prefixes match a key's part
	// after its namespace: keys are stored as "<user>:<key>" (auth.namespaces).
	Namespaced bool

	prefixes [][]byte
	lru      *expirable.LRU[string, Entry]
	maxBytes int64
	// held is the bytes of the entries in lru. The LRU's eviction callback lowers it, from
	// whichever call evicts (its expiry goroutine included); only Add raises it, under mu.
	held atomic.Int64

	mu     sync.Mutex  // orders Add against Drop
	epochs [256]uint64 // by key hash; guarded by mu
}

// New returns a cache for keys starting with one of prefixes, holding at most maxItems
// entries and maxBytes (> 0) of keys and values, each entry for at most ttl.
func New(prefixes []string, maxItems, maxBytes int, ttl time.Duration) *Cache {
	c := &Cache{maxBytes: int64(maxBytes)}
	c.lru = expirable.NewLRU(maxItems, func(k string, e Entry) { c.held.Add(-size(k, e)) }, ttl)
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

// Get returns the entry for key, if one younger than the TTL is cached.
func (c *Cache) Get(key []byte) (Entry, bool) {
	return c.lru.Get(string(key))
}

// Epoch is the key's epoch, to be taken before fetching a value to Add.
func (c *Cache) Epoch(key []byte) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epochs[stripe(key)]
}

// Add caches a value fetched for key after Epoch returned epoch, unless the key was
// dropped since or the entry alone is larger than maxBytes; the least recently used
// entries go to make room. The value is copied.
func (c *Cache) Add(key []byte, e Entry, epoch uint64) {
	if int64(len(key)+len(e.Value)) > c.maxBytes {
		return
	}
	e.Value = bytes.Clone(e.Value)
	k := string(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epochs[stripe(key)] != epoch {
		return
	}
	// Replacing an entry does not call the eviction callback: remove it first, so that
	// held counts each key once.
	c.lru.Remove(k)
	c.lru.Add(k, e)
	c.held.Add(size(k, e))
	for c.held.Load() > c.maxBytes {
		// Never e itself: it is the newest, and alone it fits.
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
}

// Drop forgets key, and refuses values fetched for it before now.
func (c *Cache) Drop(key []byte) {
	c.mu.Lock()
	c.epochs[stripe(key)]++
	c.lru.Remove(string(key))
	c.mu.Unlock()
}

// Len is the number of entries cached.
func (c *Cache) Len() int { return c.lru.Len() }

// Bytes is the bytes of keys and values cached.
func (c *Cache) Bytes() int64 { return c.held.Load() }

// size is what an entry counts against maxBytes.
func size(key string, e Entry) int64 { return int64(len(key) + len(e.Value)) }

// stripe spreads keys over the epochs (FNV-1a, low byte).
func stripe(key []byte) uint8 {
	h := uint32(2166136261)
	for _, b := range key {
		h = (h ^ uint32(b)) * 16777619
	}
	return uint8(h ^ h>>8 ^ h>>16 ^ h>>24)
}

// Purge drops every entry, and refuses values fetched before now (after flush_all).
func (c *Cache) Purge() {
	c.mu.Lock()
	for i := range c.epochs {
		c.epochs[i]++
	}
	c.lru.Purge()
	c.mu.Unlock()
}
