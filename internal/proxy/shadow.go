package proxy

import (
	"context"
	"sync"
	"time"

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
	shadowQueued    = 1024 // requests waiting, at most (shadowQueued/shadowWorkers a worker)
	shadowTimeoutAt = 5 * time.Second
)

// shadowed reports whether key is among the fraction of keys shadowed. The hash is FNV-1a
// 64 of the key, salted and finished with a mixer, so that it is stable across processes
// and restarts (a key is always or never shadowed, on every proxy of a tier) and unrelated
// to the ring's placement of the key (fnv1a_64 may be a pool's ring hash).
func shadowed(key []byte, fraction float64) bool {
	return fraction >= 1 || float64(shadowHash(key)>>11) < fraction*(1<<53)
}

// shadowHash is the hash shadowed compares; its low bits pick a key's worker.
func shadowHash(key []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range []byte("moxi/shadow:") {
		h = (h ^ uint64(c)) * 1099511628211
	}
	for _, c := range key {
		h = (h ^ uint64(c)) * 1099511628211
	}
	h ^= h >> 33 // murmur3's fmix64
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// shadowJob is one request copied for a shadow pool; it owns its bytes, and holds bytes of
// the proxy's background budget until it is sent.
type shadowJob struct {
	pool  *pool.Pool
	from  string // the shadowed pool's name, for the metric
	req   protocol.Request
	bytes int64
}

// shadowQueue holds shadow requests for its workers, which start with the first request
// and exit at close.
type shadowQueue struct {
	jobs    []chan *shadowJob // a worker's each, by key; never closed: close signals stop
	start   sync.Once
	stop    chan struct{}   // closed by close
	ctx     context.Context // of the requests sent; cancelled when close is done or gives up
	cancel  context.CancelFunc
	mu      sync.Mutex // closed
	closed  bool
	workers sync.WaitGroup
}

func newShadowQueue() *shadowQueue {
	ctx, cancel := context.WithCancel(context.Background())
	q := &shadowQueue{stop: make(chan struct{}), ctx: ctx, cancel: cancel}
	for range shadowWorkers {
		q.jobs = append(q.jobs, make(chan *shadowJob, shadowQueued/shadowWorkers))
	}
	return q
}

// shadow copies req's shadowed keys onto the queue, one job per shadow pool; called after
// req is answered.
func (p *Proxy) shadow(t *topology.Topology, req *protocol.Request) {
	if req.Op.IsRetrieval() {
		// Keys of one request usually share one pool: one job per shadow pool reached.
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
				p.enqueueShadow(sh.Pool, pl.Name(), req, keys)
			}
		}
		return
	}
	if len(req.Key) == 0 || req.Op == protocol.OpStats {
		return
	}
	pl := t.PoolFor(req.Key)
	if sh := t.Shadows[pl]; sh.Pool != nil && shadowed(req.Key, sh.Fraction) {
		p.enqueueShadow(sh.Pool, pl.Name(), req, nil)
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

// enqueueShadow queues a copy of req (with keys as its keys, for a retrieval) for dst, or
// drops it when the queue is full or closed or the background budget is spent.
func (p *Proxy) enqueueShadow(dst *pool.Pool, from string, req *protocol.Request, keys [][]byte) {
	k := req.Key
	if keys != nil {
		k = keys[0]
	}
	if !dst.Member(dst.Locate(k)).Server.Up() {
		// Marked dead: the request would fail at once; not copying it spares the clients'
		// CPU while the shadow pool is down.
		p.metrics.shadowResult(from, shadowError)
		return
	}
	q := p.shadows
	job := &shadowJob{pool: dst, from: from, req: copyRequest(req, keys)}
	job.bytes = requestBytes(&job.req)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || !p.background.TryAcquire(job.bytes) {
		p.metrics.shadowResult(from, shadowDropped)
		return
	}
	q.start.Do(func() {
		for _, jobs := range q.jobs {
			q.workers.Add(1)
			go p.shadowWorker(jobs) // exits when q.stop closes
		}
	})
	select {
	case q.jobs[shadowHash(k)%shadowWorkers] <- job:
	default:
		p.background.Release(job.bytes)
		p.metrics.shadowResult(from, shadowDropped)
	}
}

// shadowWorker sends the shadow requests queued on jobs until the queue closes, then what
// is left.
func (p *Proxy) shadowWorker(jobs <-chan *shadowJob) {
	q := p.shadows
	defer q.workers.Done()
	for {
		select {
		case job := <-jobs:
			p.sendShadow(job)
		case <-q.stop:
			for {
				select {
				case job := <-jobs:
					p.sendShadow(job)
				default:
					return
				}
			}
		}
	}
}

// sendShadow sends job, counts the result and gives back its bytes.
func (p *Proxy) sendShadow(job *shadowJob) {
	defer p.background.Release(job.bytes)
	result := shadowOK
	if err := sendShadow(p.shadows.ctx, job); err != nil {
		result = shadowError
	}
	p.metrics.shadowResult(job.from, result)
}

// sendShadow sends a job to its pool's servers, a retrieval's keys split by server.
func sendShadow(ctx context.Context, job *shadowJob) error {
	ctx, cancel := context.WithTimeout(ctx, shadowTimeoutAt)
	defer cancel()
	pl, req := job.pool, &job.req
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

// close stops taking requests and waits for the workers to send what is queued, or, when
// ctx ends first, cancels what they are sending (the rest fails at once) and waits for them.
func (q *shadowQueue) close(ctx context.Context) error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.stop)
	}
	q.mu.Unlock()
	done := make(chan struct{})
	go func() { q.workers.Wait(); close(done) }() // exits when the workers have
	select {
	case <-done:
		q.cancel()
		return nil
	case <-ctx.Done():
		q.cancel()
		<-done
		return ctx.Err()
	}
}

