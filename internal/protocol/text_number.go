package protocol

import "math"

// The number parsers reproduce what memcached accepts through C's strtoull/strtoul/strtol
// (base 10, an optional sign, no trailing bytes, overflow rejected), including its quirks,
// so a client sees the same answer from moxi as from memcached.

// textParseDecimal splits b into a sign and a magnitude; ok is false for anything but an
// optional '+' or '-' followed by one or more digits, or on uint64 overflow.
func textParseDecimal(b []byte) (neg bool, mag uint64, ok bool) {
	if len(b) > 0 && (b[0] == '+' || b[0] == '-') {
		neg = b[0] == '-'
		b = b[1:]
	}
	if len(b) == 0 {
		return false, 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false, 0, false
		}
		d := uint64(c - '0')
		if mag > (math.MaxUint64-d)/10 {
			return false, 0, false
		}
		mag = mag*10 + d
	}
	return neg, mag, true
}

// textParseUint64 is memcached's safe_strtoull: strtoull negates a "-n" modulo 2^64, and
// memcached refuses the result only when it is negative as a signed number.
func textParseUint64(b []byte) (uint64, bool) {
	neg, mag, ok := textParseDecimal(b)
	if !ok {
		return 0, false
	}
	if neg {
		mag = -mag
		if int64(mag) < 0 {
			return 0, false
		}
	}
	return mag, true
}

// ParseCounter reads a stored value as memcached's incr and decr do (safe_strtoull on the
// item's data): optional leading white space, then what textParseUint64 accepts, then the
// end or white space, after which anything is ignored. So "-0" is 0 and "-1" is not a
// number, quirks included, because clients can observe them.
func ParseCounter(b []byte) (uint64, bool) {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	end := i
	for end < len(b) && !isSpace(b[end]) {
		end++
	}
	return textParseUint64(b[i:end])
}

// isSpace is C's isspace in the C locale.
func isSpace(c byte) bool { return c == ' ' || (c >= '\t' && c <= '\r') }

// textParseUint32 is memcached's safe_strtoul on a 64-bit host: a 64-bit parse whose result is
// stored in 32 bits, so 4294967297 becomes 1 (as memcached 1.6.18 stores such flags).
func textParseUint32(b []byte) (uint32, bool) {
	v, ok := textParseUint64(b)
	return uint32(v), ok
}

// textParseInt64 is strtoll: a signed 64-bit parse, overflow rejected.
func textParseInt64(b []byte) (int64, bool) {
	neg, mag, ok := textParseDecimal(b)
	if !ok {
		return 0, false
	}
	if neg {
		if mag > 1<<63 {
			return 0, false
		}
		return -int64(mag), true
	}
	if mag > math.MaxInt64 {
		return 0, false
	}
	return int64(mag), true
}

// textParseInt32 is memcached's safe_strtol for times: a 64-bit parse stored in 32 bits.
func textParseInt32(b []byte) (int64, bool) {
	v, ok := textParseInt64(b)
	return int64(int32(v)), ok
}
