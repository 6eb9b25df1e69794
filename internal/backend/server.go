// Package backend is a pool.Server for one remote memcached: a few persistent
// binary-protocol connections, each carrying many client requests pipelined at once and
// matched back to their callers by opaque.
package backend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
	"github.com/moxi-proxy/moxi/internal/walk"
)

var _ pool.Server = (*Server)(nil)

// Options configure a Server. Connections, ConnectTimeout, Timeout, FailureLimit, RetryMin
// and RetryMax are required (New panics without them): their defaults are the config's, the
// one table of defaults (config.NewPool), which the topology passes on.
type Options struct {
	Addr           string          // host:port of the memcached server
	Connections    int             // persistent connections
	ConnectTimeout time.Duration   // per dial
	Timeout        time.Duration   // how long the server may send nothing while it owes an answer, or take nothing moxi writes
	FailureLimit   int             // consecutive failures that mark the server dead
	RetryMin       time.Duration   // first wait before probing a dead server
	RetryMax       time.Duration   // the wait doubles up to this
	MaxInFlight    int             // requests waiting for answers; past it a request waits up to Timeout for room; 0 = MaxInFlight
	Limits         protocol.Limits // bounds on answers; protocol.DefaultLimits when zero
	TLS            *tls.Config     // set: every connection to the server is TLS (see Dial); nil: plaintext
	SASL           SASL            // set: every connection authenticates first, and text requests are answered by moxi (sasl.go)
	Pool           string          // the server's pool, which messages about its settings name
	Logger         *slog.Logger    // nil = slog.Default()
	// Observe, when set, is given the seconds from send to answer of every answered request.
	Observe func(seconds float64)
	// Restarted, when set, is called (on a goroutine of its own) when the server's start
	// instant moved forward: memcached restarted, empty (restart.go). startedAt is the new
	// instant, in unix seconds: the same on every proxy that asks.
	Restarted func(startedAt int64)

	dial func(ctx context.Context) (net.Conn, error) // tests: replaces Dial
}

// MaxInFlight is the documented bound (docs/resource-bounds.md) on the requests waiting for one server at a time.
const MaxInFlight = 4096

func (o *Options) setDefaults() {
	if o.Connections <= 0 || o.ConnectTimeout <= 0 || o.Timeout <= 0 || o.FailureLimit <= 0 || o.RetryMin <= 0 || o.RetryMax < o.RetryMin {
		panic(fmt.Sprintf("backend: incomplete Options for %s: %+v", o.Addr, *o))
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = MaxInFlight
	}
	if o.Limits == (protocol.Limits{}) {
		o.Limits = protocol.DefaultLimits()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Errors a request can end with when the server did not answer.
var (
	ErrTimeout  = errors.New("timeout")
	ErrDown     = errors.New("not connected")
	ErrClosed   = errors.New("server closed")
	ErrOverload = errors.New("too many requests in flight")
)

// Server sends requests to one memcached server. Safe for concurrent use.
type Server struct {
	opts  Options
	epoch time.Time // the origin of clock
	conns []*conn
	next  atomic.Uint32
	calls sync.Pool      // of *call
	quit  chan struct{}  // closed by Close: dialers and the prober stop
	wg    sync.WaitGroup // the connections' goroutines and the prober
	once  sync.Once
	slots chan struct{} // one token per request in flight: the back-pressure bound

	health health
	meta   metaConns  // text connections for meta requests (meta.go)
	starts startCheck // the server's start instant (restart.go)

	requests, timeouts, down, ioErrors, overloads atomic.Uint64 // requests sent and how they failed
	inFlight                                      atomic.Int64
	writes                                        atomic.Uint64 // system calls that wrote requests
}

// New returns a Server for opts.Addr and starts connecting in the background; requests made
// before a connection is up wait for it up to their timeout.
func New(opts Options) *Server {
	opts.setDefaults()
	s := &Server{opts: opts, epoch: time.Now(), quit: make(chan struct{}), slots: make(chan struct{}, opts.MaxInFlight)}
	s.health.init()
	s.conns = make([]*conn, opts.Connections)
	for i := range s.conns {
		s.conns[i] = newConn(s, false)
	}
	for _, c := range s.conns {
		s.wg.Add(1)
		go c.dialLoop()
	}
	return s
}

// Addr is the server's address.
func (s *Server) Addr() string { return s.opts.Addr }

// Close closes every connection, fails the requests in flight with ErrClosed and waits for
// the connections' goroutines to exit.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.health.mu.Lock() // a server dying now starts its prober before, or not at all (die)
		close(s.quit)
		s.health.mu.Unlock()
		for _, c := range s.conns {
			c.shutdown()
		}
		s.closeMeta()
		s.wg.Wait()
	})
	return nil
}