// copyRequest copies what a server needs of req into one new buffer (request bytes belong
// to the client's connection, and the job outlives the handler), with keys as the keys of
// a retrieval. Replies the client asked to suppress are asked for: the shadow's answers
// are read and thrown away.
func copyRequest(req *protocol.Request, keys [][]byte) protocol.Request {
	n := len(req.Key) + len(req.Value) + len(req.Meta.KeyToken)
	for _, k := range keys {
		n += len(k)
	}
	for _, f := range req.Meta.Flags {
		n += len(f.Token)
	}
	buf := make([]byte, 0, n)
	clone := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		buf = append(buf, b...)
		return buf[len(buf)-len(b) : len(buf) : len(buf)]
	}
	c := protocol.Request{
		Op: req.Op, Flags: req.Flags, Exptime: req.Exptime, Cas: req.Cas, Delta: req.Delta,
		Initial: req.Initial, Create: req.Create, Opcode: req.Opcode, Binary: req.Binary, WithKey: req.WithKey,
	}
	c.Key = clone(req.Key)
	c.Value = clone(req.Value)
	if keys != nil {
		c.Keys = make([][]byte, len(keys))
		for i, k := range keys {
			c.Keys[i] = clone(k)
		}
	}
	if req.Op.IsMeta() {
		c.Meta = req.Meta
		c.Meta.KeyToken = clone(req.Meta.KeyToken)
		c.Meta.Flags = make([]protocol.MetaFlag, 0, len(req.Meta.Flags))
		for _, f := range req.Meta.Flags {
			if f.Letter == 'q' {
				continue
			}
			c.Meta.Flags = append(c.Meta.Flags, protocol.MetaFlag{Letter: f.Letter, Token: clone(f.Token)})
		}
		c.Meta.Quiet = false
	}
	return c
}

// requestBytes is about the memory a copy of r held in the background holds.
func requestBytes(r *protocol.Request) int64 {
	n := 256 + len(r.Key) + len(r.Value) + len(r.Meta.KeyToken) + 24*len(r.Meta.Flags)
	for _, k := range r.Keys {
		n += 24 + len(k)
	}
	return int64(n)
}

// The results of moxi_shadow_requests_total.
const (
	shadowOK = iota
	shadowError
	shadowDropped
	numShadowResults
)

var shadowResultNames = [numShadowResults]string{"ok", "error", "dropped"}
