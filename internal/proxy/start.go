package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/moxi-proxy/moxi/internal/dedup"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// Start answers a run as HandleRun does (a lone request as Handle does), without a
// goroutine waiting for it: the run goes to its server as one batch, and whoever reads the
// answers (pool.Starter) finishes it and calls done, at most once. It takes the common case
// only: every request of the run served by one member whose server is a pool.Starter, no
// feature that acts after the answer (a backup or warm_from pool, shadowing, a hot key,
// fire-and-forget, a write for a stand-in), and for a lone get no fetch of its key to join.
// It reports false, having done nothing, for anything else: the caller then runs the
// request as before.
func (p *Proxy) Start(ctx context.Context, reqs []protocol.Request, resps []protocol.Response, done func()) bool {
	begun := time.Now()
	t := p.topo.Load().InService(begun)
	if len(t.Shadows) > 0 {
		return false
	}
	pl, m := startable(t, reqs)
	if m == nil {
		return false
	}
	starter, ok := m.Server.(pool.Starter)
	if !ok {
		return false
	}
	var f *dedup.Flight[protocol.Response]
	if lone := &reqs[0]; len(reqs) == 1 && lone.Op.IsRetrieval() && t.Dedup && !p.writes.inFlight(lone.Keys[0]) {
		var leader bool
		if f, leader = p.flights.Start(lone.Keys[0]); !leader {
			return false // Handle follows the fetch in flight
		}
	}
	r := getStartedRun()
	r.p, r.ctx, r.t, r.pool, r.member, r.reqs, r.resps, r.flight, r.begun, r.done = p, ctx, t, pl, m, reqs, resps, f, begun, done
	for range reqs {
		r.errs = append(r.errs, nil)
	}
	for i := range reqs {
		if req := &reqs[i]; changesKey(req.Op) {
			p.writes.begin(req.Key)
			p.settle(t, req.Key)
		}
	}
	if !starter.StartBatch(ctx, reqs, resps, r.errs, r.finishFunc) {
		// Declined after the flight and writes began: send it the way that waits.
		m.Server.DoBatch(ctx, reqs, resps, r.errs)
		r.finish()
	}
	return true
}

// startable is the member that serves every request of a run that Start may take, or nil.
func startable(t *topology.Topology, reqs []protocol.Request) (*pool.Pool, *pool.Member) {
	var pl *pool.Pool
	var m *pool.Member
	for i := range reqs {
		req := &reqs[i]
		key := req.Key
		switch {
		case req.Op.IsRetrieval():
			if key = req.Keys[0]; t.Hot.Hot(key) {
				return nil, nil
			}
		case req.Op == protocol.OpMetaNoop, inBackground(t, req):
			return nil, nil
		}
		kp := t.PoolFor(key)
		if t.WarmFrom[kp] != nil || t.Backups[kp] != nil {
			return nil, nil
		}
		km := kp.Member(kp.Locate(key))
		if changesKey(req.Op) && kp.Failover() && km != kp.Member(kp.Owner(key)) {
			return nil, nil // a write for a stand-in is remembered (see attempt)
		}
		if m != nil && km != m {
			return nil, nil
		}
		pl, m = kp, km
	}
	return pl, m
}

// startedRun is a run Start sent, until it is answered.
type startedRun struct {
	p          *Proxy
	ctx        context.Context
	t          *topology.Topology
	pool       *pool.Pool
	member     *pool.Member
	reqs       []protocol.Request
	resps      []protocol.Response
	errs       []error
	flight     *dedup.Flight[protocol.Response] // a lone get's fetch, which others may join
	begun      time.Time
	done       func()
	finishFunc func() // finish, made once per startedRun
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

// finish ends the run once its server answered it or failed. A request that got no answer
// is tried again as HandleRun does, which waits: that part runs on a goroutine of its own,
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
	for i, err := range r.errs {
		if err != nil {
			req := &r.reqs[i]
			key := req.Key
			if req.Op.IsRetrieval() {
				key = req.Keys[0]
			}
			r.p.recover(r.ctx, r.pool, key, req, r.resps[i:i+1], r.member, err)
		}
	}
	r.end()
}

// end settles what the run's answers change (see HandleRun), counts them and hands them on.
func (r *startedRun) end() {
	p, t := r.p, r.t
	took := time.Since(r.begun).Seconds()
	for i := range r.reqs {
		req := &r.reqs[i]
		switch {
		case req.Op.IsRetrieval():
			r.resps[i].Key = req.Keys[0]
			if r.flight != nil {
				p.publish(t, req.Keys[0], &r.resps[i], false, 0, r.flight)
			}
		case changesKey(req.Op):
			p.settle(t, req.Key)
			p.writes.end(req.Key)
		}
		p.account(req, r.resps[i:i+1], took)
	}
	done := r.done
	clear(r.errs)
	fn := r.finishFunc
	*r = startedRun{errs: r.errs[:0], finishFunc: fn}
	startedRuns.Put(r)
	done()
}
