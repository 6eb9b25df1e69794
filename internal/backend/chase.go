package backend

import (
	"bytes"
	"encoding/base64"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// chase follows cl, a write the server did not answer in time, with a delete of its keys on
// the socket it was written to, when that socket is still open. memcached executes one
// connection's requests in order, so a write that lands late (a paused server resumed, a
// stalled network) is deleted right after it lands, before any other request can find
// it: a late write never outlives the write that followed it elsewhere. A write whose
// socket has closed since is left to the failover memory's cleanup (the replica owes the
// key), which docs/operating.md bounds.
//
// The delete is moxi's own: nobody waits for it, no watch times it out (it ends with its
// connection if the server never answers), and its answer counts in no client's figures.
func (s *Server) chase(cl *call) {
	dels := chaseOf(cl)
	if len(dels) == 0 || !s.tryAcquire() {
		return // nothing to chase, or no room: the failover memory's cleanup stands
	}
	ch := s.getCall()
	if cl.meta {
		ch.prepareMeta(dels)
	} else {
		ch.prepareBatch(dels)
	}
	ch.chase = true
	ch.begun, ch.on = time.Now(), cl.on
	ch.refs.Store(2)
	if !cl.on.enqueueOn(cl.via, ch) {
		s.release()
		s.putCall(ch)
		return
	}
	cl.on.flush()
	ch.unref()
}

// chaseOf is the deletes that chase a call's writes: one per request that stores or counts
// (a late delete or touch needs none), its key copied, for the connection's kind.
func chaseOf(cl *call) []protocol.Request {
	reqs := cl.batch
	if cl.req != nil {
		reqs = []protocol.Request{*cl.req}
	}
	var dels []protocol.Request
	for i := range reqs {
		r := &reqs[i]
		if !chased(r.Op) {
			continue
		}
		key := bytes.Clone(r.Key)
		if !cl.meta {
			dels = append(dels, protocol.Request{Op: protocol.OpDelete, Key: key})
			continue
		}
		del := protocol.Request{Op: protocol.OpMetaDelete, Key: key}
		del.Meta.KeyToken = key
		if r.Meta.Base64 {
			del.Meta.KeyToken = base64.StdEncoding.AppendEncode(nil, key)
			del.Meta.Base64 = true
			del.Meta.Flags = []protocol.MetaFlag{{Letter: 'b'}}
		}
		dels = append(dels, del)
	}
	return dels
}

// chased reports whether a request of op, landing late, leaves a value to delete.
func chased(op protocol.Op) bool {
	switch op {
	case protocol.OpSet, protocol.OpAdd, protocol.OpReplace, protocol.OpAppend, protocol.OpPrepend, protocol.OpCas,
		protocol.OpIncr, protocol.OpDecr, protocol.OpMetaSet, protocol.OpMetaArithmetic:
		return true
	}
	return false
}
