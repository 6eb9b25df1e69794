package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/moxi-proxy/moxi/internal/dedup"
	"github.com/moxi-proxy/moxi/internal/hotcache"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
	"github.com/moxi-proxy/moxi/internal/walk"
)

// Start answers a run as Handle does, without a goroutine waiting for it: the run goes to
// its server as one batch (pool.Server.Start), or to each of its servers its share
// (pool.StartParts), and whoever finishes the last calls done, once. A lone get of many
// keys is taken as well, as one request. It takes the common case only: no feature of the
// proxy's that acts after the answer (a hot key, fire-and-forget, a touch), and for a lone
// get, fetches of its keys by others to join only when it leads some itself. It reports
// false, having done nothing, for anything else: the caller then runs the request as
// before.
func (p *Proxy) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, done func()) bool {
	return p.start(ctx, order, "", reqs, resps, done)
}

// start is Start for the clients of the listener at listener ("": the main one).
func (p *Proxy) start(ctx context.Context, order *turn.Turn, listener string, reqs []protocol.Request, resps []protocol.Response, done func()) bool {
	walk.Step()
	begun := time.Now()
	t := p.topo.Load().InService(begun).ForListener(listener)
	pl, m, ok := startable(t, reqs)
	if !ok {
		return false
	}
	r := getStartedRun()
	r.p, r.ctx, r.order, r.t, r.pool, r.member, r.reqs, r.resps, r.begun, r.done = p, ctx, order, t, pl, m, reqs, resps, begun, done
	r.many = len(reqs) == 1 && len(reqs[0].Keys) > 1
	if lone := &reqs[0]; len(reqs) == 1 && lone.Op.IsRetrieval() && t.Dedup {
		r.lead()
		switch {
		case len(r.follows) == 0:
		case r.leads == 0:
			r.release()
			return false // Handle follows the fetches in flight
		default:
			r.fetchAndFollow() // others fetch some keys: this one fetches the rest, then waits for theirs
			r.end()
			return true
		}
	}
	for range reqs {
		r.errs = append(r.errs, nil)
	}
	for i := range reqs {
		if req := &reqs[i]; req.Op.ChangesKey() {
			p.beginWrite(t, req.Key)
		}
	}
	switch {
	case m != nil:
		m.Server.Start(ctx, order, reqs, resps, r.errs, r.finishFunc)
	case r.many:
		r.startKeys()
	default:
		b := getWriteBatch()
		b.group(t, reqs)
		r.startShares(b)
	}
	return true
}

