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
