package memstore

import (
	"strconv"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// handleDelta answers incr and decr. incr wraps around at 2^64, decr stops at 0. The result
// is stored as decimal text with the item's flags and exptime and a new cas unique; when it
// is shorter than the old text it is padded with spaces to the old length, because memcached
// rewrites the number in place and clients see exactly that ("5  " after 100 decr 95).
func (s *Store) handleDelta(req *protocol.Request, r *protocol.Response, now int64) {
	incr := req.Op == protocol.OpIncr
	it := s.lookup(req.Key, now)
	if it == nil {
		s.countDelta(incr, false)
		if !req.Create {
			r.Status = protocol.StatusNotFound
			return
		}
		// Binary incr/decr with an initial value: store it as the text memcached would.
		v := strconv.AppendUint(nil, req.Initial, 10)
		if !s.fits(len(req.Key), len(v)) {
			r.Status = protocol.StatusNoMemory
			return
		}
		it = s.put(req.Key, nil, v, 0, expiryAt(req.Exptime, now), now)
		r.Number, r.Cas = req.Initial, it.cas
		return
	}
	s.countDelta(incr, true)
	if req.Cas != 0 && it.cas != req.Cas {
		r.Status = protocol.StatusExists
		return
	}
	n, ok := protocol.ParseCounter(it.value)
	if !ok {
		r.Status = protocol.StatusNonNumeric
		return
	}
	n = applyDelta(n, req.Delta, incr)
	v := make([]byte, 0, max(20, len(it.value)))
	v = strconv.AppendUint(v, n, 10)
	for len(v) < len(it.value) {
		v = append(v, ' ')
	}
	if !s.fits(len(it.key), len(v)) {
		r.Status = protocol.StatusNoMemory
		return
	}
	it = s.put(req.Key, it, v, it.flags, it.exptime, now)
	r.Number, r.Cas = n, it.cas
}

func (s *Store) countDelta(incr, hit bool) {
	switch {
	case incr && hit:
		s.stats.incrHits++
	case incr:
		s.stats.incrMisses++
	case hit:
		s.stats.decrHits++
	default:
		s.stats.decrMisses++
	}
}

// applyDelta is memcached's arithmetic: incr wraps around at 2^64, decr stops at 0.
func applyDelta(n, delta uint64, incr bool) uint64 {
	switch {
	case incr:
		return n + delta
	case delta > n:
		return 0
	default:
		return n - delta
	}
}
