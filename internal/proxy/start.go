package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/moxi-proxy/moxi/internal/dedup"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
	"github.com/moxi-proxy/moxi/internal/walk"
)

// Start answers a run as Handle does, without a goroutine waiting for it: the run goes to
// its server as one batch (pool.Server.Start), and whoever finishes that calls done, once.
// A lone get of many keys is taken as well, as one request. It takes the common case only:
// every key served by one member, no feature of the proxy's that acts after the answer (a
// hot key, fire-and-forget, a touch), and for a lone get, fetches of its keys by others to
// join only when it leads some itself. It reports false, having done nothing, for anything
// else: the caller then runs the request as before.
func (p *Proxy) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, done func()) bool {
	return p.start(ctx, order, "", reqs, resps, done)
}

// start is Start for the clients of the listener at listener ("": the main one).
func (p *Proxy) start(ctx context.Context, order *turn.Turn, listener string, reqs []protocol.Request, resps []protocol.Response, done func()) bool {
	walk.Step()
	begun := time.Now()
	t := p.topo.Load().InService(begun).ForListener(listener)
	pl, m := startable(t, reqs)
	if m == nil {
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
	m.Server.Start(ctx, order, reqs, resps, r.errs, r.finishFunc)
	return true
}

// startable is the member that serves every key of a run that Start may take, or nil.
func startable(t *topology.Topology, reqs []protocol.Request) (*pool.Pool, *pool.Member) {
	var pl *pool.Pool
	var m *pool.Member
	take := func(key []byte) bool {
		kp := t.PoolFor(key)
		km := kp.Member(kp.Locate(key))
		if m != nil && km != m {
			return false
		}
		pl, m = kp, km
		return true
	}
	for i := range reqs {
		req := &reqs[i]
		switch {
		case req.Op == protocol.OpGat || req.Op == protocol.OpGats, req.Op == protocol.OpMetaNoop, inBackground(t, req):
			return nil, nil
		case req.Op.IsRetrieval():
			for _, k := range req.Keys {
				if t.Hot.Hot(k) || !take(k) {
					return nil, nil
				}
			}
		case !take(req.Key):
			return nil, nil
		}
	}
	return pl, m
}

// startedRun is a run Start sent, until it is answered.
type startedRun struct {
	p          *Proxy
	ctx        context.Context
	order      *turn.Turn // the run's turn, until it is dispatched (and for a retry's deferred dispatches)
	t          *topology.Topology
	pool       *pool.Pool
	member     *pool.Member
	reqs       []protocol.Request
	resps      []protocol.Response
	errs       []error
	many       bool // reqs is one get of many keys, resps its keys' answers
	begun      time.Time
	done       func()
	finishFunc func() // finish, made once per startedRun

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
	r.finishFunc = r.finish
	return r
}

// release puts r back for the next run.
func (r *startedRun) release() {
	clear(r.errs)
	clear(r.flights)
	*r = startedRun{errs: r.errs[:0], flights: r.flights[:0], follows: r.follows[:0], finishFunc: r.finishFunc}
	startedRuns.Put(r)
}

// lead starts the fetch of each key of a lone get nobody else is fetching (dedup), and
// notes the keys others are: as retrieveShared does.
func (r *startedRun) lead() {
	p, keys := r.p, r.reqs[0].Keys
	for i, k := range keys {
		var f *dedup.Flight[protocol.Response]
		if !p.writes.InFlight(k) {
			var leader bool
			if f, leader = p.flights.Start(r.pool.Name(), k); !leader {
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
			p.publish(r.t, r.pool.Name(), req.Keys[i], &r.resps[i], false, 0, f)
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
	if r.many {
		p.fanOut(r.ctx, r.order, r.t.PoolFor, &r.reqs[0], r.resps, nil)
		r.end()
		return
	}
	for i, err := range r.errs {
		if err != nil {
			req := &r.reqs[i]
			key := req.Key
			if req.Op.IsRetrieval() {
				key = req.Keys[0]
			}
			p.recover(r.ctx, r.order, r.pool, key, req, r.resps[i:i+1], r.member, err)
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
			p.publish(t, r.pool.Name(), k, &r.resps[i], false, 0, f)
		}
	}
	if r.many {
		req := &r.reqs[0]
		for i := range req.Keys {
			r.resps[i].Key = req.Keys[i]
		}
		p.account(req, r.resps, took)
	} else {
		for i := range r.reqs {
			req := &r.reqs[i]
			switch {
			case req.Op.IsRetrieval():
				r.resps[i].Key = req.Keys[0]
			case req.Op.ChangesKey():
				p.endWrite(t, req.Key)
			}
			p.account(req, r.resps[i:i+1], took)
		}
	}
	done := r.done
	r.release()
	done()
}