// startKeys sends a lone get whose keys several members serve, each member its share.
func (r *startedRun) startKeys() {
	req := &r.reqs[0]
	r.shares = pool.GroupByMember(r.t.PoolFor, req.Keys, nil) // At: key indexes
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

// gather places the shares' answers once the last is in (startKeys, startShares), notes
// the requests that got none, and finishes the run.
func (r *startedRun) gather() {
	if r.many {
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
		case req.Op == protocol.OpGat || req.Op == protocol.OpGats, req.Op == protocol.OpMetaNoop, inBackground(t, req):
			return nil, nil, false
		case req.Op.IsRetrieval():
			for _, k := range req.Keys {
				if t.Hot.Hot(k) {
					return nil, nil, false
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
	many       bool // reqs is one get of many keys, resps its keys' answers
	begun      time.Time
	done       func()
	finishFunc func() // finish, made once per startedRun
	gatherFunc func() // gather, made once per startedRun

	// Several members: a lone get's shares (startKeys) and the keys to fetch again, whose
	// share got no answer; or a run's (startShares).
	shares    []pool.Group
	parts     []pool.Part
	retryKeys []int
	batch     *writeBatch

	// A lone get's fetches of its keys (dedup): flights[i] for key i, nil where the get
	// neither leads nor follows one; follows, the keys others are fetching.
	flights []*dedup.Flight[protocol.Response]
	leads   int
	follows []int
}

var startedRuns sync.Pool // of *startedRun

func getStartedRun() *startedRun {
	if r, ok := startedRuns.Get().(*startedRun); ok {
		return r
	}
	r := new(startedRun)
	r.finishFunc, r.gatherFunc = r.finish, r.gather
	return r
}

// release puts r back for the next run.
func (r *startedRun) release() {
	clear(r.errs)
	clear(r.flights)
	clear(r.parts)
	if r.batch != nil {
		putWriteBatch(r.batch)
	}
	*r = startedRun{errs: r.errs[:0], flights: r.flights[:0], follows: r.follows[:0], parts: r.parts[:0], retryKeys: r.retryKeys[:0],
		finishFunc: r.finishFunc, gatherFunc: r.gatherFunc}
	startedRuns.Put(r)
}

// space is the name of key's pool, by which its fetches are known (dedup).
func (r *startedRun) space(key []byte) string {
	if r.pool != nil {
		return r.pool.Name()
	}
	return r.t.PoolFor(key).Name()
}

// lead starts the fetch of each key of a lone get nobody else is fetching (dedup), and
// notes the keys others are: as retrieveShared does.
func (r *startedRun) lead() {
	p, keys := r.p, r.reqs[0].Keys
	for i, k := range keys {
		var f *dedup.Flight[protocol.Response]
		if !p.writes.InFlight(k) {
			var leader bool
			if f, leader = p.flights.Start(r.space(k), k); !leader {
				r.follows = append(r.follows, i)
			} else {
				r.leads++
			}
		}
		r.flights = append(r.flights, f)
	}
}

// fetchAndFollow answers a lone get that leads the fetches of some keys and follows others'
// for the rest, waiting for them: its own first, then theirs (see retrieveShared).
func (r *startedRun) fetchAndFollow() {
	p, req := r.p, &r.reqs[0]
	var idx []int        // every key but those others fetch: the ones it leads, and those it may not share (a write in flight)
	follows := r.follows // in key order
	for i := range req.Keys {
		if len(follows) > 0 && follows[0] == i {
			follows = follows[1:]
			continue
		}
		idx = append(idx, i)
	}
	p.fetch(r.ctx, r.order, r.t, req, r.resps, idx)
	for _, i := range idx {
		if f := r.flights[i]; f != nil {
			p.publish(r.t, r.space(req.Keys[i]), req.Keys[i], &r.resps[i], false, hotcache.Ticket{}, f)
		}
	}
	for _, i := range r.follows {
		p.follow(r.ctx, r.flights[i], req.Keys[i], &r.resps[i])
	}
	p.metrics.coalesced.Add(float64(len(r.follows)))
	clear(r.flights) // published
}

// finish ends the run once its server answered it or failed. A request that got no answer
// is tried again as Handle does, which waits: that part runs on a goroutine of its own,
// since finish runs on the server connection's reader, which must not wait.
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
	case r.many:
		var keys []int // nil: every key, all from one member
		if r.member == nil {
			keys = r.retryKeys
		}
		p.fanOut(r.ctx, r.order, r.t.PoolFor, &r.reqs[0], r.resps, keys)
		r.end()
		return
	case r.batch != nil:
		for s := range r.batch.shares {
			sh := &r.batch.shares[s]
			for j, i := range sh.idx {
				p.recover(r.ctx, r.order, sh.pool, runKey(&r.reqs[i]), &r.reqs[i], r.resps[i:i+1], sh.member, sh.errs[j])
			}
		}
		r.end()
		return
	}
	for i, err := range r.errs {
		if err != nil {
			p.recover(r.ctx, r.order, r.pool, runKey(&r.reqs[i]), &r.reqs[i], r.resps[i:i+1], r.member, err)
		}
	}
	r.end()
}

// end settles what the run's answers change (see run), publishes the fetches it led,
// counts the answers and hands them on.
func (r *startedRun) end() {
	walk.Step()
	p, t := r.p, r.t
	took := time.Since(r.begun).Seconds()
	for i, f := range r.flights {
		if f != nil {
			k := r.reqs[0].Keys[i]
			r.resps[i].Key = k
			p.publish(t, r.space(k), k, &r.resps[i], false, hotcache.Ticket{}, f)
		}
	}
	if r.many {
		req := &r.reqs[0]
		for i := range req.Keys {
			r.resps[i].Key = req.Keys[i]
		}
		p.account(req, r.resps, took)
	} else {
		p.endRun(t, r.reqs, r.resps, took)
	}
	done := r.done
	r.release()
	done()
}
