package proxy

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
	"github.com/moxi-proxy/moxi/internal/writeguard"
)

// beginWrite and endWrite are the rules of every write of key (write, meta, run, Start,
// writeQueued), begun before it is sent and ended once it is answered. In between, reads
// of key neither join a fetch already in flight nor lead one that others join: such a
// fetch may reach the server before the write does, and a read sent after the write (a
// pipelined "set k; get k") must see it. At both ends, what moxi holds of the key's old
// value goes (settle).
func (p *Proxy) beginWrite(t *topology.Topology, key []byte) {
	p.writes.Begin(key)
	p.settle(t, key)
}

// endWrite, once the server acknowledged the write, settles it (acknowledged), then ends it.
func (p *Proxy) endWrite(t *topology.Topology, key []byte) {
	p.acknowledged(t, key)
	p.writes.End(key)
}

// acknowledged is endWrite but for the write's end in the guard, which a run's writes
// reach together (beginWrites, startedRun.complete). It also tells the peers
// (hot_cache.peers) of a key their hot caches may hold: right after the acknowledgement,
// not before, since a peer that dropped the key before the write landed could fetch the
// old value again.
func (p *Proxy) acknowledged(t *topology.Topology, key []byte) {
	if pl, hot := p.settle(t, key); hot {
		p.metrics.invalidations[invalidatedLocally].Inc()
		if p.opts.Peers != nil {
			p.opts.Peers.Invalidate(pl.Name(), key)
		}
	} else if p.opts.Peers != nil && t.AbsorbHot {
		// A peer may find the key hot when this proxy does not (its readers are elsewhere).
		p.opts.Peers.Invalidate(t.PoolFor(key).Name(), key)
	}
}

// beginWrites is beginWrite of each write of reqs, a run, whose marks it appends to marks:
// the run's writes end together by them, once its answers are on their way
// (startedRun.complete). A write that ends a little later costs its key's reads their
// sharing of fetches and its copies for that moment; it answers no client later.
func (p *Proxy) beginWrites(t *topology.Topology, reqs []protocol.Request, marks []writeguard.Mark) []writeguard.Mark {
	first := len(marks)
	for i := range reqs {
		if req := &reqs[i]; req.Op.ChangesKey() {
			marks = append(marks, writeguard.MarkOf(req.Key))
		}
	}
	if len(marks) == first {
		return marks
	}
	p.writes.BeginMarks(marks[first:])
	if !p.settles(t) {
		return marks
	}
	for i := range reqs {
		if req := &reqs[i]; req.Op.ChangesKey() {
			p.settle(t, req.Key)
		}
	}
	return marks
}

// settles reports whether writes on t have anything to settle (settle, acknowledged): a
// hot cache, fetches in flight that a write must make unjoinable, or peers to tell. A run
// asks once for all its writes, once they have begun (or been acknowledged): a fetch that
// starts after it cannot be joined by a read that follows the write (see dedup.Forget).
func (p *Proxy) settles(t *topology.Topology) bool {
	return t.Hot != nil || t.Dedup && !p.flights.Idle() || p.opts.Peers != nil && t.AbsorbHot
}

// inBackground reports whether req is a fire-and-forget write: answered at once, written
// in the background.
func inBackground(t *topology.Topology, req *protocol.Request) bool {
	return req.Op.IsStorage() && req.Op != protocol.OpCas && t.InBackground(req.Key)
}

// enqueue queues a fire-and-forget write and answers it: STORED, before the server has
// seen it (that is the point). A full queue makes it wait for room (back-pressure); it
// answers SERVER_ERROR only when the client's context ends first (shutdown).
func (p *Proxy) enqueue(ctx context.Context, req *protocol.Request) protocol.Response {
	if err := p.queue.Enqueue(ctx, req); err != nil {
		return protocol.Response{Status: protocol.StatusTempFailure, Msg: "fire-and-forget: " + err.Error()}
	}
	return protocol.Response{}
}

