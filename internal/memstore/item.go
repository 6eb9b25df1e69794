package memstore

// itemOverhead is what an item costs beyond its key and value bytes: the item struct (80
// bytes on 64-bit) plus its map slot, rounded up. Counting it keeps MaxBytes close to the
// memory really held when items are small.
const itemOverhead = 128

// memcached 1.6's item size limit, which the store applies as memcached does: an item is
// its header (48 bytes on 64-bit, plus 8 for the cas), the key and its NUL, 4 bytes of
// client flags when they are not 0, and the value with its "\r\n", and memcached refuses
// one larger than its item size maximum (-I, 1 MiB by default). So with a 1-byte key and
// flags 0 the largest value is 1,048,516 bytes (measured on memcached 1.6.18).
const (
	mcItemHeader  = 48 + 8
	mcItemSizeMax = 1 << 20
)

// mcItemSize is the size memcached gives an item of this key, value and client flags.
func mcItemSize(keyLen, valueLen int, flags uint32) int64 {
	n := int64(mcItemHeader) + int64(keyLen) + 1 + int64(valueLen) + 2
	if flags != 0 {
		n += 4
	}
	return n
}

// item is one stored key. Its value slice is never written after the item is stored, because
// responses hand it out: a modification stores a new slice instead.
type item struct {
	key     string
	value   []byte
	flags   uint32
	exptime int64  // unix second at which it expires; 0 = never
	cas     uint64 // cas unique of the last modification

	// Meta-protocol state, as memcached keeps it in an item's flags: every new item (put)
	// starts without it.
	atime     int64 // unix second the item was stored: mg's l flag
	fetched   bool  // read since stored (mg's h flag)
	stale     bool  // marked stale by md I or an ms I over a newer cas (mg answers X)
	tokenSent bool  // a client was handed the recache token (mg answers Z, not W again)
	binaryKey bool  // stored by ms with b: mg echoes its key in base64

	prev, next *item // LRU list; next is toward the least recently used
}

// itemSize is what an item of this key and value counts against MaxBytes.
func itemSize(keyLen, valueLen int) int64 {
	return int64(keyLen) + int64(valueLen) + itemOverhead
}

func (it *item) size() int64 { return itemSize(len(it.key), len(it.value)) }

func (it *item) expired(now int64) bool { return it.exptime != 0 && it.exptime <= now }

// fits reports whether an item of this size, with client flags 0, can ever be held.
func (s *Store) fits(keyLen, valueLen int) bool {
	return s.fitsFlags(keyLen, valueLen, 0)
}

// fitsFlags reports whether an item of this size and client flags can ever be held: within
// memcached's item size limit and the store's own bound.
func (s *Store) fitsFlags(keyLen, valueLen int, flags uint32) bool {
	return mcItemSize(keyLen, valueLen, flags) <= mcItemSizeMax && itemSize(keyLen, valueLen) <= s.maxBytes
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
	it.atime, it.fetched, it.stale, it.tokenSent, it.binaryKey = now, false, false, false, false
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

// bump makes it the most recently used after a read: it has now been fetched.
func (s *Store) bump(it *item) {
	it.fetched = true
	s.update(it)
}

// update makes it the most recently used.
func (s *Store) update(it *item) {
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
