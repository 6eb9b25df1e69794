package route

import (
	"context"
	"time"

	"github.com/moxi-proxy/moxi/internal/bgqueue"
	"github.com/moxi-proxy/moxi/internal/keyhash"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// Shadow pools (a pool's shadow: {pool, fraction}). The requests for a stable share of the
// pool's keys are copied, once their answer is made, onto a bounded queue that a few
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

// shadow is a member's server of a pool with a shadow pool.
type shadow struct {
	wrapped
	s        *Shared
	to       shadowTo
	fraction float64
}

var _ pool.Server = (*shadow)(nil)

// Start passes reqs on and queues their copies once they are answered.
func (sh *shadow) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	sh.next.Start(ctx, order, reqs, resps, errs, func() {
		for i := range reqs {
			sh.copy(&reqs[i])
		}
		done()
	})
}

// copy queues a copy of req's shadowed keys, once it is answered. A request without a key
// (flush_all) is not copied.
func (sh *shadow) copy(req *protocol.Request) {
	if !req.Op.IsRetrieval() {
		if len(req.Key) > 0 && shadowed(req.Key, sh.fraction) {
			sh.enqueue(req, req.Key)
		}
		return
	}
	var keys [][]byte
	for _, k := range req.Keys {
		if shadowed(k, sh.fraction) {
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		sub := *req
		sub.Keys = keys
		sh.enqueue(&sub, keys[0])
	}
}

// enqueue queues a copy of req, of key (a retrieval's first), or drops it when the queue is
// full or closed or the background budget is spent.
func (sh *shadow) enqueue(req *protocol.Request, key []byte) {
	to, s := sh.to, sh.s
	if !to.pool.Member(to.pool.Locate(key)).Server.Up() {
		// Marked dead: the request would fail at once; not copying it spares the clients'
		// CPU while the shadow pool is down.
		s.shadowResult(to.from, shadowError)
		return
	}
	if !s.shadows.TryEnqueue(req, to) {
		s.shadowResult(to.from, shadowDropped)
	}
}

// newShadows is the queue of requests for shadow pools; its bytes count against the
// background budget.
func (s *Shared) newShadows(maxBytes int) *bgqueue.Queue[shadowTo] {
	return bgqueue.New(bgqueue.Options{
		Workers:  shadowWorkers,
		MaxItems: shadowQueued,
		MaxBytes: int64(maxBytes),
		Bytes:    s.background,
		Measure:  bgqueue.Memory,
	}, s.sendShadow)
}

// sendShadow sends a queued copy to its pool's servers, a retrieval's keys split by
// server, and counts the result.
func (s *Shared) sendShadow(ctx context.Context, req *protocol.Request, to shadowTo) {
	ctx, cancel := context.WithTimeout(ctx, shadowTimeoutAt)
	defer cancel()
	result := shadowOK
	if req.Op.IsRetrieval() {
		answers := make([]protocol.Response, len(req.Keys))
		for _, ok := range askEach(ctx, nil, to.pool, req, answers, all(len(req.Keys))) {
			if !ok {
				result = shadowError
			}
		}
	} else {
		var resp [1]protocol.Response
		if err := pool.Do(ctx, to.pool.Member(to.pool.Locate(req.Key)).Server, nil, req, resp[:]); err != nil {
			result = shadowError
		}
	}
	s.shadowResult(to.from, result)
}

// The results of moxi_shadow_requests_total.
const (
	shadowOK = iota
	shadowError
	shadowDropped
	numShadowResults
)

var shadowResultNames = [numShadowResults]string{"ok", "error", "dropped"}

// shadowResult counts a request of pool copied to its shadow pool, by result.
func (s *Shared) shadowResult(pool string, result int) {
	s.shadowRequests.WithLabelValues(pool, shadowResultNames[result]).Inc()
}
