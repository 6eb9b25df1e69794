package proxy

import (
	"context"

	"github.com/moxi-proxy/moxi/internal/dedup"
	"github.com/moxi-proxy/moxi/internal/hotcache"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// retrieve answers a get, gets, gat or gats, in the client's key order: from the hot cache
// where it can, by joining a fetch of the same key already in flight where dedup allows,
// and for the rest from the servers (see fetch).
func (p *Proxy) retrieve(ctx context.Context, order *turn.Turn, t *topology.Topology, req *protocol.Request, resps []protocol.Response) []protocol.Response {
	base := len(resps)
	for range req.Keys {
		resps = append(resps, protocol.Response{})
	}
	out := resps[base:]
	switch {
	case req.Op == protocol.OpGat || req.Op == protocol.OpGats:
		// A touch: neither served from the cache nor shared, and it ends what is cached.
		p.fetch(ctx, order, t, req, out, nil)
		for _, k := range req.Keys {
			p.settle(t, k)
		}
	case t.Hot == nil && !t.Dedup:
		p.fetch(ctx, order, t, req, out, nil)
	case len(req.Keys) == 1:
		p.retrieveOne(ctx, order, t, req, out)
	default:
		p.retrieveShared(ctx, order, t, req, out)
	}
	return resps
}

// retrieveOne is retrieveShared for the common single-key get, without its bookkeeping.
func (p *Proxy) retrieveOne(ctx context.Context, order *turn.Turn, t *topology.Topology, req *protocol.Request, out []protocol.Response) {
	k := req.Keys[0]
	space := t.PoolFor(k).Name()
	hit, hot, epoch := p.hotLookup(t, space, k, &out[0])
	if hit {
		return
	}
	var f *dedup.Flight[protocol.Response]
	if t.Dedup && !p.writes.InFlight(k) {
		var leader bool
		if f, leader = p.flights.Start(space, k); !leader {
			p.follow(ctx, f, k, &out[0])
			p.metrics.coalesced.Inc()
			return
		}
	}
	p.fetch(ctx, order, t, req, out, nil)
	p.publish(t, space, k, &out[0], hot, epoch, f)
}

// retrieveShared is retrieve with the hot cache and dedup. The request leads the fetch of
// every key nobody else is fetching, fetches those in one go, publishes them, and only then
// waits for the keys others lead: since every request finishes what it leads before it
// waits, two requests leading each other's keys cannot wait for each other.
func (p *Proxy) retrieveShared(ctx context.Context, order *turn.Turn, t *topology.Topology, req *protocol.Request, out []protocol.Response) {
	type lead struct {
		i      int
		space  string                           // the key's pool
		flight *dedup.Flight[protocol.Response] // nil without dedup
		hot    bool
		epoch  hotcache.Ticket
	}
	type follow struct {
		i      int
		flight *dedup.Flight[protocol.Response]
	}
	var leads []lead
	var follows []follow
	for i, k := range req.Keys {
		space := t.PoolFor(k).Name()
		hit, hot, epoch := p.hotLookup(t, space, k, &out[i])
		if hit {
			continue
		}
		l := lead{i: i, space: space, hot: hot, epoch: epoch}
		if t.Dedup && !p.writes.InFlight(k) {
			f, leader := p.flights.Start(space, k)
			if !leader {
				follows = append(follows, follow{i, f})
				continue
			}
			l.flight = f
		}
		leads = append(leads, l)
	}
	if len(leads) > 0 {
		idx := make([]int, len(leads))
		for j, l := range leads {
			idx[j] = l.i
		}
		p.fetch(ctx, order, t, req, out, idx)
	}
	for _, l := range leads {
		p.publish(t, l.space, req.Keys[l.i], &out[l.i], l.hot, l.epoch, l.flight)
	}
	for _, f := range follows {
		p.follow(ctx, f.flight, req.Keys[f.i], &out[f.i])
	}
	p.metrics.coalesced.Add(float64(len(follows)))
}

// hotLookup answers key k of the pool named space from the hot cache into r (hit). For a
// hot key it missed, it returns the epoch that publish needs to cache what the fetch
// brings.
func (p *Proxy) hotLookup(t *topology.Topology, space string, k []byte, r *protocol.Response) (hit, hot bool, epoch hotcache.Ticket) {
	if !t.Hot.Hot(k) {
		return false, false, hotcache.Ticket{}
	}
	if e, ok := t.Hot.Get(space, k); ok {
		*r = protocol.Response{Key: k, Value: e.Value, Flags: e.Flags, Cas: e.Cas}
		p.metrics.hotHits.Inc()
		return true, true, hotcache.Ticket{}
	}
	p.metrics.hotMisses.Inc()
	return false, true, t.Hot.Epoch(k)
}

// publish caches a leader's answer for a hot key k of the pool named space and hands it to
// the flight's followers.
func (p *Proxy) publish(t *topology.Topology, space string, k []byte, r *protocol.Response, hot bool, epoch hotcache.Ticket, f *dedup.Flight[protocol.Response]) {
	if hot && r.Status == protocol.StatusOK {
		t.Hot.Add(space, k, hotcache.Entry{Value: r.Value, Flags: r.Flags, Cas: r.Cas}, epoch)
	}
	if f != nil {
		f.Val = *r
		f.Val.Key = nil // the leader's key bytes belong to its connection
		p.flights.Finish(f)
	}
}

// follow waits for another request's fetch of k and takes its answer.
func (p *Proxy) follow(ctx context.Context, f *dedup.Flight[protocol.Response], k []byte, r *protocol.Response) {
	if err := f.Wait(ctx); err != nil {
		*r = protocol.Response{Status: protocol.StatusTempFailure, Msg: err.Error()}
	} else {
		*r = f.Val
	}
	r.Key = k
}

// fetch gets req.Keys[i] for every i in idx (every key when idx is nil) from the servers
// into out[i]: a single key straight from its server, several split by server and sent as
// one request per server in parallel. (A pool's warm_from and backup pools are its
// servers' business: package route.)
func (p *Proxy) fetch(ctx context.Context, order *turn.Turn, t *topology.Topology, req *protocol.Request, out []protocol.Response, idx []int) {
	if len(req.Keys) == 1 {
		pl := t.PoolFor(req.Keys[0])
		p.do(ctx, order, pl, req.Keys[0], req, out)
		return
	}
	p.fanOut(ctx, order, t.PoolFor, req, out, idx)
}

// fanOut fetches req.Keys[i] for every i in idx (all keys when idx is nil) into out[i],
// placing each key with poolFor. A share whose server did not answer is tried again, up to
// its pool's retries, after placing its keys anew (failover may have moved them).
func (p *Proxy) fanOut(ctx context.Context, order *turn.Turn, poolFor func([]byte) *pool.Pool, req *protocol.Request, out []protocol.Response, idx []int) {
	if idx == nil {
		idx = make([]int, len(req.Keys))
		for i := range idx {
			idx[i] = i
		}
	}
	for attempt := 0; len(idx) > 0; attempt++ {
		shares := split(poolFor, req.Keys, idx)
		parts := make([]pool.Part, len(shares))
		for s := range shares {
			parts[s] = pool.KeysPart(shares[s].Member.Server, req, shares[s].At, out)
		}
		pool.DoParts(ctx, order, parts)
		idx = idx[:0:0]
		for s := range parts {
			parts[s].Place(out)
			err := parts[s].Errs[0]
			if err == nil {
				continue
			}
			sh := &shares[s]
			if attempt < sh.Pool.Retries() && ctx.Err() == nil {
				idx = append(idx, sh.At...)
				continue
			}
			failed := protocol.Response{Status: protocol.StatusTempFailure, Msg: backendMsg(sh.Member, err)}
			for _, i := range sh.At {
				out[i] = failed
				out[i].Key = req.Keys[i]
			}
		}
	}
}

// split groups the keys at idx by the member that serves them, each group's At the keys'
// indexes in the request.
func split(poolFor func([]byte) *pool.Pool, keys [][]byte, idx []int) []pool.Group {
	groups := pool.GroupByMember(poolFor, keys, idx)
	for _, g := range groups {
		for n, j := range g.At {
			g.At[n] = idx[j]
		}
	}
	return groups
}
