package proxy

import (
	"context"
	"time"

	"github.com/moxi-proxy/moxi/internal/bgqueue"
	"github.com/moxi-proxy/moxi/internal/keyhash"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// Shadow pools (a pool's shadow: {pool, fraction}). The requests for a stable share of the
// pool's keys are copied, once the client's answer is made, onto a bounded queue that a few
// workers send on to the shadow pool; their answers are counted and thrown away. A full
// queue, or max_background_bytes (shared with backup copies) full, drops the copy
// (counted): a slow or stopped shadow pool costs clients nothing but the copy, and moxi no
// more memory than those bounds. Each key has its worker, so that the shadow pool gets a
// key's requests in the order they were queued.

const (
	shadowWorkers   = 8    // requests sent to shadow pools at once
	shadowQueued    = 1024 // requests queued or being sent, at most
	shadowTimeoutAt = 5 * time.Second
)

// shadowed reports whether key is among the fraction of keys shadowed. The hash is stable
// across processes and restarts (a key is always or never shadowed, on every proxy of a
// tier) and, salted, unrelated to the ring's placement of the key (fnv1a_64 may be a
// pool's ring hash).
func shadowed(key []byte, fraction float64) bool {
	return fraction >= 1 || float64(keyhash.Stable(shadowSalt, key)>>11) < fraction*(1<<53)
}

// shadowSalt is never changed: every proxy of a tier, of any version, shadows the same
// keys (keyhash pins Stable's values for it).
const shadowSalt = "moxi/shadow:"

// shadowTo is where a queued shadow request goes.
type shadowTo struct {
	pool *pool.Pool
	from string // the shadowed pool's name, for the metric
}

// newShadows is the queue of requests for shadow pools; its bytes count against the
// proxy's background budget.
func (p *Proxy) newShadows() *bgqueue.Queue[shadowTo] {
	return bgqueue.New(bgqueue.Options{
		Workers:  shadowWorkers,
		MaxItems: shadowQueued,
		MaxBytes: int64(p.opts.MaxBackgroundBytes),
		Bytes:    p.background,
		Measure:  bgqueue.Memory,
	}, p.sendShadow)
}

// shadow queues copies of req's shadowed keys, one per shadow pool; called after req is
// answered.
func (p *Proxy) shadow(t *topology.Topology, req *protocol.Request) {
	if req.Op.IsRetrieval() {
		// Keys of one request usually share one pool: one copy per shadow pool reached.
		var done []*pool.Pool
		for _, k := range req.Keys {
			pl := t.PoolFor(k)
			sh := t.Shadows[pl]
			if sh.Pool == nil || containsPool(done, pl) {
				continue
			}
			done = append(done, pl)
			var keys [][]byte
			for _, k2 := range req.Keys {
				if t.PoolFor(k2) == pl && shadowed(k2, sh.Fraction) {
					keys = append(keys, k2)
				}
			}
			if len(keys) > 0 {
				sub := *req
				sub.Keys = keys
				p.enqueueShadow(shadowTo{sh.Pool, pl.Name()}, &sub, keys[0])
			}
		}
		return
	}
	if len(req.Key) == 0 || req.Op == protocol.OpStats {
		return
	}
	pl := t.PoolFor(req.Key)
	if sh := t.Shadows[pl]; sh.Pool != nil && shadowed(req.Key, sh.Fraction) {
		p.enqueueShadow(shadowTo{sh.Pool, pl.Name()}, req, req.Key)
	}
}

func containsPool(ps []*pool.Pool, p *pool.Pool) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// enqueueShadow queues a copy of req, of key (a retrieval's first), for to, or drops it
// when the queue is full or closed or the background budget is spent.
func (p *Proxy) enqueueShadow(to shadowTo, req *protocol.Request, key []byte) {
	if !to.pool.Member(to.pool.Locate(key)).Server.Up() {
		// Marked dead: the request would fail at once; not copying it spares the clients'
		// CPU while the shadow pool is down.
		p.metrics.shadowResult(to.from, shadowError)
		return
	}
	if !p.shadows.TryEnqueue(req, to) {
		p.metrics.shadowResult(to.from, shadowDropped)
	}
}

// sendShadow sends a queued copy to its pool's servers, a retrieval's keys split by
// server, and counts the result.
func (p *Proxy) sendShadow(ctx context.Context, req *protocol.Request, to shadowTo) {
	ctx, cancel := context.WithTimeout(ctx, shadowTimeoutAt)
	defer cancel()
	result := shadowOK
	if err := sendShadow(ctx, to.pool, req); err != nil {
		result = shadowError
	}
	p.metrics.shadowResult(to.from, result)
}

func sendShadow(ctx context.Context, pl *pool.Pool, req *protocol.Request) error {
	if !req.Op.IsRetrieval() {
		var resp [1]protocol.Response
		return pl.Member(pl.Locate(req.Key)).Server.Do(ctx, req, resp[:])
	}
	idx := make([]int, len(req.Keys))
	for i := range idx {
		idx[i] = i
	}
	shares := split(func([]byte) *pool.Pool { return pl }, req.Keys, idx)
	var first error
	for _, sh := range shares {
		sub := *req
		sub.Keys = make([][]byte, len(sh.idx))
		for j, i := range sh.idx {
			sub.Keys[j] = req.Keys[i]
		}
		resps := make([]protocol.Response, len(sub.Keys))
		if err := sh.member.Server.Do(ctx, &sub, resps); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// The results of moxi_shadow_requests_total.
const (
	shadowOK = iota
	shadowError
	shadowDropped
	numShadowResults
)

var shadowResultNames = [numShadowResults]string{"ok", "error", "dropped"}
