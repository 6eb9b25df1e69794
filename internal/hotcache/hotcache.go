// Package hotcache keeps recent answers for hot keys in the proxy, for at most a TTL, so
// that reads of them need no round trip to memcached.
package hotcache

import (
	"bytes"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
)

// Entry is a cached value. Value is owned by the cache and never modified: readers may
// hand it out without copying.
type Entry struct {
	Value []byte
	Flags uint32
	Cas   uint64
}

// Cache is an LRU of entries for keys with the configured prefixes, each entry dropped once
// it is older than the TTL. Safe for concurrent use.
//
// A write must never be followed by a read of the value it replaced. The interleaving to
// guard against: a read fetches v1 from memcached; a write of v2 is acknowledged and drops
// the key; then the read, late, stores v1, which would be served for a whole TTL. So
// every drop bumps the key's epoch, a read takes the epoch before it fetches, and Add
// stores nothing if the epoch moved meanwhile.
type Cache struct {
	prefixes [][]byte
	lru      *expirable.LRU[string, Entry]

	mu     sync.Mutex  // orders Add against Drop
	epochs [256]uint64 // by key hash; guarded by mu
}

// New returns a cache for keys starting with one of prefixes, holding at most maxItems
// entries, each for at most ttl.
func New(prefixes []string, maxItems int, ttl time.Duration) *Cache {
	c := &Cache{lru: expirable.NewLRU[string, Entry](maxItems, nil, ttl)}
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
// dropped since. The value is copied.
func (c *Cache) Add(key []byte, e Entry, epoch uint64) {
	e.Value = bytes.Clone(e.Value)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epochs[stripe(key)] != epoch {
		return
	}
	c.lru.Add(string(key), e)
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