// run answers a run of pipelined single-key requests — writes, and get/gets of one key —
// resps[i] for reqs[i] (len(resps) == len(reqs)), each as handleOne would, but sends
// each server its share of the run as one batch (pool.DoBatch): a client's
// pipelined requests cost a round trip per server, not one each. The shares go out in
// parallel; a request that got no answer is retried on its own. A run with a key of the
// hot cache is answered by handleOne, one request after the other, in order. (What a pool's
// features and failover add to each request is its servers' business: packages route and
// pool.)
func (p *Proxy) run(ctx context.Context, order *turn.Turn, t *topology.Topology, reqs []protocol.Request, resps []protocol.Response) {
	start := time.Now()
	b := getWriteBatch()
	if !b.group(t, reqs) {
		putWriteBatch(b)
		each, done := order.Defer() // the turn is given on when the run is done
		defer done()
		for i := range reqs {
			if !p.startAndWait(ctx, each, t, reqs[i:i+1], resps[i:i+1]) {
				p.handleOne(ctx, each, t, &reqs[i], resps[i:i+1])
			}
		}
		return
	}
	r := getStartedRun()
	r.marks = p.beginWrites(t, reqs, r.marks)
	for i := range reqs {
		if req := &reqs[i]; req.Op.ChangesKey() && inBackground(t, req) {
			resps[i] = p.enqueue(ctx, req)
		}
	}
	// The rest as Start sends a run, this goroutine waiting for its end.
	answered := make(chan struct{})
	r.p, r.ctx, r.order, r.t, r.reqs, r.resps, r.begun, r.done = p, ctx, order, t, reqs, resps, start, func() { close(answered) }
	for range reqs {
		r.errs = append(r.errs, nil)
	}
	r.startShares(b)
	<-answered
}

// endRun settles and counts a run's answers, which took seconds: each get's answer names
// its key, each write's key is settled (endWrite), the requests are counted in pl, added
// once (tally), or when the run spans pools (pl nil) each in its key's; the time of a run
// of one pool, once.
func (p *Proxy) endRun(t *topology.Topology, pl *pool.Pool, reqs []protocol.Request, resps []protocol.Response, seconds float64) {
	var n tally
	settles := p.settles(t)
	for i := range reqs {
		req := &reqs[i]
		switch {
		case req.Op.IsRetrieval():
			resps[i].Key = req.Keys[0]
		case req.Op.ChangesKey() && settles:
			p.acknowledged(t, req.Key) // and ended by the run's marks (startedRun.complete)
		}
		if pl == nil {
			p.account(t, t.PoolFor(runKey(req)), req, resps[i:i+1], seconds)
			continue
		}
		p.note(t, pl, req, resps[i:i+1], &n)
	}
	if pl != nil && len(reqs) > 0 {
		p.metrics.answered(p.add(pl, &n), len(reqs), seconds)
	}
}

// runKey is the key of a request of a run: a retrieval's one key, or a write's.
func runKey(req *protocol.Request) []byte {
	if req.Op.IsRetrieval() {
		return req.Keys[0]
	}
	return req.Key
}

// writeBatch is a run of single-key requests grouped by the member that serves them.
type writeBatch struct {
	shares []writeShare
	parts  []pool.Part // a part per share, for pool.DoParts
}

// group puts each request of the run in its member's share, but a fire-and-forget write,
// which goes to the queue. It reports false, with the shares incomplete, when the run must
// go one request at a time (see run).
func (b *writeBatch) group(t *topology.Topology, reqs []protocol.Request) bool {
	for i := range reqs {
		req := &reqs[i]
		key := runKey(req)
		pl := t.PoolFor(key)
		if req.Op.IsRetrieval() {
			if t.HotKey(pl, key) {
				return false
			}
		} else if inBackground(t, req) {
			continue
		}
		b.add(pl, pl.Member(pl.Locate(key)), i)
	}
	return true
}

// writeShare is one member's share of a run.
type writeShare struct {
	pool   *pool.Pool
	member *pool.Member
	idx    []int // the writes' places in the run
	reqs   []protocol.Request
	resps  []protocol.Response
	errs   []error
}

var writeBatches = sync.Pool{New: func() any { return new(writeBatch) }}

func getWriteBatch() *writeBatch { return writeBatches.Get().(*writeBatch) }

