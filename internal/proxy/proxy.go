// Package proxy is the request path: it routes each request by key prefix to a pool and by
// the pool's placement to a server, splits multi-key gets per server, and gathers the answers
// in request order.
package proxy

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/dedup"
	"github.com/moxi-proxy/moxi/internal/fireforget"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/route"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
	"github.com/moxi-proxy/moxi/internal/writeguard"
)

// Options configure a Proxy. The zero value of each field is usable.
type Options struct {
	Release  string                // the release number, x.y.z: the number "version" answers
	Build    string                // the build string, answered after the name when it is not Release
	Registry prometheus.Registerer // where the request metrics go; nil = not exported
	// LatencyBuckets are moxi_request_duration_seconds' buckets; nil = the config's default
	// (config.Metrics.Buckets).
	LatencyBuckets []float64
	// Connections reports the frontend's current and total client connections for "stats";
	// nil reports zeros.
	Connections func() (current, total uint64)
	// MaxConnections is reported as max_connections in "stats".
	MaxConnections int
	// Settings lists the running config for "stats settings"; nil answers no lines.
	Settings func() []protocol.Stat
	// MaxPending bounds the fire-and-forget writes queued at once; 0 = the config's default.
	MaxPending int
	// MaxPendingBytes bounds their keys and values; 0 = the config's default.
	MaxPendingBytes int
	// Features is what the topologies' composed servers share (backup, warm_from and shadow
	// pools, package route): the proxy counts its writes in flight there, and closes it.
	// nil = a Shared of the proxy's own, for topologies that compose no features.
	Features *route.Shared
	// Peers, when set, is told each key written through this proxy that another moxi's hot
	// cache may hold, once the write is acknowledged, and each flush_all (hot_cache.peers).
	Peers  Peers
	Logger *slog.Logger // nil = slog.Default()
}

// Peers are the other moxi of the tier, as the proxy tells them what was written through
// it (package peers).
type Peers interface {
	Invalidate(pool string, key []byte)
	FlushAll()
}

// Proxy answers client requests from the servers of its current Topology. Safe for
// concurrent use; Swap changes the topology for requests that start afterwards.
type Proxy struct {
	topo    atomic.Pointer[topology.Topology]
	opts    Options
	version string // answered to "version" (versionAnswer)
	started time.Time
	stats   counters
	metrics *metrics

	features *route.Shared                  // shared with the topologies' composed servers
	writes   *writeguard.Guard              // writes in flight, which end sharing for their keys: features.Writes
	flights  dedup.Group[protocol.Response] // get/gets in flight, for dedup
	queue    *fireforget.Queue              // fire-and-forget writes
	// expiryAsks holds a token per hot cache fill asking its item's expiry (fillHot).
	expiryAsks chan struct{}
}

// fireAndForgetWorkers write queued writes; a key always goes to the same one, in order.
const fireAndForgetWorkers = 8

// New returns a proxy serving topo.
func New(topo *topology.Topology, opts Options) *Proxy {
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	def := config.Default()
	if opts.MaxPending <= 0 {
		opts.MaxPending = def.FireAndForget.MaxPending
	}
	if opts.MaxPendingBytes <= 0 {
		opts.MaxPendingBytes = def.FireAndForget.MaxPendingBytes
	}
	if opts.LatencyBuckets == nil {
		opts.LatencyBuckets = def.Metrics.Buckets()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	p := &Proxy{opts: opts, version: versionAnswer(opts.Release, opts.Build), started: time.Now()}
	p.features = opts.Features
	if p.features == nil {
		p.features = route.NewShared(route.Options{Logger: opts.Logger})
	}
	p.writes = &p.features.Writes
	p.expiryAsks = make(chan struct{}, maxExpiryAsks)
	p.queue = fireforget.New(fireAndForgetWorkers, opts.MaxPending, opts.MaxPendingBytes, p.writeQueued, opts.Logger)
	p.metrics = newMetrics(reg, opts.LatencyBuckets, func() float64 { return float64(p.queue.Pending()) })
	p.Swap(topo)
	counter := func(name, help string, v func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v()) })
	}
	reg.MustRegister(
		counter("moxi_fire_and_forget_written_total", "Fire-and-forget writes the server stored.", func() uint64 { w, _ := p.queue.Counts(); return w }),
		counter("moxi_fire_and_forget_failed_total", "Fire-and-forget writes that failed (no answer, or not stored).", func() uint64 { _, f := p.queue.Counts(); return f }),
	)
	return p
}

