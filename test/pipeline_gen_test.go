package test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// pipeGen generates the random request pipelines of one stream of
// TestPipelineDifferential. The stream depends only on the seed and the stream's
// name, never on any answer, so the same bytes reach both targets.
//
// Every generated command is valid and interacts with the others through a small key space.
// Two memcached behaviours that depend on more than the commands are kept out on purpose:
//
//  1. memcached rewrites a number in place, padding it with spaces when the new one is
//     shorter ("10" decr 1 → "9 "), but only when nothing else holds a reference to the item
//     at that instant (refcount 2 in do_add_delta), otherwise it stores "9". Whether
//     something does depends on timing (a get response not yet written, possibly on another
//     connection), which differs between one memcached and moxi's backends.
//  2. memcached (1.6.18, as installed) rejects a number of 2^63 or more as non-numeric when
//     a '-' lies anywhere after it in memory before a NUL byte: safe_strtoull looks for a
//     minus sign with strchr over item data, which is not NUL-terminated. Whether decr of
//     "18446744073709551615" works depends on what follows the item in its slab; two plain
//     memcached disagreed on it within a few hundred pipelines.
//
// So incr/decr never shortens a number, and no value reaches 2^63:
//   - numbers are written canonically (no leading zero, sign or space), every other value
//     starts with a letter or with a number too large for 64 bits, so memcached never
//     parses one of them as a number;
//   - "up" keys (even index) are only incremented, with numbers below 10^12 and deltas
//     below 10^9;
//   - "down" keys (odd index) are only decremented, by at most 1000, and hold one-digit
//     numbers (they floor at "0"), numbers in [5e9, 9e9) or 2^63-1, none of which a few
//     thousand such decrements can shorten;
//   - appended data starts with a letter ("0" + "5" would give "05"); prepended data with a
//     letter or with 21 or more digits.
type pipeGen struct {
	rng  *rand.Rand
	keys []string
}

// pipeKeys is the size of a stream's key space: small, so that commands meet.
const pipeKeys = 40

// maxPipeline is the largest number of requests in one pipeline.
const maxPipeline = 60

// newPipeGen returns the generator of stream name (also the prefix of its keys, which keeps
// streams running side by side from touching each other's keys).
func newPipeGen(seed uint64, name string) *pipeGen {
	var h uint64 = 14695981039346656037 // FNV-1a of the name, to derive the stream's seed
	for i := range len(name) {
		h = (h ^ uint64(name[i])) * 1099511628211
	}
	g := &pipeGen{rng: rand.New(rand.NewPCG(seed, h))}
	for i := range pipeKeys {
		// Key lengths vary (up to ~100 bytes) so that parsers meet keys of many sizes.
		g.keys = append(g.keys, fmt.Sprintf("%s:%d:%s", name, i, strings.Repeat("k", i*i%97)))
	}
	return g
}

// pipeReq is one generated request.
type pipeReq struct {
	wire []byte
	// answers is how many text answer units (a line, or VALUE blocks up to END) the request
	// gets: 0 with noreply. Binary requests leave it 0; their pipeline ends with a noop.
	answers int
}

// size is a pipeline's length, 1 to maxPipeline: mostly short, 8 on average, so that
// 10,000 pipelines fit the time budget with a race-detector moxi (which answers some
// 6,000 requests a second on a busy 2-core machine).
func (g *pipeGen) size() int {
	switch n := g.rng.IntN(100); {
	case n < 55:
		return 1 + g.rng.IntN(4)
	case n < 90:
		return 5 + g.rng.IntN(8)
	}
	return 13 + g.rng.IntN(maxPipeline-12)
}

// key is any key; upKey and downKey are keys that may be incremented or decremented.
func (g *pipeGen) key() string     { return g.keys[g.rng.IntN(pipeKeys)] }
func (g *pipeGen) upKey() string   { return g.keys[2*g.rng.IntN(pipeKeys/2)] }
func (g *pipeGen) downKey() string { return g.keys[2*g.rng.IntN(pipeKeys/2)+1] }

