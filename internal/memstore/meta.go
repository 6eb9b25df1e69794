package memstore

import (
	"bytes"
	"encoding/base64"
	"strconv"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// The meta commands, with memcached 1.6.18's semantics. Each walks the request's flags in
// the order they were sent, as memcached does: the return flags come out in that order, and
// a T or N before a t changes what t shows.

// slabChunkMax is memcached's default slab_chunk_size_max: a larger item is stored in
// chunks, and memcached will not do arithmetic on a chunked item.
const slabChunkMax = 512 << 10

func (s *Store) handleMeta(req *protocol.Request, r *protocol.Response, now int64) {
	r.Key = req.Key
	switch req.Op {
	case protocol.OpMetaNoop:
		r.Meta.Code = protocol.MetaMN
	case protocol.OpMetaGet:
		s.metaGet(req, r, now)
	case protocol.OpMetaSet:
		s.metaSet(req, r, now)
	case protocol.OpMetaDelete:
		s.metaDelete(req, r, now)
	case protocol.OpMetaArithmetic:
		s.metaArithmetic(req, r, now)
	case protocol.OpMetaDebug:
		s.metaDebug(req, r, now)
	}
}

// metaDebug answers me: "ME <key> exp= la= cas= fetch= cls= size=", as memcached 1.6.18
// prints them — exp is its now minus the expiry, negative while the item lives, or -1 —
// or EN. cls, memcached's slab class, is 1: the store has no slab classes.
func (s *Store) metaDebug(req *protocol.Request, r *protocol.Response, now int64) {
	it := s.lookup(req.Key, now)
	if it == nil {
		metaAnswer(r, protocol.MetaEN, nil)
		return
	}
	flags := []byte{' '}
	if it.binaryKey {
		flags = base64.StdEncoding.AppendEncode(flags, []byte(it.key))
	} else {
		flags = append(flags, it.key...)
	}
	exp := int64(-1)
	if it.exptime != 0 {
		exp = now - it.exptime
	}
	fetch := "no"
	if it.fetched {
		fetch = "yes"
	}
	flags = strconv.AppendInt(append(flags, " exp="...), exp, 10)
	flags = strconv.AppendInt(append(flags, " la="...), now-it.atime, 10)
	flags = strconv.AppendUint(append(flags, " cas="...), it.cas, 10)
	flags = append(append(flags, " fetch="...), fetch...)
	flags = strconv.AppendInt(append(flags, " cls=1 size="...), mcItemSize(len(it.key), len(it.value), it.flags), 10)
	metaAnswer(r, protocol.MetaME, flags)
}

// metaAnswer sets r to the code; flags is the return flags text, the store's own.
func metaAnswer(r *protocol.Response, code protocol.MetaCode, flags []byte) {
	r.Status = code.Status()
	r.Meta = protocol.MetaAnswer{Code: code, Flags: flags}
}

// metaOpaqueError answers the error memcached gives an O token too long, once the command
// has taken effect.
func metaOpaqueError(r *protocol.Response) {
	*r = protocol.Response{Status: protocol.StatusInvalid, Msg: protocol.MetaMsgOpaqueTooLong}
}

// appendMetaKey appends the k return flag: the key, or its base64 and " b".
func appendMetaKey(dst, key []byte, binary bool) []byte {
	dst = append(dst, " k"...)
	if !binary {
		return append(dst, key...)
	}
	dst = base64.StdEncoding.AppendEncode(dst, key)
	return append(dst, " b"...)
}

// appendMetaTTL appends the t return flag: the seconds left, or -1 for none.
func appendMetaTTL(dst []byte, exptime, now int64) []byte {
	dst = append(dst, " t"...)
	if exptime == 0 {
		return append(dst, "-1"...)
	}
	return strconv.AppendUint(dst, uint64(uint32(exptime-now)), 10)
}

// appendMetaEcho appends the return flags that need no item (O and k), as on a miss; ok is
// false for an O token too long.
func appendMetaEcho(dst []byte, req *protocol.Request) (out []byte, ok bool) {
	for _, f := range req.Meta.Flags {
		if dst, ok = appendEchoFlag(dst, f, req.Key, req.Meta.Base64); !ok {
			return dst, false
		}
	}
	return dst, true
}

// appendEchoFlag appends f's return flag when f is O (the opaque, echoed) or k (the key);
// any other flag appends nothing. ok is false for an opaque memcached refuses as too long.
func appendEchoFlag(dst []byte, f protocol.MetaFlag, key []byte, binary bool) (out []byte, ok bool) {
	switch f.Letter {
	case 'O':
		if 1+len(f.Token) > protocol.MetaMaxOpaque {
			return dst, false
		}
		return append(append(append(dst, ' '), 'O'), f.Token...), true
	case 'k':
		return appendMetaKey(dst, key, binary), true
	}
	return dst, true
}

// metaGet answers mg: N creates the item on a miss and wins its token; R wins the token
// of an item whose TTL is below it; a stale item (X) hands out one token, and an item whose
// token is out answers Z.
func (s *Store) metaGet(req *protocol.Request, r *protocol.Response, now int64) {
	m := &req.Meta
	s.stats.cmdGet++
	it := s.lookup(req.Key, now)
	created := false
	if it == nil && m.Vivify && s.fits(len(req.Key), 0) {
		it = s.put(req.Key, nil, []byte{}, 0, 0, now)
		created = true
	}
	if it == nil {
		s.stats.getMisses++
		flags, ok := appendMetaEcho(nil, req)
		if !ok {
			metaOpaqueError(r)
			return
		}
		metaAnswer(r, protocol.MetaEN, flags)
		return
	}
	s.stats.getHits++
	var flags []byte
	won := false
	for _, f := range m.Flags {
		switch f.Letter {
		case 'T':
			s.stats.cmdTouch++
			it.exptime = expiryAt(m.TTL, now)
		case 'N':
			if created {
				it.exptime = expiryAt(m.VivifyTTL, now)
				won = true
			}
		case 'R':
			if !it.tokenSent && !created && it.exptime != 0 && it.exptime < expiryAt(m.RecacheTTL, now) {
				won = true
			}
		case 's':
			flags = strconv.AppendInt(append(flags, " s"...), int64(len(it.value)), 10)
		case 't':
			flags = appendMetaTTL(flags, it.exptime, now)
		case 'c':
			flags = strconv.AppendUint(append(flags, " c"...), it.cas, 10)
		case 'f':
			flags = strconv.AppendUint(append(flags, " f"...), uint64(it.flags), 10)
		case 'l':
			flags = strconv.AppendInt(append(flags, " l"...), now-it.atime, 10)
		case 'h':
			h := byte('0')
			if it.fetched {
				h = '1'
			}
			flags = append(flags, ' ', 'h', h)
		case 'O', 'k':
			var ok bool
			if flags, ok = appendEchoFlag(flags, f, req.Key, it.binaryKey); !ok {
				metaOpaqueError(r)
				return
			}
		}
	}
	// Z before X, and W last, in memcached's order; an item's token is handed out once.
	if it.tokenSent {
		flags = append(flags, " Z"...)
	}
	if it.stale {
		flags = append(flags, " X"...)
		won = won || !it.tokenSent
	}
	if won {
		flags = append(flags, " W"...)
		it.tokenSent = true
	}
	code := protocol.MetaHD
	if m.ReturnValue {
		code = protocol.MetaVA
		r.Value, r.Flags, r.Cas = it.value, it.flags, it.cas
	}
	metaAnswer(r, code, flags)
	if !m.NoBump {
		s.bump(it)
	}
}

// metaSet answers ms in its modes: set (S, the default), add (E), append (A), prepend (P),
// replace (R); a C token makes set and replace a cas, and with I a cas older than the
// item's stores the value as stale rather than failing.
func (s *Store) metaSet(req *protocol.Request, r *protocol.Response, now int64) {
	m := &req.Meta
	s.stats.cmdSet++
	if !s.fitsFlags(len(req.Key), len(req.Value), m.ClientFlags) {
		// memcached unlinks the key whatever the mode, so that no older value stays.
		if it := s.items[string(req.Key)]; it != nil {
			s.remove(it)
		}
		r.Status = protocol.StatusTooLarge
		return
	}
	mode := m.Mode
	if m.HasCas && (mode == 0 || mode == 'S' || mode == 'R') {
		mode = 'C'
	}
	var ttl int64
	if m.HasTTL {
		ttl = m.TTL
	}
	old := s.lookup(req.Key, now)
	code, stored := s.metaStore(req, mode, old, expiryAt(ttl, now), now)
	var cas uint64
	if stored != nil {
		cas = stored.cas
	}
	var flags []byte
	for _, f := range m.Flags {
		switch f.Letter {
		case 'O', 'k':
			flags, _ = appendEchoFlag(flags, f, req.Key, m.Base64) // the decoder refused a long O
		case 'c':
			flags = strconv.AppendUint(append(flags, " c"...), cas, 10)
		}
	}
	metaAnswer(r, code, flags)
}

// metaStore carries out ms in mode (with 'C' for a cas) over old, the live item or nil, and
// returns the answer's code and the item stored, nil when nothing was.
func (s *Store) metaStore(req *protocol.Request, mode byte, old *item, exptime, now int64) (protocol.MetaCode, *item) {
	m := &req.Meta
	value := func() []byte { return bytes.Clone(req.Value) }
	switch mode {
	case 'E':
		if old != nil {
			s.update(old)
			return protocol.MetaNS, nil
		}
	case 'R':
		if old == nil {
			return protocol.MetaNS, nil
		}
	case 'A', 'P':
		switch {
		case old == nil:
			return protocol.MetaNS, nil
		case m.Cas != 0 && m.Cas != old.cas:
			return protocol.MetaEX, nil
		case !s.fitsFlags(len(old.key), len(old.value)+len(req.Value), old.flags):
			return protocol.MetaNS, nil
		}
		v := make([]byte, 0, len(old.value)+len(req.Value))
		if mode == 'A' {
			v = append(append(v, old.value...), req.Value...)
		} else {
			v = append(append(v, req.Value...), old.value...)
		}
		return protocol.MetaHD, s.put(req.Key, old, v, old.flags, old.exptime, now)
	case 'C':
		switch {
		case old == nil:
			s.stats.casMisses++
			return protocol.MetaNF, nil
		case m.Cas == old.cas:
			s.stats.casHits++
		case m.Invalidate && m.Cas != 0 && m.Cas < old.cas:
			// A value older than the item's, stored as stale: it keeps the item's TTL and
			// whether its token is out.
			s.stats.casHits++
			sent := old.tokenSent
			it := s.put(req.Key, old, value(), m.ClientFlags, old.exptime, now)
			it.stale, it.tokenSent, it.binaryKey = true, sent, m.Base64
			return protocol.MetaHD, it
		default:
			s.stats.casBadval++
			return protocol.MetaEX, nil
		}
	}
	it := s.put(req.Key, old, value(), m.ClientFlags, exptime, now)
	it.binaryKey = m.Base64
	return protocol.MetaHD, it
}

// metaDelete answers md: it deletes the item or, with I, marks it stale (with a new cas
// and, with T, a new TTL) so that the next mg hands out a token to refresh it.
func (s *Store) metaDelete(req *protocol.Request, r *protocol.Response, now int64) {
	m := &req.Meta
	flags, _ := appendMetaEcho(nil, req) // the decoder refused a long opaque
	it := s.lookup(req.Key, now)
	switch {
	case it == nil:
		s.stats.deleteMisses++
		metaAnswer(r, protocol.MetaNF, flags)
	case m.HasCas && it.cas != m.Cas:
		s.stats.deleteMisses++
		metaAnswer(r, protocol.MetaEX, flags)
	case m.Invalidate:
		if m.HasTTL {
			it.exptime = expiryAt(m.TTL, now)
		}
		it.stale, it.tokenSent = true, false
		s.casSeq++
		it.cas = s.casSeq
		metaAnswer(r, protocol.MetaHD, flags)
	default:
		s.stats.deleteHits++
		s.remove(it)
		metaAnswer(r, protocol.MetaHD, flags)
	}
}

// metaArithmetic answers ma: incr (the default, MI or M+) or decr (MD or M-) by D (1),
// creating a missing item with J (0) under N.
func (s *Store) metaArithmetic(req *protocol.Request, r *protocol.Response, now int64) {
	m := &req.Meta
	incr := m.Mode != 'D' && m.Mode != '-'
	it := s.lookup(req.Key, now)
	var (
		view    *item // the item the return flags describe
		number  []byte
		created bool
	)
	switch {
	case it == nil && !m.Vivify:
		s.countDelta(incr, false)
		flags, ok := appendMetaEcho(nil, req)
		if !ok {
			metaOpaqueError(r)
			return
		}
		metaAnswer(r, protocol.MetaNF, flags)
		return
	case it == nil:
		s.countDelta(incr, false)
		number = strconv.AppendUint(nil, m.Initial, 10)
		view = s.put(req.Key, nil, number, 0, 0, now)
		r.Number, created = m.Initial, true
	case len(it.value) == 0 || mcItemSize(len(it.key), len(it.value), it.flags) > slabChunkMax:
		r.Status = protocol.StatusNonNumeric
		return
	case m.Cas != 0 && it.cas != m.Cas:
		flags, ok := appendMetaEcho(nil, req)
		if !ok {
			metaOpaqueError(r)
			return
		}
		metaAnswer(r, protocol.MetaEX, flags)
		return
	default:
		n, ok := protocol.ParseCounter(it.value)
		if !ok {
			r.Status = protocol.StatusNonNumeric
			return
		}
		s.countDelta(incr, true)
		n = applyDelta(n, m.Delta, incr)
		number = strconv.AppendUint(nil, n, 10)
		r.Number = n
		view = s.metaStoreNumber(req.Key, it, number, now)
	}
	var flags []byte
	for _, f := range m.Flags {
		switch f.Letter {
		case 'c':
			flags = strconv.AppendUint(append(flags, " c"...), view.cas, 10)
		case 't':
			flags = appendMetaTTL(flags, view.exptime, now)
		case 'T':
			view.exptime = expiryAt(m.TTL, now)
		case 'N':
			if created {
				view.exptime = expiryAt(m.VivifyTTL, now)
			}
		case 'O', 'k':
			var ok bool
			if flags, ok = appendEchoFlag(flags, f, req.Key, m.Base64); !ok {
				metaOpaqueError(r)
				return
			}
		}
	}
	code := protocol.MetaHD
	if m.ReturnValue {
		code = protocol.MetaVA
		r.Value = number
	}
	metaAnswer(r, code, flags)
	r.Meta.Vivified = created
}

// metaStoreNumber stores number as the new value of it (under key) as memcached does: in place, padded with
// spaces to the old length and keeping the item's meta state, when it fits there; else as
// a new item. It returns the item ma's return flags describe: the item itself, or for a new
// item a copy of the old one with the new cas, which memcached answers from (and which a
// later T changes to no effect).
func (s *Store) metaStoreNumber(key []byte, it *item, number []byte, now int64) *item {
	if len(number) <= len(it.value) {
		v := make([]byte, len(it.value))
		copy(v, number)
		for i := len(number); i < len(v); i++ {
			v[i] = ' '
		}
		fetched, stale, sent, bin := it.fetched, it.stale, it.tokenSent, it.binaryKey
		it = s.put(key, it, v, it.flags, it.exptime, now)
		it.fetched, it.stale, it.tokenSent, it.binaryKey = fetched, stale, sent, bin
		return it
	}
	old := *it
	it = s.put(key, it, number, it.flags, it.exptime, now)
	old.cas = it.cas
	old.prev, old.next = nil, nil
	return &old
}