func putWriteBatch(b *writeBatch) {
	for i := range b.shares {
		sh := &b.shares[i]
		clear(sh.reqs)
		clear(sh.resps)
		clear(sh.errs)
		*sh = writeShare{idx: sh.idx[:0], reqs: sh.reqs[:0], resps: sh.resps[:0], errs: sh.errs[:0]}
	}
	clear(b.parts)
	if len(b.shares) > 16 { // a run over many servers: do not pin its slices
		b.shares, b.parts = nil, nil
	}
	b.shares, b.parts = b.shares[:0], b.parts[:0]
	writeBatches.Put(b)
}

// add puts the write at i in its member's share. A run has few members: a linear scan
// beats a map.
func (b *writeBatch) add(pl *pool.Pool, m *pool.Member, i int) {
	s := 0
	for s < len(b.shares) && b.shares[s].member != m {
		s++
	}
	if s == len(b.shares) {
		if s < cap(b.shares) {
			b.shares = b.shares[:s+1]
		} else {
			b.shares = append(b.shares, writeShare{})
		}
		b.shares[s].pool, b.shares[s].member = pl, m
	}
	b.shares[s].idx = append(b.shares[s].idx, i)
}

// part is the share as a part of the run, its requests copied out of reqs; sendShares
// places its answers in resps.
func (sh *writeShare) part(reqs []protocol.Request, resps []protocol.Response) pool.Part {
	sh.reqs, sh.resps, sh.errs = sh.reqs[:0], sh.resps[:0], sh.errs[:0]
	for range sh.idx {
		sh.errs = append(sh.errs, nil)
	}
	if len(sh.idx) == len(reqs) { // the whole run: no copies
		return pool.Part{Server: sh.member.Server, Reqs: reqs, Resps: resps, Errs: sh.errs}
	}
	for _, i := range sh.idx {
		sh.reqs = append(sh.reqs, reqs[i])
		sh.resps = append(sh.resps, protocol.Response{})
	}
	return pool.Part{Server: sh.member.Server, Reqs: sh.reqs, Resps: sh.resps, Errs: sh.errs}
}

// settle ends what moxi holds of key's old value once a write of it is acknowledged: its
// hot cache entry, and any fetch of it in flight, which later reads must not join. It
// reports key's pool when the key is one the hot cache holds (hot).
func (p *Proxy) settle(t *topology.Topology, key []byte) (pl *pool.Pool, hot bool) {
	if t.Hot == nil && !t.Dedup {
		return nil, false
	}
	pl = t.PoolFor(key)
	space := pl.Name()
	if hot = t.HotKey(pl, key); hot {
		t.Hot.Drop(space, key)
	}
	if t.Dedup {
		p.flights.Forget(space, key)
	}
	return pl, hot
}

// Invalidate ends what this proxy holds of key of the pool named pool as a write of it
// through this proxy would (POST /invalidate, a peer's write): the key's epoch moves, so
// that a fetch begun before cannot fill the hot cache with the old value, and its entry
// and fetches in flight go.
func (p *Proxy) Invalidate(pool string, key []byte) {
	t := p.Topology()
	p.writes.Begin(key)
	p.drop(t, pool, key)
	p.writes.End(key)
	p.drop(t, pool, key)
	p.metrics.invalidations[invalidatedByPeer].Inc()
}

// FlushHot empties the hot cache and ends every fetch in flight, as a flush_all through
// this proxy does (POST /invalidate, a peer's flush_all).
func (p *Proxy) FlushHot() {
	if t := p.Topology(); t.Hot != nil {
		t.Hot.Purge()
	}
	p.flights.ForgetAll()
	p.metrics.invalidations[invalidatedByPeer].Inc()
}

// drop is settle for a key of a named pool.
func (p *Proxy) drop(t *topology.Topology, pool string, key []byte) {
	if t.Hot != nil {
		t.Hot.Drop(pool, key)
	}
	p.flights.Forget(pool, key)
}

// writeQueued sends a fire-and-forget write on, through the topology running now, and
// settles the key again once it has landed.
func (p *Proxy) writeQueued(ctx context.Context, req *protocol.Request) error {
	t := p.Topology()
	pl := t.PoolFor(req.Key)
	var resp [1]protocol.Response
	p.beginWrite(t, req.Key)
	p.do(ctx, nil, pl, req.Key, req, resp[:]) // in the background: no client's order
	p.endWrite(t, req.Key)
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
