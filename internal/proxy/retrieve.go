package proxy

import (
	"bytes"
	"context"
	"strconv"
	"time"

	"github.com/moxi-proxy/moxi/internal/dedup"
	"github.com/moxi-proxy/moxi/internal/hotcache"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// hotLookup answers key k of pl from the hot cache into r (hit). For a hot key it missed,
// it returns the epoch that publish needs to cache what the fetch brings.
func (p *Proxy) hotLookup(t *topology.Topology, pl *pool.Pool, k []byte, r *protocol.Response) (hit, hot bool, epoch hotcache.Ticket) {
	if !t.HotKey(pl, k) {
		return false, false, hotcache.Ticket{}
	}
	if e, ok := t.Hot.Get(pl.Name(), k); ok {
		*r = protocol.Response{Key: k, Value: e.Value, Flags: e.Flags, Cas: e.Cas}
		p.metrics.hotHits.Inc()
		return true, true, hotcache.Ticket{}
	}
	p.metrics.hotMisses.Inc()
	return false, true, t.Hot.Epoch(k)
}

// publish caches a leader's answer for a hot key k of pl (see fillHot) and hands it to the
// flight's followers.
func (p *Proxy) publish(t *topology.Topology, pl *pool.Pool, k []byte, r *protocol.Response, hot bool, epoch hotcache.Ticket, f *dedup.Flight[protocol.Response]) {
	if hot && r.Status == protocol.StatusOK {
		p.fillHot(t, pl, k, hotcache.Entry{Value: r.Value, Flags: r.Flags, Cas: r.Cas}, epoch)
	}
	if f != nil {
		f.Val = *r
		f.Val.Key = nil // the leader's key bytes belong to its connection
		p.flights.Finish(f)
	}
}

// maxExpiryAsks bounds the hot cache fills waiting for their item's expiry; past it a fill
// is dropped (the next read fetches again).
const maxExpiryAsks = 64

// expiryAskTimeout bounds one ask.
const expiryAskTimeout = time.Second

// fillHot caches e, the value of hot key k of pl fetched at epoch, until its item expires
// on the server. A get's answer does not say when (the binary protocol has no field for
// it), so the entry is cached at once for at most expiryAskTimeout while fillHot asks
// ("mg <key> t", on its own goroutine: the caller is a server connection's reader, which
// must not wait), then given the item's expiry, or dropped when the item has a second or
// less to live, is gone, or no answer came. Until the answer (a round trip) the value is
// served as a get that joined the fetch would get it. A server that takes no meta command
// (one with SASL) cannot say: its entries live for the ttl.
func (p *Proxy) fillHot(t *topology.Topology, pl *pool.Pool, k []byte, e hotcache.Entry, epoch hotcache.Ticket) {
	select {
	case p.expiryAsks <- struct{}{}:
	default:
		return // too many asks waiting: not cached, the next read fetches again
	}
	asked := time.Now()
	e.Expires = asked.Add(expiryAskTimeout)
	t.Hot.Add(pl.Name(), k, e, epoch)
	k = bytes.Clone(k)
	server := pl.Member(pl.Locate(k)).Server
	go func() {
		defer func() { <-p.expiryAsks }()
		ctx, cancel := context.WithTimeout(context.Background(), expiryAskTimeout)
		defer cancel()
		req := protocol.Request{Op: protocol.OpMetaGet, Key: k, Meta: protocol.MetaRequest{KeyToken: k, Flags: []protocol.MetaFlag{{Letter: 't'}}}}
		var resp [1]protocol.Response
		expires := asked // drop, unless the answer says otherwise
		if err := pool.Do(ctx, server, nil, &req, resp[:]); err == nil {
			switch left, ok := remainingTTL(&resp[0]); {
			case resp[0].Status == protocol.StatusUnknownCommand || resp[0].Status == protocol.StatusAuthError:
				expires = time.Time{} // no meta commands here: the ttl alone bounds the entry
			case !ok || left >= 0 && left <= time.Second:
				// A miss (expired or deleted meanwhile), an answer without t, or too little left.
			case left < 0:
				expires = time.Time{} // never expires
			default:
				expires = asked.Add(left - time.Second) // whole seconds: "t5" means more than four left
			}
		}
		t.Hot.SetExpires(pl.Name(), k, epoch, expires)
	}()
}

// remainingTTL is the t flag of an mg answer: the item's time to live, or < 0 when it never
// expires; ok false for a miss or an answer without it.
func remainingTTL(r *protocol.Response) (time.Duration, bool) {
	if r.Status != protocol.StatusOK {
		return 0, false
	}
	for _, f := range bytes.Fields(r.Meta.Flags) {
		if len(f) > 1 && f[0] == 't' {
			n, err := strconv.ParseInt(string(f[1:]), 10, 64)
			if err != nil {
				return 0, false
			}
			if n < 0 {
				return -1, true
			}
			return time.Duration(n) * time.Second, true
		}
	}
	return 0, false
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
