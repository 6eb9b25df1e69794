package proxy

import (
	"context"
	"strconv"
	"sync/atomic"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// write answers any single-key command but a retrieval: a set, add, replace, append,
// prepend, cas, delete, incr, decr or touch. Writes of fire-and-forget keys are answered at
// once and sent in the background; every other write is answered when its server has.
// Either way the key's hot cache entry and shared fetches end before the answer.
func (p *Proxy) write(ctx context.Context, t *topology.Topology, req *protocol.Request, one []protocol.Response) {
	key, resp := req.Key, &one[0]
	// From here until the answer, reads of key neither join a fetch already in flight nor
	// lead one that others join: such a fetch may reach the server before this write
	// does, and a read sent after the write (a pipelined "set k; get k") must see it.
	p.writes.begin(key)
	defer p.writes.end(key)
	p.settle(t, key)
	if req.Op.IsStorage() && req.Op != protocol.OpCas && t.InBackground(key) {
		if err := p.queue.Enqueue(ctx, req); err != nil {
			*resp = protocol.Response{Status: protocol.StatusTempFailure, Msg: "fire-and-forget: " + err.Error()}
			return
		}
		*resp = protocol.Response{} // STORED, before the server has seen it: that is the point
		p.settle(t, key)
		return
	}
	pl := t.PoolFor(key)
	p.do(ctx, pl, key, req, one)
	p.settle(t, key)
	if b := t.Backups[pl]; b != nil && mirrored(req.Op) {
		p.mirror(b, req, resp)
	}
}

// settle ends what moxi holds of key's old value once a write of it is acknowledged: its
// hot cache entry, and any fetch of it in flight, which later reads must not join.
func (p *Proxy) settle(t *topology.Topology, key []byte) {
	if t.Hot.Hot(key) {
		t.Hot.Drop(key)
	}
	if t.Dedup {
		p.flights.Forget(key)
	}
}

// writeQueued sends a fire-and-forget write on, through the topology running now, and
// settles the key again once it has landed.
func (p *Proxy) writeQueued(ctx context.Context, req *protocol.Request) error {
	t := p.topo.Load()
	pl := t.PoolFor(req.Key)
	var resp [1]protocol.Response
	p.do(ctx, pl, req.Key, req, resp[:])
	p.settle(t, req.Key)
	if b := t.Backups[pl]; b != nil {
		p.mirror(b, req, &resp[0])
	}
	if resp[0].Status != protocol.StatusOK {
		return &statusError{resp[0]}
	}
	return nil
}

// statusError is a fire-and-forget write the server did not store.
type statusError struct{ resp protocol.Response }

func (e *statusError) Error() string {
	if e.resp.Msg != "" {
		return e.resp.Msg
	}
	return "not stored (status " + strconv.Itoa(int(e.resp.Status)) + ")"
}

// writeStripes counts the writes in flight by stripe of their key, so that reads of a key
// being written do not share fetches (see write). A stripe shared by other keys only costs
// those keys their sharing for a moment.
type writeStripes [256]atomic.Int32

func stripe(key []byte) int {
	h := uint32(2166136261) // FNV-1a
	for _, c := range key {
		h = (h ^ uint32(c)) * 16777619
	}
	return int(h % 256)
}

func (w *writeStripes) begin(key []byte)         { w[stripe(key)].Add(1) }
func (w *writeStripes) end(key []byte)           { w[stripe(key)].Add(-1) }
func (w *writeStripes) inFlight(key []byte) bool { return w[stripe(key)].Load() != 0 }
