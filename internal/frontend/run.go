package frontend

import (
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/walk"
)

// Assembling what the reader decoded into tasks: binary quiet gets into one multi-key get,
// pipelined single-key requests into runs, each answered as one.

// batchable reports whether the request just read is a binary quiet get (getq, getkq):
// clients pipeline those (libmemcached's binary mget sends getkq… and a noop), and moxi
// answers a run of them as one multi-key get, one batch per server instead of a round
// trip per key.
func (c *conn) batchable() bool {
	return c.binary && c.req.Op == protocol.OpGet && c.req.Quiet
}

// addToBatch keeps the request just read: its key is copied, since the decoder reuses its
// buffers for the next one.
func (c *conn) addToBatch() {
	r := c.req
	start := len(c.batchKeys)
	c.batchKeys = append(c.batchKeys, r.Keys[0]...)
	r.Keys = nil
	c.batch = append(c.batch, r)
	c.batchKeyEnds = append(c.batchKeyEnds, [2]int{start, len(c.batchKeys)})
}

// startBatch starts the quiet gets kept by addToBatch as one task, a multi-key get whose
// answers keep each request's own opaque, key and quiet rules.
func (c *conn) startBatch() {
	if len(c.batch) == 0 {
		return
	}
	walk.Step()
	t := c.s.getTask()
	t.batch = append(t.batch, c.batch...)
	for _, e := range c.batchKeyEnds {
		t.keys = append(t.keys, c.batchKeys[e[0]:e[1]:e[1]])
	}
	t.req = protocol.Request{Op: protocol.OpGet, Keys: t.keys, Binary: true}
	clear(c.batch)
	c.batch, c.batchKeys, c.batchKeyEnds = c.batch[:0], c.batchKeys[:0], c.batchKeyEnds[:0]
	c.start(t)
}

// runnable reports whether the request just read may join a run (see addToRun): a write,
// a get/gets of one key (binary quiet gets have their own batch, see batchable), or a meta
// command with a key.
func (c *conn) runnable() bool {
	r := &c.req
	return r.Op.IsWrite() || (r.Op == protocol.OpGet || r.Op == protocol.OpGets) && len(r.Keys) == 1 && !r.Quiet ||
		r.Op.IsMeta() && r.Op != protocol.OpMetaNoop
}

// addToRun adds the request just read to the run being read. A client that pipelines
// single-key requests (pymemcache's set_many, libmemcached's quiet sets, a Java client's
// threads sharing one connection) gets them sent to each server as one batch
// (Handler.Handle), and answered together.
func (c *conn) addToRun() {
	if c.building == nil {
		c.building = c.s.getTask()
		c.building.single = true
		c.building.firstByte = c.reqStarted // a run's is its first request's
	}
	t := c.building
	t.batch = append(t.batch, c.req) // in place from here on: a request is hundreds of bytes
	r := &t.batch[len(t.batch)-1]
	if r.Op.IsRetrieval() || r.Op == protocol.OpMetaGet {
		t.valueKeys++
	}
	if r.Op.IsMeta() {
		// Its flags and key token too point into the decoder's buffers: copied with it.
		t.ownMeta(r)
		t.spans = append(t.spans, span{owned: true})
		return
	}
	key := r.Key
	if r.Op.IsRetrieval() {
		key = r.Keys[0]
	}
	// The bytes are copied, since the decoder reuses its buffers; the request points at
	// them when the run starts, once data no longer moves as it grows.
	t.spans = append(t.spans, span{at: len(t.data), key: len(key), value: len(r.Value)})
	t.data = append(t.data, key...)
	t.data = append(t.data, r.Value...)
	r.Key, r.Value, r.Keys, r.Args = nil, nil, nil, nil
}

// startRun starts the run kept by addToRun as one task.
func (c *conn) startRun() {
	t := c.building
	if t == nil {
		return
	}
	walk.Step()
	c.building = nil
	t.keys = t.keys[:0]
	for _, sp := range t.spans {
		k := sp.at + sp.key
		t.keys = append(t.keys, t.data[sp.at:k:k])
	}
	for i, sp := range t.spans {
		r := &t.batch[i]
		if sp.owned {
			continue
		}
		if r.Op.IsRetrieval() {
			r.Keys = t.keys[i : i+1 : i+1]
		} else {
			k, v := sp.at+sp.key, sp.at+sp.key+sp.value
			r.Key, r.Value = t.keys[i], t.data[k:v:v]
		}
	}
	c.start(t)
}

// answerFits reports whether a run of gets may take one more key: within the keys whose
// answers may be in flight at once (maxUnknownKeys), and within the connection's bound at
// its estimate per key, so that a run, answered as one, is not itself an answer past the
// bound. (A multi-key get is answered in parts instead, see stream.)
func (c *conn) answerFits(keys int) bool {
	b := c.s.MaxConnectionBytes
	return b <= 0 || keys+1 <= c.s.maxUnknownKeys() && int64(keys+1)*c.acct.perKey.Load() <= int64(b)
}