// Close writes out the fire-and-forget queue, then waits for the copies to backup pools
// and sends what is queued for shadow pools (route.Shared.Close), or gives up when ctx
// ends (what is left of them is then cancelled). Requests must have stopped (the frontend
// shut down) before.
func (p *Proxy) Close(ctx context.Context) error {
	qerr := p.queue.Close(ctx)
	return errors.Join(qerr, p.features.Close(ctx))
}

// Swap installs a new topology; requests in flight finish on the one they started with.
func (p *Proxy) Swap(t *topology.Topology) {
	p.topo.Store(t)
}

// Topology is the topology new requests use.
func (p *Proxy) Topology() *topology.Topology { return p.topo.Load().Current() }

// Handle answers reqs in order, appending their responses to resps and returning the
// extended slice: a lone request (len(reqs) == 1) all of its responses (one per key for a
// retrieval, else one); a run of pipelined single-key requests (writes, and get/gets of one
// key, see run) one response each. quit and noop never reach it: they are the
// connection's business.
func (p *Proxy) Handle(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response) []protocol.Response {
	return p.handle(ctx, order, "", reqs, resps)
}

// Listener is the proxy as the clients of the listener at an address see it (config
// listeners): the keys no route matches go to that listener's default pool
// (topology.ForListener). Everything else is the proxy's.
type Listener struct {
	p    *Proxy
	addr string
}

// ForListener is the proxy for the clients of the listener at addr, as the config writes
// the address.
func (p *Proxy) ForListener(addr string) Listener { return Listener{p, addr} }

// Handle is Proxy.Handle for the listener's clients.
func (l Listener) Handle(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response) []protocol.Response {
	return l.p.handle(ctx, order, l.addr, reqs, resps)
}

// Start is Proxy.Start for the listener's clients.
func (l Listener) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, done func()) bool {
	return l.p.start(ctx, order, l.p.topology(l.addr), reqs, resps, done)
}

// handle is Handle for the clients of the listener at listener ("": the main one): Start,
// waiting for it, else the requests Start does not take.
func (p *Proxy) handle(ctx context.Context, order *turn.Turn, listener string, reqs []protocol.Request, resps []protocol.Response) []protocol.Response {
	t := p.topology(listener)
	base := len(resps)
	n := len(reqs)
	if n == 1 && reqs[0].Op.IsRetrieval() {
		n = len(reqs[0].Keys)
	}
	for range n {
		resps = append(resps, protocol.Response{})
	}
	if p.startAndWait(ctx, order, t, reqs, resps[base:]) {
		return resps
	}
	if len(reqs) == 1 {
		p.handleOne(ctx, order, t, &reqs[0], resps[base:])
	} else {
		p.run(ctx, order, t, reqs, resps[base:])
	}
	return resps
}

// startAndWait is start, waiting for its answers: false when start did not take reqs.
func (p *Proxy) startAndWait(ctx context.Context, order *turn.Turn, t *topology.Topology, reqs []protocol.Request, resps []protocol.Response) bool {
	w := getWaiter()
	if !p.start(ctx, order, t, reqs, resps, w.doneFunc) {
		putWaiter(w)
		return false
	}
	<-w.done
	putWaiter(w)
	return true
}

// waiter is what startAndWait waits on: pooled, as it serves every request Handle takes.
type waiter struct {
	done     chan struct{}
	doneFunc func()
}

var waiters = sync.Pool{New: func() any {
	w := &waiter{done: make(chan struct{}, 1)}
	w.doneFunc = func() { w.done <- struct{}{} }
	return w
}}

func getWaiter() *waiter  { return waiters.Get().(*waiter) }
func putWaiter(w *waiter) { waiters.Put(w) }

