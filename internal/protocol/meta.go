package protocol

// memcached's meta commands (mn mg ms md ma), as memcached 1.6.18 speaks them: the request
// and answer values here, the decoder in meta_parse.go, the encoders in meta_encode.go and
// the reader of a server's answers in meta_answer.go.

// MetaMaxOpaque is the longest O token (with its letter) memcached echoes; a longer one is
// answered "CLIENT_ERROR " + MetaMsgOpaqueTooLong.
const (
	MetaMaxOpaque        = 32
	MetaMsgOpaqueTooLong = "opaque token too long"
)

// MetaFlag is one flag of a meta request as sent: its letter and the bytes after it
// (Token is empty for a flag without one, such as v).
type MetaFlag struct {
	Letter byte
	Token  []byte
}

// MetaRequest is what a meta command carries besides Request.Key (the decoded key) and, for
// ms, Request.Value (the data block). Flags is the raw material: a server re-encodes the
// request from KeyToken and Flags (AppendMetaRequest), and a store prints its return flags
// in Flags' order, as memcached does. The other fields are Flags parsed.
//
// The zero value is a request without flags. Byte slices alias the decoder's buffers, as
// Request's do; Flags keeps its capacity across Request.Reset.
type MetaRequest struct {
	KeyToken []byte     // the key as sent: base64 when Base64
	Flags    []MetaFlag // every flag, in request order (no letter twice)

	Base64      bool   // b: KeyToken is base64; return k as base64 followed by " b"
	Quiet       bool   // q: the nominal answer is not written (see MetaSuppressed)
	ReturnValue bool   // v: answer VA with the value
	NoBump      bool   // u: mg does not bump the item in the LRU
	Invalidate  bool   // I: md marks the item stale; ms with C may store over a newer cas as stale
	Mode        byte   // M: ms E A P R S, ma I + D -; 0 when not given
	HasTTL      bool   // T was given
	TTL         int64  // T: new exptime, as sent (memcached's rules)
	Vivify      bool   // N was given: mg/ma create the item on a miss
	VivifyTTL   int64  // N: exptime of an item created by a miss
	Recache     bool   // R was given
	RecacheTTL  int64  // R: mg wins the token when the item's remaining TTL is below this
	HasCas      bool   // C was given
	Cas         uint64 // C: compare-and-swap value
	ClientFlags uint32 // F: ms client flags
	Delta       uint64 // D: ma delta (1 when not given)
	Initial     uint64 // J: ma value of an item created by N
}

// Flag returns the flag with letter c, and whether it was given.
func (m *MetaRequest) Flag(c byte) (MetaFlag, bool) {
	for _, f := range m.Flags {
		if f.Letter == c {
			return f, true
		}
	}
	return MetaFlag{}, false
}

// MetaCode is the two-letter code that starts a meta answer.
type MetaCode uint8

// The meta answer codes. MetaNone means the answer is not a meta answer line: an error
// (Response.Status and Msg), or a Response a server filled without Meta (the code then
// follows from Status, see AppendTextResponse).
const (
	MetaNone MetaCode = iota
	MetaVA            // value follows
	MetaHD            // success, no value
	MetaEN            // mg: miss
	MetaNF            // not found
	MetaNS            // not stored
	MetaEX            // exists: cas mismatch
	MetaMN            // mn
	MetaME            // me: the item's metadata, in Flags
)

var metaCodeNames = [...]string{"", "VA", "HD", "EN", "NF", "NS", "EX", "MN", "ME"}

// String is the code as written on the wire ("" for MetaNone).
func (c MetaCode) String() string {
	if int(c) >= len(metaCodeNames) {
		return ""
	}
	return metaCodeNames[c]
}

// Status is the Status that goes with the code: a hit or success is StatusOK, EN and NF
// StatusNotFound, NS StatusNotStored, EX StatusExists.
func (c MetaCode) Status() Status {
	switch c {
	case MetaEN, MetaNF:
		return StatusNotFound
	case MetaNS:
		return StatusNotStored
	case MetaEX:
		return StatusExists
	}
	return StatusOK
}

// MetaAnswer is the meta part of a Response: the code and the return flags. With MetaVA the
// value is Response.Value.
type MetaAnswer struct {
	Code MetaCode
	// Flags is the text that follows the code on the answer line (for VA: that follows the
	// length), verbatim, each flag preceded by its space: " s3 c12 Oabc". Empty for none.
	// It never aliases a buffer that is reused.
	Flags []byte
	// Vivified is set on ma's answer when N created the item: memcached 1.6.18 writes that
	// answer even under q.
	Vivified bool
}

// MetaSuppressed reports whether resp, the answer to req, is not written because req has
// the q flag: memcached 1.6.18 drops mg's EN, the HD of ms and md, and the HD or VA of ma
// (unless N created the item); every other answer (mg's hits, NF, NS, EX, errors, MN) is
// still written.
func MetaSuppressed(req *Request, resp *Response) bool {
	if !req.Meta.Quiet || resp.Meta.Vivified {
		return false
	}
	code := metaCodeOf(req, resp)
	switch req.Op {
	case OpMetaGet:
		return code == MetaEN
	case OpMetaSet, OpMetaDelete:
		return code == MetaHD
	case OpMetaArithmetic:
		return code == MetaHD || code == MetaVA
	}
	return false
}

// metaBase64 is memcached's base64 alphabet decoding table: 0xff marks a byte that is not
// part of the alphabet (skipped, as memcached skips it); '=' decodes as 0 and counts as
// padding.
var metaBase64 = func() (t [256]byte) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for i := range t {
		t[i] = 0xff
	}
	for i := 0; i < len(alphabet); i++ {
		t[alphabet[i]] = byte(i)
	}
	t['='] = 0
	return t
}()

// MetaDecodeKey decodes a b-flag key as memcached 1.6.18 does, appending to dst: bytes
// outside the alphabet are ignored, the alphabet bytes must come in groups of four, and
// decoding stops after the first group with padding. ok is false where memcached answers
// "error decoding key" (nothing decoded, or bad padding).
func MetaDecodeKey(dst, src []byte) (out []byte, ok bool) {
	n := 0
	for _, c := range src {
		if metaBase64[c] != 0xff {
			n++
		}
	}
	if n == 0 || n%4 != 0 {
		return dst, false
	}
	start := len(dst)
	var block [4]byte
	pad, k := 0, 0
	for _, c := range src {
		v := metaBase64[c]
		if v == 0xff {
			continue
		}
		if c == '=' {
			pad++
		}
		block[k] = v
		k++
		if k < 4 {
			continue
		}
		k = 0
		dst = append(dst, block[0]<<2|block[1]>>4, block[1]<<4|block[2]>>2, block[2]<<6|block[3])
		if pad > 0 {
			if pad > 2 {
				return dst[:start], false
			}
			dst = dst[:len(dst)-pad]
			break
		}
	}
	if len(dst) == start {
		return dst, false
	}
	return dst, true
}
