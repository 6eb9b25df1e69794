package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/dedup"
	"github.com/moxi-proxy/moxi/internal/hotcache"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
	"github.com/moxi-proxy/moxi/internal/walk"
	"github.com/moxi-proxy/moxi/internal/writeguard"
)

// Start answers reqs as Handle does, without a goroutine waiting for it: a lone
// retrieval from the hot cache, the fetches of its keys others lead (dedup) and the
// servers; a run, or a lone single-key request, sent to its server as one batch
// (pool.Server.Start), or to each of its servers its share (pool.StartParts). Whoever
// finishes the last calls done, once. It reports false, having done nothing, for what only
// Handle answers: a request without a key (stats, flush_all, version…), a fire-and-forget
// write, a run with a hot-cache key.
func (p *Proxy) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, done func()) bool {
	return p.start(ctx, order, p.topology(""), reqs, resps, done)
}

// topology is the topology in service now for the clients of the listener at listener
// ("": the main one).
func (p *Proxy) topology(listener string) *topology.Topology {
	return p.topo.Load().Current().ForListener(listener)
}

// start is Start on t.
func (p *Proxy) start(ctx context.Context, order *turn.Turn, t *topology.Topology, reqs []protocol.Request, resps []protocol.Response, done func()) bool {
	walk.Step()
	pl, m, ok := startable(t, reqs)
	if !ok {
		return false
	}
	r := getStartedRun()
	r.p, r.ctx, r.order, r.t, r.pool, r.member, r.reqs, r.resps, r.begun, r.done = p, ctx, order, t, pl, m, reqs, resps, time.Now(), done
	for range reqs {
		r.errs = append(r.errs, nil)
	}
	if len(reqs) == 1 && reqs[0].Op.IsRetrieval() {
		r.lone = true
		r.startRetrieval()
		return true
	}
	r.marks = p.beginWrites(t, reqs, r.marks)
	if m != nil {
		m.Server.Start(ctx, order, reqs, resps, r.errs, r.finishFunc)
		return true
	}
	b := getWriteBatch()
	b.group(t, reqs)
	r.startShares(b)
	return true
}

// startRetrieval answers a lone get, gets, gat or gats: from the hot cache where it can,
// by following a fetch of the same key already in flight where dedup allows, and the rest
// from the servers. It leads the fetch of every key nobody else is fetching, publishes
// those once answered, and only then follows the keys others lead (end): since every
// request finishes what it leads before it follows, two requests leading each other's
// keys cannot wait for each other. A touch is neither served from the cache nor shared.
func (r *startedRun) startRetrieval() {
	p, t, req := r.p, r.t, &r.reqs[0]
	if touch := req.Op == protocol.OpGat || req.Op == protocol.OpGats; touch || t.Hot == nil && !t.Dedup {
		r.send(true)
		return
	}
	for i, k := range req.Keys {
		pl := r.poolOf(k)
		space := pl.Name()
		var kf keyFetch
		var hit bool
		hit, kf.hot, kf.ticket = p.hotLookup(t, pl, k, &r.resps[i])
		switch {
		case hit:
			kf.answered = true
		case t.Dedup && !p.writes.InFlight(k):
			var leader bool
			kf.flight, leader = p.flights.Start(space, k)
			kf.follows = !leader
		}
		r.fetches = append(r.fetches, kf)
		if kf.follows {
			r.follows++
		} else if !kf.answered {
			r.sendIdx = append(r.sendIdx, i)
		}
	}
	r.send(len(r.sendIdx) == len(req.Keys))
}

// send sends a lone retrieval's keys to their servers: every key (whole), or those at
// r.sendIdx, perhaps none (the turn is then given on at once).
func (r *startedRun) send(whole bool) {
	req := &r.reqs[0]
	r.whole = whole
	switch {
	case whole && r.member != nil:
		r.member.Server.Start(r.ctx, r.order, r.reqs, r.resps, r.errs, r.finishFunc)
		return
	case whole:
		r.shares = pool.GroupByMember(r.t.PoolFor, req.Keys, nil) // At: key indexes
	case len(r.sendIdx) == 0: // every key answered or followed: nothing to send
	default:
		r.shares = split(r.t.PoolFor, req.Keys, r.sendIdx)
	}
	for _, sh := range r.shares {
		r.parts = append(r.parts, pool.KeysPart(sh.Member.Server, req, sh.At, r.resps))
	}
	pool.StartParts(r.ctx, r.order, r.parts, r.gatherFunc)
}