// keyValue is any key with a value fit for it.
func (g *pipeGen) keyValue() (string, []byte) {
	i := g.rng.IntN(pipeKeys)
	return g.keys[i], g.value(i%2 == 0)
}

func (g *pipeGen) flags() uint32 {
	switch g.rng.IntN(4) {
	case 0, 1:
		return 0
	case 2:
		return uint32(g.rng.IntN(1000))
	}
	return g.rng.Uint32()
}

func (g *pipeGen) exptime() int64 {
	if g.rng.IntN(3) == 0 {
		return 86400 // relative, far beyond the test's end
	}
	return 0
}

func (g *pipeGen) pick(p int) bool { return g.rng.IntN(100) < p }

// length is a value length: mostly tiny, sometimes past a 4 KiB buffer.
func (g *pipeGen) length() int {
	switch n := g.rng.IntN(100); {
	case n < 70:
		return g.rng.IntN(33)
	case n < 95:
		return 33 + g.rng.IntN(480)
	}
	return 513 + g.rng.IntN(7680)
}

const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// word is 1+ bytes starting with a letter: alphanumeric, or any bytes (CR, LF, NUL...)
// after the letter.
func (g *pipeGen) word() []byte {
	b := []byte{alnum[g.rng.IntN(52)]}
	n, raw := g.length(), g.pick(30)
	for range n {
		if raw {
			b = append(b, byte(g.rng.IntN(256)))
		} else {
			b = append(b, alnum[g.rng.IntN(len(alnum))])
		}
	}
	return b
}

// upNumber and downNumber are canonical numbers for up and down keys (see pipeGen).
func (g *pipeGen) upNumber() uint64 {
	switch g.rng.IntN(3) {
	case 0:
		return uint64(g.rng.IntN(10))
	case 1:
		return uint64(g.rng.IntN(1_000_000))
	}
	return g.rng.Uint64N(1_000_000_000_000)
}

func (g *pipeGen) downNumber() uint64 {
	switch g.rng.IntN(3) {
	case 0:
		return uint64(g.rng.IntN(10))
	case 1:
		return 5_000_000_000 + g.rng.Uint64N(4_000_000_000)
	}
	return 1<<63 - 1
}

// value is a value to store under an up key or a down one: a number fit for it, a word,
// empty, or a number too large for 64 bits (which memcached calls non-numeric, whatever is
// done to it).
func (g *pipeGen) value(up bool) []byte {
	switch n := g.rng.IntN(100); {
	case n < 35:
		if up {
			return strconv.AppendUint(nil, g.upNumber(), 10)
		}
		return strconv.AppendUint(nil, g.downNumber(), 10)
	case n < 90:
		return g.word()
	case n < 95:
		return []byte{}
	}
	return []byte("18446744073709551616")
}

// prefix is data to prepend: a word, or digits too many for 64 bits, which leave any value
// non-numeric (a short number would make "5" + "12" numeric, and possibly above 2^63).
func (g *pipeGen) prefix() []byte {
	if g.pick(20) {
		b := []byte{'1' + byte(g.rng.IntN(9))}
		for range 20 + g.rng.IntN(5) {
			b = append(b, '0'+byte(g.rng.IntN(10)))
		}
		return b
	}
	return g.word()
}

func (g *pipeGen) delta(up bool) uint64 {
	if up && g.pick(10) {
		return g.rng.Uint64N(1_000_000_000)
	}
	return g.rng.Uint64N(1001)
}

// textPipeline is one pipeline of text requests.
func (g *pipeGen) textPipeline() []pipeReq {
	reqs := make([]pipeReq, g.size())
	for i := range reqs {
		reqs[i] = g.textRequest()
	}
	return reqs
}

