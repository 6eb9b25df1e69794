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
	n, ok := parseCounter(it.value)
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

// parseCounter reads a stored value as memcached's safe_strtoull does: optional leading
// white space, an optional sign, decimal digits that fit in 64 bits, then the end or white
// space (whatever follows is ignored). A minus sign is accepted only where strtoull's
// negation leaves a value below 2^63, so "-0" is 0 and "-1" is not a number, quirks included
// because clients can observe them.
func parseCounter(b []byte) (uint64, bool) {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	neg := false
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		neg = b[i] == '-'
		i++
	}
	start := i
	var n uint64
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		d := uint64(b[i] - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false // out of range: strtoull's ERANGE
		}
		n = n*10 + d
	}
	if i == start || (i < len(b) && !isSpace(b[i])) {
		return 0, false
	}
	if neg {
		n = -n
		if int64(n) < 0 {
			return 0, false
		}
	}
	return n, true
}

// isSpace is C's isspace in the C locale.
func isSpace(c byte) bool {
	return c == ' ' || (c >= '\t' && c <= '\r')
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