// startShares sends a run whose keys several members serve, each member its share of b,
// the run grouped by member, which the run keeps until it ends.
func (r *startedRun) startShares(b *writeBatch) {
	r.batch = b
	for s := range r.batch.shares {
		r.batch.parts = append(r.batch.parts, r.batch.shares[s].part(r.reqs, r.resps))
	}
	pool.StartParts(r.ctx, r.order, r.batch.parts, r.gatherFunc)
}

// gather places the shares' answers once the last is in (send, startShares), notes the
// requests that got none, and finishes the run.
func (r *startedRun) gather() {
	if r.batch == nil {
		for i := range r.parts {
			part := &r.parts[i]
			part.Place(r.resps)
			if part.Errs[0] != nil {
				r.errs[0] = part.Errs[0]
				r.retryKeys = append(r.retryKeys, r.shares[i].At...)
			}
		}
	} else {
		whole := len(r.batch.shares) == 1
		for s := range r.batch.shares {
			sh := &r.batch.shares[s]
			for j, i := range sh.idx {
				if !whole {
					r.resps[i] = sh.resps[j]
				}
				r.errs[i] = sh.errs[j]
			}
		}
	}
	r.finish()
}

// startable reports whether Start may take a run, and the member that serves every key
// of it when one does (nil, with pl nil, when several do).
func startable(t *topology.Topology, reqs []protocol.Request) (pl *pool.Pool, m *pool.Member, ok bool) {
	seen, one := false, true
	take := func(key []byte) {
		kp := t.PoolFor(key)
		km := kp.Member(kp.Locate(key))
		switch {
		case !seen:
			pl, m, seen = kp, km, true
		case km != m:
			one = false
		}
	}
	for i := range reqs {
		req := &reqs[i]
		switch {
		case !req.Op.IsWrite() && !req.Op.IsMeta() && !req.Op.IsRetrieval(): // no key: flush_all, stats, version…
			return nil, nil, false
		case req.Op == protocol.OpMetaNoop, inBackground(t, req):
			return nil, nil, false
		case req.Op.IsRetrieval():
			for _, k := range req.Keys {
				if len(reqs) > 1 && t.Hot != nil && t.HotKey(t.PoolFor(k), k) {
					return nil, nil, false // a run one request at a time (run)
				}
				take(k)
			}
		default:
			take(req.Key)
		}
	}
	if !one {
		return nil, nil, true
	}
	return pl, m, true
}

// startedRun is a run Start sent, until it is answered.
type startedRun struct {
	p          *Proxy
	ctx        context.Context
	order      *turn.Turn // the run's turn, until it is dispatched (and for a retry's deferred dispatches)
	t          *topology.Topology
	pool       *pool.Pool   // of every key, nil when several members serve them
	member     *pool.Member // that serves every key, nil when several do
	reqs       []protocol.Request
	resps      []protocol.Response
	errs       []error
	lone       bool // reqs is one retrieval, resps its keys' answers
	begun      time.Time
	done       func()
	finishFunc func() // finish, made once per startedRun
	gatherFunc func() // gather, made once per startedRun
	followFunc func() // followed, made once per startedRun

	// Several members: a lone retrieval's shares (send) and the keys to fetch again, whose
	// share got no answer; or a run's (startShares).
	shares    []pool.Group
	parts     []pool.Part
	retryKeys []int
	batch     *writeBatch

	marks []writeguard.Mark // the run's writes, begun (beginWrites), ended by complete

	// A lone retrieval with the hot cache or dedup: fetches[i] for key i (empty without
	// either); the keys sent (sendIdx, unless whole: every key) and the number others
	// fetch, followed once those sent are answered (pending: still to come).
	fetches []keyFetch
	sendIdx []int
	whole   bool
	follows int
	pending atomic.Int32
}

// keyFetch is how a lone retrieval answers one of its keys.
type keyFetch struct {
	answered bool                             // from the hot cache
	follows  bool                             // from flight, which another request leads
	flight   *dedup.Flight[protocol.Response] // the fetch it leads or follows; nil: neither
	hot      bool                             // a hot-cache key it missed: cached once fetched
	ticket   hotcache.Ticket                  // for that
}

var startedRuns sync.Pool // of *startedRun

func getStartedRun() *startedRun {
	if r, ok := startedRuns.Get().(*startedRun); ok {
		return r
	}
	r := new(startedRun)
	r.finishFunc, r.gatherFunc, r.followFunc = r.finish, r.gather, r.followed
	return r
}