// Start sends reqs (see pool.Server) and returns once they are queued, or once a goroutine
// of its own waits for what they need first: the connection's reader, or its watch (timeout),
// finishes them. A retrieval of several keys is one batch of quiet gets ended by a noop; a
// key repeated in it is asked for once. A run of meta requests goes on a meta connection
// (meta.go); a run mixing both kinds goes one request at a time, each minding its order.
// Meta requests to a server that requires SASL are answered at once (sasl.go).
func (s *Server) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	walk.Step()
	metas := countMeta(reqs)
	switch {
	case metas > 0 && metas < len(reqs):
		pool.StartWaiting(ctx, order, reqs, resps, errs, done, s.do)
		return
	case metas > 0 && s.opts.SASL.set():
		order.Dispatched() // nothing to send
		for i := range reqs {
			resps[i], errs[i] = binaryOnly("meta commands are"), nil
		}
		done()
		return
	case len(reqs) == 1 && reqs[0].Op == protocol.OpCacheMemlimit:
		pool.StartWaiting(ctx, order, reqs, resps, errs, done, s.doText)
		return
	}
	cl := s.getCall()
	switch {
	case metas > 0:
		cl.prepareMeta(reqs)
	case len(reqs) == 1 && reqs[0].Op.IsRetrieval():
		cl.prepareRetrieval(&reqs[0])
	case len(reqs) == 1:
		cl.prepareSingle(&reqs[0])
	default:
		cl.prepareBatch(reqs)
		clear(resps) // a quiet success gets no answer, and stays OK
	}
	cl.then, cl.out, cl.outErrs, cl.count = done, resps, errs, len(reqs)
	if !s.send(ctx, order, cl, false) {
		go s.send(ctx, order, cl, true)
	}
}

// do is Start for one request, waiting for its answer (pool.Do).
func (s *Server) do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	return pool.Do(ctx, s, order, req, resps)
}

// send puts cl on its way: a place among the requests in flight, a connection, the path
// it takes after the client's previous request (turn.Turn.Switch), then its turn given
// on and its packets written; its conn's watch times it out. Without mayWait it only takes
// what is there at once, and reports false, having done nothing, where it would wait — for room, for a
// dial in progress, or for the requests the client sent on the other path (barrier); the
// caller then sends it again from a goroutine of its own, mayWait. True: cl is on its way
// or failed, and will be finished (finish), its turn given on either way.
func (s *Server) send(ctx context.Context, order *turn.Turn, cl *call, mayWait bool) bool {
	n := uint64(cl.count)
	if err := ctx.Err(); err != nil {
		s.fail(order, cl, err) // the client is gone: nothing to send, and nothing said of the server
		return true
	}
	if s.health.dead.Load() {
		s.requests.Add(n)
		s.down.Add(n)
		s.fail(order, cl, fmt.Errorf("%s: %w", s.opts.Addr, ErrDead))
		return true
	}
	path := pathBinary
	if cl.meta {
		path = pathMeta
	}
	if order.WouldSwitch(s, path) {
		if !mayWait {
			return false
		}
		if err := s.barrier(ctx, order, path); err != nil {
			s.requests.Add(n)
			s.fail(order, cl, s.outcome(err, cl.count, time.Now()))
			return true
		}
	}
	if !s.tryAcquire() {
		if !mayWait {
			return false
		}
		if err := s.acquire(ctx); err != nil {
			s.requests.Add(n)
			s.overloads.Add(n)
			s.fail(order, cl, fmt.Errorf("%s: %w", s.opts.Addr, err))
			return true
		}
	}
	var c *conn
	if cl.meta {
		c = s.metaConn(order, true)
	} else {
		c = s.pick(order)
	}
	cl.begun, cl.on = time.Now(), c
	cl.refs.Store(2) // this send and the end of the call: the later finishes it
	if c == nil || !c.enqueue(cl) {
		err := error(ErrClosed)
		if c != nil {
			if !mayWait {
				s.release()
				return false
			}
			// Not connected: wait for a dial in progress, within the request's timeout.
			if err = c.waitReady(ctx, s.opts.Timeout); err == nil && !c.enqueue(cl) {
				err = c.downErr()
			}
		}
		if err != nil {
			s.release()
			s.requests.Add(n)
			s.fail(order, cl, s.outcome(err, cl.count, cl.begun))
			return true
		}
	}
	// Its place among c's requests is fixed: the client's next request may go.
	s.requests.Add(n)
	order.Switch(s, path) // records the path, which WouldSwitch found needs no wait, or barrier waited for
	order.Dispatched()
	c.flush()
	cl.unref()
	return true
}