// handleOne answers a lone request that Start does not take, in one (resps[0]): a request
// without a key, or a fire-and-forget write.
func (p *Proxy) handleOne(ctx context.Context, order *turn.Turn, t *topology.Topology, req *protocol.Request, one []protocol.Response) {
	start := time.Now()
	toEvery := (req.Op == protocol.OpFlushAll || req.Op == protocol.OpCacheMemlimit) && !t.NoFlushAll
	queued := inBackground(t, req)
	if !toEvery && !queued {
		order.Dispatched() // nothing of it goes to a server in the connection's order
	}
	switch {
	case toEvery:
		one[0] = p.everyServer(ctx, order, t, req)
		if req.Op == protocol.OpFlushAll {
			if p.opts.Peers != nil {
				p.opts.Peers.FlushAll()
			}
			if t.Hot != nil {
				t.Hot.Purge()
			}
			p.flights.ForgetAll()
		}
	case req.Op == protocol.OpFlushAll:
		one[0] = flushRefused
	case req.Op == protocol.OpCacheMemlimit:
		one[0] = memlimitRefused
	case req.Op == protocol.OpVersion:
		one[0] = protocol.Response{Value: []byte(p.version)}
	case req.Op == protocol.OpVerbosity:
		one[0] = protocol.Response{} // moxi logs by --log-level; accepted like memcached
	case req.Op == protocol.OpStats:
		one[0] = p.statsResponse(ctx, t, req)
	case req.Op == protocol.OpMetaNoop:
		one[0] = protocol.Response{Meta: protocol.MetaAnswer{Code: protocol.MetaMN}}
	case queued:
		p.beginWrite(t, req.Key)
		one[0] = p.enqueue(ctx, req) // in the queue's order of its key, before the turn is given on
		order.Dispatched()
		p.endWrite(t, req.Key)
	default:
		one[0] = protocol.Response{Status: protocol.StatusUnknownCommand} // never: Start takes every other request
	}
	var pl *pool.Pool
	if queued {
		pl = t.PoolFor(req.Key)
	}
	p.account(t, pl, req, one, time.Since(start).Seconds())
}

// account counts a request of pl (nil: of no pool) answered with resps, which took seconds.
func (p *Proxy) account(t *topology.Topology, pl *pool.Pool, req *protocol.Request, resps []protocol.Response, seconds float64) {
	var n tally
	p.note(t, pl, req, resps, &n)
	p.metrics.answered(p.add(pl, &n), 1, seconds)
}

// note records a request of pl (nil: of no pool) answered with resps: its keys' heat and
// "stats detail" at once, its counts in n, which add then adds to the shared counters once
// for a whole run.
func (p *Proxy) note(t *topology.Topology, pl *pool.Pool, req *protocol.Request, resps []protocol.Response, n *tally) {
	if t.HotKeys != nil {
		noteHot(t, pl, req, resps)
	}
	p.stats.detail.record(req, resps) // one atomic load while "stats detail" is off
	n.count(req, resps)
}

// add adds n, requests of pl (nil: of no pool), to the counters, and returns pl's series.
func (p *Proxy) add(pl *pool.Pool, n *tally) *poolMetrics {
	p.stats.add(n)
	name := ""
	if pl != nil {
		name = pl.Name()
	}
	pm := p.metrics.pool(name)
	pm.add(n)
	return pm
}

// flushRefused is memcached -F's answer to flush_all (text) and flush (binary: status
// 0x0020 with its own text, which the codec writes).
var flushRefused = protocol.Response{Status: protocol.StatusAuthError, Msg: "flush_all not allowed"}

// memlimitRefused answers cache_memlimit as flushRefused answers flush_all (text only: it has
// no binary or meta form): a client that may not empty the servers may not shrink them.
var memlimitRefused = protocol.Response{Status: protocol.StatusAuthError, Msg: "cache_memlimit not allowed"}

// CountRejected counts the answer to a request the client's decoder rejected (the
// frontend answers those itself) in moxi_error_answers_total.
func (p *Proxy) CountRejected(e *protocol.RequestError) { p.metrics.rejected(e.Status) }

// do runs a single-key request for key in pl on the member that serves it (see recover).
func (p *Proxy) do(ctx context.Context, order *turn.Turn, pl *pool.Pool, key []byte, req *protocol.Request, resps []protocol.Response) {
	m, err := p.attempt(ctx, order, pl, key, req, resps)
	p.recover(ctx, order, pl, key, req, resps, m, err)
}

// attempt sends a single-key request for key to the member of pl that serves it now (with
// failover, perhaps as a stand-in: its server then remembers the write, see pool.New).
func (p *Proxy) attempt(ctx context.Context, order *turn.Turn, pl *pool.Pool, key []byte, req *protocol.Request, resps []protocol.Response) (*pool.Member, error) {
	m := pl.Member(pl.Locate(key))
	return m, pool.Do(ctx, m.Server, order, req, resps)
}

