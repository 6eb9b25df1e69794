package backend

import (
	"bytes"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// call is one client request on its way to the server: the packets it needs, and the
// answers as they arrive. The caller fills it, a conn owns it from enqueue until complete,
// then the caller reads it. A call whose caller gave up (abandon) stays with the conn, which
// drops the late answer: the opaques stay in step and no other caller sees it.
type call struct {
	// Set by the caller before enqueue.
	req   *protocol.Request  // valid only during Server.Do, read only while encoding
	batch []protocol.Request // or a batch of single-key requests (DoBatch), valid as long
	keys  [][]byte           // retrieval: distinct keys in first-seen order
	index []int              // retrieval: req.Keys[i] is keys[index[i]]
	seen  map[string]int     // retrieval: keys' positions, once there are many
	n     uint32             // opaques the call spans: one per packet that may be answered
	stats bool               // a stat answer: many packets with one opaque

	// Owned by the conn between enqueue and complete.
	base  uint32              // first opaque
	resps []protocol.Response // one per opaque; a batch's last is its noop
	err   error               // the connection failed before the answer arrived

	sent     atomic.Int64  // Server.clock when the conn finished writing the call's packets; 0 until then
	state    atomic.Int32  // callWaiting → callDone or callAbandoned, once
	done     chan struct{} // receives once when state becomes callDone
	timer    *time.Timer   // the caller's timeout
	orphaned bool          // caller only: abandoned, so never returned to the pool
}

const (
	callWaiting int32 = iota
	callDone
	callAbandoned
)

func newCall() *call {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{done: make(chan struct{}, 1), timer: t}
}

func (cl *call) reset() {
	clear(cl.keys)
	clear(cl.resps)
	clear(cl.seen)
	*cl = call{keys: cl.keys[:0], index: cl.index[:0], seen: cl.seen, resps: cl.resps[:0], done: cl.done, timer: cl.timer}
}

// prepareSingle readies a call for any request but a retrieval: one packet, one answer.
func (cl *call) prepareSingle(req *protocol.Request) {
	cl.req = req
	cl.n = 1
	cl.stats = req.Op == protocol.OpStats
	cl.resps = append(cl.resps, protocol.Response{})
}

// prepareBatch readies a batch of single-key requests: a packet each, and a noop after
// them when some go quiet (see quietly), whose answer says the server has answered them all.
func (cl *call) prepareBatch(reqs []protocol.Request) {
	cl.batch = reqs
	cl.n = uint32(len(reqs))
	quiet := false
	for i := range reqs {
		cl.resps = append(cl.resps, protocol.Response{}) // a quiet success stays OK
		quiet = quiet || quietly(&reqs[i])
	}
	if quiet {
		cl.n++
		cl.resps = append(cl.resps, protocol.Response{})
	}
}

// prepareRetrieval readies a get/gets/gat/gats: one plain get for a single key, else a quiet
// get per distinct key and a noop whose answer says the server has answered them all.
func (cl *call) prepareRetrieval(req *protocol.Request) {
	cl.req = req
	for _, k := range req.Keys {
		cl.index = append(cl.index, cl.indexOf(k))
	}
	cl.n = uint32(len(cl.keys))
	if cl.n > 1 {
		cl.n++ // the noop
	}
	for range cl.n {
		cl.resps = append(cl.resps, protocol.Response{Status: protocol.StatusNotFound})
	}
}

// indexOf finds k among the distinct keys, adding it when new. Most batches are small, and
// a scan of a short one beats hashing; past smallBatch keys a map takes over.
func (cl *call) indexOf(k []byte) int {
	if len(cl.keys) < smallBatch {
		for i, x := range cl.keys {
			if bytes.Equal(x, k) {
				return i
			}
		}
	} else {
		if cl.seen == nil {
			cl.seen = make(map[string]int, 2*smallBatch)
		}
		if len(cl.seen) == 0 {
			for i, x := range cl.keys {
				cl.seen[string(x)] = i
			}
		}
		if i, ok := cl.seen[string(k)]; ok {
			return i
		}
		cl.seen[string(k)] = len(cl.keys)
	}
	cl.keys = append(cl.keys, k)
	return len(cl.keys) - 1
}

const smallBatch = 32

// encode appends the call's packets, numbered from base.
func (cl *call) encode(dst []byte, base uint32) []byte {
	cl.base = base
	if cl.batch != nil {
		for i := range cl.batch {
			dst = encodeSingle(dst, &cl.batch[i], base+uint32(i), quietly(&cl.batch[i]))
		}
		if int(cl.n) > len(cl.batch) {
			noop := protocol.Request{Op: protocol.OpNoop, Opaque: base + cl.n - 1}
			dst = protocol.AppendBinaryRequest(dst, &noop)
		}
		return dst
	}
	req := cl.req
	if !req.Op.IsRetrieval() {
		return encodeSingle(dst, req, base, false)
	}
	var one [1][]byte
	out := protocol.Request{Op: req.Op, Exptime: req.Exptime, Keys: one[:]}
	if len(cl.keys) == 1 {
		one[0], out.Opaque = cl.keys[0], base
		return protocol.AppendBinaryRequest(dst, &out)
	}
	out.Quiet = true
	for i, k := range cl.keys {
		one[0], out.Opaque = k, base+uint32(i)
		dst = protocol.AppendBinaryRequest(dst, &out)
	}
	noop := protocol.Request{Op: protocol.OpNoop, Opaque: base + cl.n - 1}
	return protocol.AppendBinaryRequest(dst, &noop)
}

// casZero reports a text "cas k … 0", which compares with 0, which no item has: EXISTS when
// k exists, NOT_FOUND when not, and k untouched. In the binary protocol a cas of 0 means
// "do not compare", so the server is asked whether k exists instead (see answerSingle).
func casZero(req *protocol.Request) bool {
	return req.Op == protocol.OpCas && req.Cas == 0
}

// quietly reports whether a write in a batch is sent quiet: the client does not see its
// success (a binary quiet command, a text noreply), so only a failure need come back.
func quietly(req *protocol.Request) bool {
	return (req.Quiet || req.NoReply) && !casZero(req)
}

// encodeSingle appends the packet of a single-key request, as opaque.
func encodeSingle(dst []byte, req *protocol.Request, opaque uint32, quiet bool) []byte {
	if casZero(req) {
		var one [1][]byte
		one[0] = req.Key
		return protocol.AppendBinaryRequest(dst, &protocol.Request{Op: protocol.OpGet, Keys: one[:], Opaque: opaque})
	}
	out := *req
	out.Opaque, out.Quiet, out.WithKey = opaque, quiet, false
	return protocol.AppendBinaryRequest(dst, &out)
}

// answerSingle is the client's answer to a single-key request, from the server's answer
// to its packet.
func answerSingle(req *protocol.Request, got *protocol.Response) protocol.Response {
	if casZero(req) {
		r := protocol.Response{Status: got.Status, Msg: got.Msg}
		if r.Status == protocol.StatusOK {
			r.Status = protocol.StatusExists
		}
		return r
	}
	return *got
}

// answer copies the answers into the caller's responses, in the caller's key order.
func (cl *call) answer(req *protocol.Request, resps []protocol.Response) {
	if !req.Op.IsRetrieval() {
		resps[0] = answerSingle(req, &cl.resps[0])
		return
	}
	for i, k := range req.Keys {
		resps[i] = cl.resps[cl.index[i]]
		resps[i].Key = k
	}
}

// complete hands the finished call to its caller, unless the caller has given up.
func (cl *call) complete() {
	if cl.state.CompareAndSwap(callWaiting, callDone) {
		cl.done <- struct{}{}
	}
}

// abandon gives the call up; false means it was answered first.
func (cl *call) abandon() bool {
	return cl.state.CompareAndSwap(callWaiting, callAbandoned)
}