// fail ends cl, which never went out, with err: its turn given on, then its caller's done.
func (s *Server) fail(order *turn.Turn, cl *call, err error) {
	order.Dispatched()
	for i := range cl.outErrs {
		cl.outErrs[i] = err
	}
	then := cl.then
	s.putCall(cl)
	then()
}

// barrier waits until every request the client connection sent to s on the other path
// than path has been executed (see the top of meta.go): a round trip on that path after
// them — an mn on its meta connection, or a noop on its binary one. It gives nothing on.
func (s *Server) barrier(ctx context.Context, order *turn.Turn, path turn.Path) error {
	var req [1]protocol.Request
	var resp [1]protocol.Response
	var errs [1]error
	cl := s.getCall()
	if path == pathBinary {
		if s.metaConn(order, false) == nil {
			s.putCall(cl)
			return nil // never opened: no request went on it
		}
		req[0].Op = protocol.OpMetaNoop
		cl.prepareMeta(req[:])
	} else {
		req[0].Op = protocol.OpNoop
		cl.prepareSingle(&req[0])
	}
	answered := make(chan struct{})
	cl.then, cl.out, cl.outErrs, cl.count = func() { close(answered) }, resp[:], errs[:], 1
	each, _ := order.Defer() // on the path the previous request took, which it still records
	s.send(ctx, each, cl, true)
	<-answered
	return errs[0]
}

// finish ends a call once it is answered, failed or timed out, and hands the answers to
// its caller.
func (s *Server) finish(cl *call) {
	s.release()
	if cl.chase {
		s.putCall(cl)
		return
	}
	err := s.outcome(cl.result, cl.count, cl.begun)
	for i := range cl.outErrs {
		cl.outErrs[i] = err
	}
	if err == nil && cl.batch == nil { // a run's answers are in out already (answerRun)
		cl.answer(cl.req, cl.out)
	}
	then := cl.then
	s.putCall(cl)
	then()
}

// outcome accounts for the end of n requests sent at start, failed with err or answered,
// in the server's health and counters, and returns err as the caller sees it.
func (s *Server) outcome(err error, n int, start time.Time) error {
	if err != nil {
		switch {
		case errors.Is(err, context.Canceled):
			// the client went away; says nothing about the server
		case ownError(err):
			s.overloads.Add(uint64(n)) // moxi's own want (a dial without descriptors): nor does this
		case errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded):
			s.timeouts.Add(uint64(n))
			s.failed(err)
		case errors.Is(err, ErrDown), errors.Is(err, ErrDead):
			s.down.Add(uint64(n))
			s.failed(err)
		default:
			s.ioErrors.Add(uint64(n))
			s.failed(err)
		}
		return fmt.Errorf("%s: %w", s.opts.Addr, err)
	}
	s.succeeded()
	if s.opts.Observe != nil {
		s.opts.Observe(time.Since(start).Seconds())
	}
	return nil
}

