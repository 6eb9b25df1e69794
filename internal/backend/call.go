package backend

import (
	"bytes"
	"net"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/walk"
)

// call is one client request, or a batch of them, on its way to the server: the packets it
// needs, and the answers as they arrive. Server.Start fills it, a conn owns it from enqueue
// until complete, and whoever ends it — the conn that completes it, or its watch — finishes
// it (Server.finish): nobody waits for it. A call its conn's watch gave up (abandon) stays
// with the conn, which drops the late answer: the stream stays in step and no other request
// sees it.
//
// The same call travels on both kinds of connection (see conn): binary packets matched by
// opaque, or meta requests (meta true) matched in order.
type call struct {
	// Set by the caller before enqueue.
	req   *protocol.Request  // one request, read only while encoding and by finish
	batch []protocol.Request // or a run of single-key requests, read only while encoding and by finish
	keys  [][]byte           // retrieval: distinct keys in first-seen order
	index []int              // retrieval: req.Keys[i] is keys[index[i]]
	seen  map[string]int     // retrieval: keys' positions, once there are many
	n     uint32             // answers the call expects: one per packet or meta request that may be answered
	stats bool               // a stat answer: many packets with one opaque
	meta  bool               // batch is meta requests, for a meta connection
	mn    []bool             // meta: whether request i's answer is read through an mn (protocol.MetaThroughMN)

	// Owned by the conn between enqueue and complete.
	base  uint32              // first opaque
	got   uint32              // meta: answers received so far
	resps []protocol.Response // one per opaque, but for a run (batch), whose answers go to out (answerRun)
	err   error               // the connection failed before the answer arrived

	sent     atomic.Int64 // Server.clock when the conn finished writing the call's packets; 0 until then
	state    atomic.Int32 // callWaiting → callDone or callAbandoned, once
	orphaned bool         // abandoned, so never returned to the pool

	s       *Server
	then    func()              // the caller's done
	out     []protocol.Response // the caller's answers
	outErrs []error             // and errors
	count   int                 // the client requests it stands for
	chase   bool                // moxi's own delete after a late write (Server.chase): counted nowhere
	begun   time.Time
	on      *conn        // the connection it was queued on
	via     net.Conn     // on's socket when it was queued: a chase goes on that one only
	refs    atomic.Int32 // Server.send and the end of the call: the later finishes it
	result  error        // why it ended, set by whoever ended it
}

const (
	callWaiting int32 = iota
	callDone
	callAbandoned
)

func newCall(s *Server) *call { return &call{s: s} }

func (cl *call) reset() {
	clear(cl.keys)
	clear(cl.resps)
	clear(cl.seen)
	*cl = call{keys: cl.keys[:0], index: cl.index[:0], seen: cl.seen, mn: cl.mn[:0], resps: cl.resps[:0], s: cl.s}
}

// prepareMeta readies a batch of meta requests: each is sent as the client sent it, q aside
// (protocol.AppendMetaRequest), and answered once, in order.
func (cl *call) prepareMeta(reqs []protocol.Request) {
	cl.batch, cl.meta = reqs, true
	cl.n = uint32(len(reqs))
	for i := range reqs {
		cl.mn = append(cl.mn, protocol.MetaThroughMN(&reqs[i]))
	}
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
	for i := range reqs {
		if quietly(&reqs[i]) {
			cl.n++
			return
		}
	}
}

// answerRun places the answer to request i of a run (a batch, or meta requests) straight
// in the caller's answers, not in a copy of the call's own: a run of 100 would otherwise
// cost 16 KB written, copied and cleared again, in lines the other connections' work leaves
// cold. A batch's noop is nobody's answer, nor is a chase's (no out). The caller holds the
// conn's mu, under which the watch gives a call up (abandon): a call given up is the
// caller's no more, and its late answers are dropped.
func (cl *call) answerRun(i uint32, resp *protocol.Response) {
	if int(i) >= len(cl.out) || cl.state.Load() != callWaiting {
		return
	}
	if cl.meta {
		cl.out[i] = *resp
	} else {
		cl.out[i] = answerSingle(&cl.batch[i], resp)
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
	if cl.meta {
		for i := range cl.batch {
			dst = protocol.AppendMetaRequest(dst, &cl.batch[i])
		}
		return dst
	}
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
	if len(cl.keys) == 1 {
		return protocol.AppendBinaryRead(dst, req.Op, req.Exptime, cl.keys[0], base, false)
	}
	for i, k := range cl.keys {
		dst = protocol.AppendBinaryRead(dst, req.Op, req.Exptime, k, base+uint32(i), true)
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

// quietly reports whether a write in a batch is sent quiet: only a failure need come back
// when the client does not see its success (a binary quiet command, a text noreply), or
// sees nothing of it but the word (a text set's STORED, a delete's DELETED, which a quiet
// success answers as well). A batch of text sets then costs the server one answer, the
// batch's noop, instead of one each.
func quietly(req *protocol.Request) bool {
	if casZero(req) {
		return false
	}
	if req.Quiet || req.NoReply {
		return true
	}
	switch req.Op {
	case protocol.OpSet, protocol.OpAdd, protocol.OpReplace, protocol.OpAppend, protocol.OpPrepend, protocol.OpCas, protocol.OpDelete:
		return !req.Binary // a binary client's answer carries the new cas, which only a loud one gets
	}
	return false
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
	r := *got
	if req.Op.IsRetrieval() {
		r.Key = req.Keys[0] // a batch's gets are of one key each
	}
	return r
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

// complete finishes the call once it is answered (or its connection failed), unless its
// conn's watch gave it up first.
func (cl *call) complete() {
	walk.Step()
	if !cl.state.CompareAndSwap(callWaiting, callDone) {
		return
	}
	cl.result = cl.err
	cl.unref()
}

// timedOut ends a call its conn's watch gave up (abandon): a chase of its writes first,
// then its end with ErrTimeout. The conn still owns it and drops its late answer, so it is
// never reused.
func (cl *call) timedOut() {
	// Before the call ends: its end may mark the server dead, which closes on.
	cl.s.chase(cl)
	cl.orphaned = true
	cl.result = ErrTimeout
	cl.unref()
}

// unref drops one of the call's two references; the last finishes it.
func (cl *call) unref() {
	if cl.refs.Add(-1) == 0 {
		cl.s.finish(cl)
	}
}

// abandon gives the call up; false means it was answered first.
func (cl *call) abandon() bool {
	return cl.state.CompareAndSwap(callWaiting, callAbandoned)
}
