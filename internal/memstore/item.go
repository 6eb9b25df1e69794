package memstore

// itemOverhead is what an item costs beyond its key and value bytes: the item struct (80
// bytes on 64-bit) plus its map slot, rounded up. Counting it keeps MaxBytes close to the
// memory really held when items are small.
const itemOverhead = 128

// item is one stored key. Its value slice is never written after the item is stored, because
// responses hand it out: a modification stores a new slice instead.
type item struct {
	key     string
	value   []byte
	flags   uint32
	exptime int64  // unix second at which it expires; 0 = never
	cas     uint64 // cas unique of the last modification

	prev, next *item // LRU list; next is toward the least recently used
}

// itemSize is what an item of this key and value counts against MaxBytes.
func itemSize(keyLen, valueLen int) int64 {
	return int64(keyLen) + int64(valueLen) + itemOverhead
}

func (it *item) size() int64 { return itemSize(len(it.key), len(it.value)) }

func (it *item) expired(now int64) bool { return it.exptime != 0 && it.exptime <= now }

// fits reports whether an item of this size can ever be held.
func (s *Store) fits(keyLen, valueLen int) bool {
	return itemSize(keyLen, valueLen) <= s.maxBytes
}

// lookup returns the live item for key, or nil. An expired item found on the way is removed:
// expiry is lazy, so this and eviction are where expired memory comes back.
func (s *Store) lookup(key []byte, now int64) *item {
	it := s.items[string(key)]
	if it == nil {
		return nil
	}
	if it.expired(now) {
		s.remove(it)
		s.stats.reclaimed++
		return nil
	}
	return it
}

// put stores value under key with a new cas unique and makes it the most recently used. old
// is the live item for key, or nil; its struct and key string are reused. The caller has
// checked that the size fits; value is already the store's own copy. An item that has
// already expired is not kept at all, which is what memcached's answer would amount to.
func (s *Store) put(key []byte, old *item, value []byte, flags uint32, exptime, now int64) *item {
	s.casSeq++
	s.stats.totalItems++
	it := old
	if it != nil {
		s.unlinkLRU(it)
		s.bytes -= it.size()
	} else {
		it = &item{key: string(key)}
	}
	it.value, it.flags, it.exptime, it.cas = value, flags, exptime, s.casSeq
	if it.expired(now) {
		if old != nil {
			delete(s.items, it.key)
		}
		return it
	}
	n := it.size()
	s.makeRoom(n, now)
	if old == nil {
		s.items[it.key] = it
	}
	s.pushFront(it)
	s.bytes += n
	return it
}

// remove drops it from the store.
func (s *Store) remove(it *item) {
	s.unlinkLRU(it)
	delete(s.items, it.key)
	s.bytes -= it.size()
}

// makeRoom evicts from the least recently used end until n more bytes fit. Items found
// expired there are reclaimed, not counted as evictions, as memcached does.
func (s *Store) makeRoom(n, now int64) {
	for s.bytes+n > s.maxBytes && s.lru.prev != &s.lru {
		victim := s.lru.prev
		if victim.expired(now) {
			s.stats.reclaimed++
		} else {
			s.stats.evictions++
		}
		s.remove(victim)
	}
}

// clear drops every item.
func (s *Store) clear() {
	clear(s.items)
	s.lru.next, s.lru.prev = &s.lru, &s.lru
	s.bytes = 0
}

// bump makes it the most recently used.
func (s *Store) bump(it *item) {
	if s.lru.next == it {
		return
	}
	s.unlinkLRU(it)
	s.pushFront(it)
}

func (s *Store) pushFront(it *item) {
	it.prev, it.next = &s.lru, s.lru.next
	s.lru.next.prev = it
	s.lru.next = it
}

func (s *Store) unlinkLRU(it *item) {
	it.prev.next = it.next
	it.next.prev = it.prev
	it.prev, it.next = nil, nil
}