// clock is a monotonic time in nanoseconds since s was made: it fits an atomic.Int64,
// and a step of the wall clock cannot turn into a silence.
func (s *Server) clock() int64 { return int64(time.Since(s.epoch)) }

// tryAcquire takes room among the requests in flight, when there is some.
func (s *Server) tryAcquire() bool {
	select {
	case s.slots <- struct{}{}:
		s.inFlight.Add(1)
		return true
	default:
		return false
	}
}

// acquire waits for room among the requests in flight, up to the request timeout.
func (s *Server) acquire(ctx context.Context) error {
	t := time.NewTimer(s.opts.Timeout)
	defer t.Stop()
	select {
	case s.slots <- struct{}{}:
		s.inFlight.Add(1)
		return nil
	case <-t.C:
		return ErrOverload
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Server) release() {
	s.inFlight.Add(-1)
	<-s.slots
}

// Counters reads the server's counters.
func (s *Server) Counters() pool.Counters {
	up := 0
	for _, c := range s.conns {
		if c.up.Load() {
			up++
		}
	}
	return pool.Counters{
		Requests:      s.requests.Load(),
		Timeouts:      s.timeouts.Load(),
		Connect:       s.down.Load(),
		IO:            s.ioErrors.Load(),
		Overload:      s.overloads.Load(),
		InFlight:      s.inFlight.Load(),
		Connections:   len(s.conns),
		ConnectionsUp: up,
		Writes:        s.writes.Load(),
	}
}

// Info is the server's state and counters (see pool.Server).
func (s *Server) Info() pool.Info {
	st := pool.StateUp
	if !s.Up() {
		st = pool.StateDead
	}
	return pool.Info{State: st, Reason: s.deadReason(), Counters: s.Counters()}
}

// Stats are moxi's counters for this server, for "stats proxy".
func (s *Server) Stats() []protocol.Stat {
	info := s.Info()
	c := info.Counters
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	return []protocol.Stat{
		{Name: "state", Value: string(info.State)},
		{Name: "connections", Value: strconv.Itoa(c.Connections)},
		{Name: "connections_up", Value: strconv.Itoa(c.ConnectionsUp)},
		{Name: "requests", Value: u(c.Requests)},
		{Name: "in_flight", Value: strconv.FormatInt(c.InFlight, 10)},
		{Name: "errors_timeout", Value: u(c.Timeouts)},
		{Name: "errors_connect", Value: u(c.Connect)},
		{Name: "errors_io", Value: u(c.IO)},
		{Name: "errors_overload", Value: u(c.Overload)},
		{Name: "writes", Value: u(c.Writes)},
	}
}

// pick chooses a connection. A request with a turn goes on its client connection's
// backend connection while that is up: memcached executes one connection's requests in
// order, so the client's order, fixed by its turns, is the order they run in. Any other
// request goes on one whose next write is already pending, so that it joins that batch
// (fewer, larger writes are what makes a proxy fast), else the next one that is up,
// round-robin, which spreads load over the server's worker threads.
func (s *Server) pick(order *turn.Turn) *conn {
	n := uint32(len(s.conns))
	if a, ok := order.Affinity(); ok {
		// Being dialed (first dial, or a redial): the request waits for it (queue) rather
		// than go on another connection, where a later request of the client could be
		// executed before an earlier one on this.
		if c := s.conns[a%n]; c.up.Load() || c.beingDialed() {
			return c
		}
	}
	for _, c := range s.conns {
		if c.pending.Load() {
			return c
		}
	}
	start := s.next.Add(1)
	for i := range n {
		c := s.conns[(start+i)%n]
		if c.up.Load() {
			return c
		}
	}
	return s.conns[start%n]
}

func (s *Server) getCall() *call {
	if cl, ok := s.calls.Get().(*call); ok {
		return cl
	}
	return newCall(s)
}

func (s *Server) putCall(cl *call) {
	if cl.orphaned {
		return
	}
	cl.reset()
	s.calls.Put(cl)
}