// recover follows up a single-key request that m did not answer (err; nothing to do when
// nil). After a timeout or a connection error (never after an answer) it tries again, up
// to the pool's retries, on whoever serves the key by then: with failover, another server
// once the first has been marked dead. Then it gives up with a SERVER_ERROR in every
// answer.
func (p *Proxy) recover(ctx context.Context, order *turn.Turn, pl *pool.Pool, key []byte, req *protocol.Request, resps []protocol.Response, m *pool.Member, err error) {
	for attempt := 0; err != nil; attempt++ {
		if attempt >= pl.Retries() || !req.Op.Repeatable() || ctx.Err() != nil {
			failAll(m, err, req, resps)
			return
		}
		m, err = p.attempt(ctx, order, pl, key, req, resps)
	}
}

// failAll answers every response of req with the SERVER_ERROR for err on m (backendMsg).
func failAll(m *pool.Member, err error, req *protocol.Request, resps []protocol.Response) {
	failed := protocol.Response{Status: protocol.StatusTempFailure, Msg: backendMsg(m, err)}
	for i := range resps {
		resps[i] = failed
		if req.Op.IsRetrieval() {
			resps[i].Key = req.Keys[i]
		}
	}
}

// backendMsg is the SERVER_ERROR text for err from m's server. The backend's errors begin
// with the server's address already, so it is added only when missing; a server whose name
// is not its address is named first ("backend mc3 10.0.0.3:11211: server marked dead").
func backendMsg(m *pool.Member, err error) string {
	reason := err.Error()
	if !strings.HasPrefix(reason, m.Addr+": ") {
		reason = m.Addr + ": " + reason
	}
	if !strings.HasPrefix(m.Addr, m.Name) {
		reason = m.Name + " " + reason
	}
	return "backend " + reason
}

// everyServer sends req (flush_all, cache_memlimit) to every server of every pool, all at
// once; the answer is OK when every server said OK, else the first other answer.
func (p *Proxy) everyServer(ctx context.Context, order *turn.Turn, t *topology.Topology, req *protocol.Request) protocol.Response {
	members := t.Members()
	answers := make([]protocol.Response, len(members))
	parts := make([]pool.Part, len(members))
	for i, m := range members {
		parts[i] = pool.Part{Server: m.Server, Reqs: []protocol.Request{*req}, Resps: answers[i : i+1], Errs: make([]error, 1)}
	}
	pool.DoParts(ctx, order, parts)
	for i, m := range members {
		if err := parts[i].Errs[0]; err != nil {
			failAll(m, err, req, answers[i:i+1])
		}
	}
	for _, a := range answers {
		if a.Status != protocol.StatusOK || a.Value != nil {
			return a
		}
	}
	return protocol.Response{}
}

// Took counts n client requests of op that took seconds, from their first byte read to
// their answer's last byte written (frontend.Timer): moxi_request_duration_seconds.
func (p *Proxy) Took(op protocol.Op, n int, seconds float64) { p.metrics.took(op, n, seconds) }

// Took is Proxy.Took for the listener's clients.
func (l Listener) Took(op protocol.Op, n int, seconds float64) { l.p.metrics.took(op, n, seconds) }

// Locate is where key goes now for a client of the main listener: its pool and the server
// that serves it (the request log names them, frontend.Locator).
func (p *Proxy) Locate(key []byte) (pool, server string) { return locate(p.topology(""), key) }

// Locate is Proxy.Locate for the listener's clients.
func (l Listener) Locate(key []byte) (pool, server string) { return locate(l.p.topology(l.addr), key) }

func locate(t *topology.Topology, key []byte) (pool, server string) {
	pl := t.PoolFor(key)
	return pl.Name(), pl.Member(pl.Locate(key)).Name
}

// Addr is the listener's address.
func (l Listener) Addr() string { return l.addr }

// settlePoll is how often Settled looks at the fire-and-forget queue.
const settlePoll = 5 * time.Millisecond

// Settled waits until no fire-and-forget write is queued or being written, or ctx ends:
// before a client connection goes to a successor process (an upgrade), so that a read it
// sends there cannot overtake a write this process answered STORED.
func (p *Proxy) Settled(ctx context.Context) error {
	for p.queue.Pending() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(settlePoll):
		}
	}
	return nil
}
