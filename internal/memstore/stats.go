package memstore

import (
	"strconv"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// counters are the store's statistics, named as memcached's "stats" output names them.
type counters struct {
	cmdGet, cmdSet, cmdFlush, cmdTouch uint64
	getHits, getMisses                 uint64
	deleteHits, deleteMisses           uint64
	incrHits, incrMisses               uint64
	decrHits, decrMisses               uint64
	casHits, casMisses, casBadval      uint64
	touchHits, touchMisses             uint64
	totalItems, evictions, reclaimed   uint64
}

// Stats returns the store's counters as memcached's "stats" lines, in memcached's order and
// with its names. It is safe for concurrent use; the slice is the caller's.
func (s *Store) Stats() []protocol.Stat {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applyDueFlush(s.now().Unix())
	return s.statsLocked()
}

func (s *Store) statsLocked() []protocol.Stat {
	c := &s.stats
	u := func(name string, v uint64) protocol.Stat {
		return protocol.Stat{Name: name, Value: strconv.FormatUint(v, 10)}
	}
	return []protocol.Stat{
		{Name: "version", Value: version},
		u("cmd_get", c.cmdGet),
		u("cmd_set", c.cmdSet),
		u("cmd_flush", c.cmdFlush),
		u("cmd_touch", c.cmdTouch),
		u("get_hits", c.getHits),
		u("get_misses", c.getMisses),
		u("delete_misses", c.deleteMisses),
		u("delete_hits", c.deleteHits),
		u("incr_misses", c.incrMisses),
		u("incr_hits", c.incrHits),
		u("decr_misses", c.decrMisses),
		u("decr_hits", c.decrHits),
		u("cas_misses", c.casMisses),
		u("cas_hits", c.casHits),
		u("cas_badval", c.casBadval),
		u("touch_hits", c.touchHits),
		u("touch_misses", c.touchMisses),
		u("limit_maxbytes", uint64(s.maxBytes)),
		u("bytes", uint64(s.bytes)),
		u("curr_items", uint64(len(s.items))),
		u("total_items", c.totalItems),
		u("evictions", c.evictions),
		u("reclaimed", c.reclaimed),
	}
}
