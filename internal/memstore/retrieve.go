package memstore

import "github.com/moxi-proxy/moxi/internal/protocol"

// retrieve answers get, gets, gat and gats: resps[i] for req.Keys[i]. Every hit carries its
// cas unique, whichever of the four it is, so the codec decides what to show.
func (s *Store) retrieve(req *protocol.Request, resps []protocol.Response, now int64) {
	touching := req.Op == protocol.OpGat || req.Op == protocol.OpGats
	for i, key := range req.Keys {
		r := &resps[i]
		s.stats.cmdGet++
		if touching {
			s.stats.cmdTouch++
		}
		it := s.lookup(key, now)
		if it == nil {
			s.stats.getMisses++
			if touching {
				s.stats.touchMisses++
			}
			*r = protocol.Response{Status: protocol.StatusNotFound, Key: key}
			continue
		}
		s.stats.getHits++
		// The answer is taken before a touch that may expire the item: memcached returns the
		// value of a gat with a past exptime, then the item is gone.
		*r = protocol.Response{Key: key, Value: it.value, Flags: it.flags, Cas: it.cas}
		if touching {
			s.stats.touchHits++
			s.touch(it, req.Exptime, now)
		} else {
			s.bump(it)
		}
	}
}