// release puts r back for the next run.
func (r *startedRun) release() {
	clear(r.errs)
	clear(r.fetches)
	clear(r.parts)
	if r.batch != nil {
		putWriteBatch(r.batch)
	}
	*r = startedRun{errs: r.errs[:0], fetches: r.fetches[:0], sendIdx: r.sendIdx[:0], parts: r.parts[:0], retryKeys: r.retryKeys[:0], marks: r.marks[:0],
		finishFunc: r.finishFunc, gatherFunc: r.gatherFunc, followFunc: r.followFunc}
	startedRuns.Put(r)
}

// space is the name of key's pool, by which its fetches are known (dedup).
func (r *startedRun) space(key []byte) string { return r.poolOf(key).Name() }

// poolOf is key's pool.
func (r *startedRun) poolOf(key []byte) *pool.Pool {
	if r.pool != nil {
		return r.pool
	}
	return r.t.PoolFor(key)
}

// finish ends the run once its server answered it or failed. A request that got no answer
// is tried again, which waits: that part runs on a goroutine of its own, since finish runs
// on the server connection's reader, which must not wait.
func (r *startedRun) finish() {
	for _, err := range r.errs {
		if err != nil {
			go r.retryAndEnd()
			return
		}
	}
	r.end()
}

func (r *startedRun) retryAndEnd() {
	p := r.p
	switch {
	case r.lone:
		var keys []int // nil: every key, all from one member
		if !r.whole || r.member == nil {
			keys = r.retryKeys
		}
		p.fanOut(r.ctx, r.order, r.t.PoolFor, &r.reqs[0], r.resps, keys)
	case r.batch != nil:
		for s := range r.batch.shares {
			sh := &r.batch.shares[s]
			for j, i := range sh.idx {
				p.recover(r.ctx, r.order, sh.pool, runKey(&r.reqs[i]), &r.reqs[i], r.resps[i:i+1], sh.member, sh.errs[j])
			}
		}
	default:
		for i, err := range r.errs {
			if err != nil {
				p.recover(r.ctx, r.order, r.pool, runKey(&r.reqs[i]), &r.reqs[i], r.resps[i:i+1], r.member, err)
			}
		}
	}
	r.end()
}

// end follows up what the run sent once it is answered: a lone retrieval publishes the
// fetches it led (caching hot keys) and then follows the fetches others lead; then the
// run completes.
func (r *startedRun) end() {
	if len(r.fetches) == 0 {
		r.complete()
		return
	}
	p, req := r.p, &r.reqs[0]
	for i := range r.fetches {
		if kf := &r.fetches[i]; !kf.answered && !kf.follows {
			k := req.Keys[i]
			r.resps[i].Key = k
			p.publish(r.t, r.poolOf(k), k, &r.resps[i], kf.hot, kf.ticket, kf.flight)
		}
	}
	if r.follows == 0 {
		r.complete()
		return
	}
	r.pending.Store(int32(r.follows))
	left := r.follows
	for i := range r.fetches {
		if kf := &r.fetches[i]; kf.follows {
			left--
			last := left == 0
			p.flights.Then(kf.flight, r.followFunc)
			if last {
				return // r may be complete and reused by now
			}
		}
	}
}

// followed takes one fetch another request led; the last completes the run.
func (r *startedRun) followed() {
	if r.pending.Add(-1) > 0 {
		return
	}
	req := &r.reqs[0]
	for i := range r.fetches {
		if kf := &r.fetches[i]; kf.follows {
			r.resps[i] = kf.flight.Val
			r.resps[i].Key = req.Keys[i]
		}
	}
	r.p.metrics.coalesced.Add(float64(r.follows))
	r.complete()
}

// complete settles what the run's answers change (see run), counts them and hands them on.
func (r *startedRun) complete() {
	walk.Step()
	p, t := r.p, r.t
	took := time.Since(r.begun).Seconds()
	if r.lone {
		req := &r.reqs[0]
		touch := req.Op == protocol.OpGat || req.Op == protocol.OpGats
		for i, k := range req.Keys {
			r.resps[i].Key = k
			if touch {
				p.settle(t, k) // it ends what is cached
			}
		}
		p.account(t, r.pool, req, r.resps, took)
	} else {
		p.endRun(t, r.pool, r.reqs, r.resps, took)
	}
	// The run's writes end once its answers are on their way (see beginWrites): their
	// guard's words, where other work leaves them cold, are no wait of the client's.
	done := r.done
	done()
	p.writes.EndMarks(r.marks)
	r.release()
}