func (g *pipeGen) textRequest() pipeReq {
	noreply := ""
	if g.pick(30) {
		noreply = " noreply"
	}
	line := func(format string, args ...any) pipeReq {
		r := pipeReq{wire: fmt.Appendf(nil, format, args...), answers: 1}
		if noreply != "" {
			r.wire = append(r.wire, noreply...)
			r.answers = 0
		}
		r.wire = append(r.wire, "\r\n"...)
		return r
	}
	store := func(cmd, k string, data []byte) pipeReq {
		r := line("%s %s %d %d %d", cmd, k, g.flags(), g.exptime(), len(data))
		r.wire = append(append(r.wire, data...), "\r\n"...)
		return r
	}
	switch n := g.rng.IntN(100); {
	case n < 16:
		return pipeReq{wire: []byte("get " + g.key() + "\r\n"), answers: 1}
	case n < 26:
		keys := make([]string, 2+g.rng.IntN(11)) // repeats allowed: each is answered
		for i := range keys {
			keys[i] = g.key()
		}
		return pipeReq{wire: []byte("get " + strings.Join(keys, " ") + "\r\n"), answers: 1}
	case n < 42:
		k, v := g.keyValue()
		return store("set", k, v)
	case n < 47:
		k, v := g.keyValue()
		return store("add", k, v)
	case n < 52:
		k, v := g.keyValue()
		return store("replace", k, v)
	case n < 58:
		return store("append", g.key(), g.word())
	case n < 64:
		return store("prepend", g.key(), g.prefix())
	case n < 73:
		return line("delete %s", g.key())
	case n < 83:
		return line("incr %s %d", g.upKey(), g.delta(true))
	case n < 93:
		return line("decr %s %d", g.downKey(), g.delta(false))
	}
	return line("touch %s %d", g.key(), g.exptime())
}

// finalOpaque marks the noop that ends every binary pipeline; other requests' opaques are
// below it.
const finalOpaque = 0xffffffff

// binaryPipeline is one pipeline of binary requests, ended by a noop with finalOpaque.
func (g *pipeGen) binaryPipeline() []pipeReq {
	reqs := make([]pipeReq, g.size(), maxPipeline+1)
	for i := range reqs {
		reqs[i] = g.binaryRequest()
	}
	noop := &protocol.Request{Op: protocol.OpNoop, Opaque: finalOpaque}
	return append(reqs, pipeReq{wire: protocol.AppendBinaryRequest(nil, noop)})
}

func (g *pipeGen) binaryRequest() pipeReq {
	req := &protocol.Request{Quiet: g.pick(40), Opaque: g.rng.Uint32N(finalOpaque)}
	store := func(op protocol.Op, k string, data []byte) {
		req.Op, req.Key, req.Value = op, []byte(k), data
		req.Flags, req.Exptime = g.flags(), g.exptime()
	}
	switch n := g.rng.IntN(100); {
	case n < 24:
		req.Op, req.Keys, req.WithKey = protocol.OpGet, [][]byte{[]byte(g.key())}, g.pick(50)
	case n < 40:
		k, v := g.keyValue()
		store(protocol.OpSet, k, v)
	case n < 45:
		k, v := g.keyValue()
		store(protocol.OpAdd, k, v)
	case n < 50:
		k, v := g.keyValue()
		store(protocol.OpReplace, k, v)
	case n < 56:
		store(protocol.OpAppend, g.key(), g.word())
	case n < 62:
		store(protocol.OpPrepend, g.key(), g.prefix())
	case n < 71:
		req.Op, req.Key = protocol.OpDelete, []byte(g.key())
	case n < 91:
		// Create (initial value, exptime 0) or not (exptime 0xffffffff).
		up := g.pick(50)
		req.Op, req.Key, req.Delta, req.Create = protocol.OpIncr, []byte(g.upKey()), g.delta(up), g.pick(50)
		req.Initial = g.upNumber()
		if !up {
			req.Op, req.Key, req.Initial = protocol.OpDecr, []byte(g.downKey()), g.downNumber()
		}
	case n < 97:
		req.Op, req.Key, req.Exptime = protocol.OpTouch, []byte(g.key()), g.exptime()
	default:
		req.Op = protocol.OpNoop
	}
	return pipeReq{wire: protocol.AppendBinaryRequest(nil, req)}
}
