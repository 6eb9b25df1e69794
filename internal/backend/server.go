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

var (
	_ pool.Server  = (*Server)(nil)
	_ pool.Starter = (*Server)(nil)
)

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
	meta   metaConns // text connections for meta requests (meta.go)

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
		close(s.quit)
		for _, c := range s.conns {
			c.shutdown()
		}
		s.closeMeta()
		s.wg.Wait()
	})
	return nil
}

// Do sends req and waits for its answer (see pool.Server). A retrieval of several keys is
// one batch of quiet gets ended by a noop; a key repeated in it is asked for once.
func (s *Server) Do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	switch {
	case req.Op.IsMeta():
		return s.doMeta(ctx, order, req, &resps[0])
	case req.Op == protocol.OpCacheMemlimit:
		return s.doText(ctx, order, req, &resps[0])
	}
	cl := s.getCall()
	defer s.putCall(cl)
	if req.Op.IsRetrieval() {
		cl.prepareRetrieval(req)
	} else {
		cl.prepareSingle(req)
	}
	if err := s.exchange(ctx, order, cl, 1); err != nil {
		return err
	}
	cl.answer(req, resps)
	return nil
}

// DoBatch sends reqs as one run of packets and waits for their answers (see
// pool.Server): a connection failure or a timeout fails them all. A run of meta requests
// goes on a meta connection (meta.go); a run mixing both kinds goes one request at a time.
func (s *Server) DoBatch(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
	switch metas := countMeta(reqs); {
	case metas == len(reqs):
		s.doMetaBatch(ctx, order, reqs, resps, errs)
		return
	case metas > 0: // both kinds of connection: one request at a time, each minding its order
		pool.DoEach(ctx, order, s, reqs, resps, errs)
		return
	}
	cl := s.getCall()
	defer s.putCall(cl)
	cl.prepareBatch(reqs)
	err := s.exchange(ctx, order, cl, len(reqs))
	for i := range reqs {
		errs[i] = err
		if err == nil {
			resps[i] = answerSingle(&reqs[i], &cl.resps[i])
		}
	}
}

// StartBatch sends reqs as DoBatch does (or one get of many keys as Do does), but returns
// once they are queued: the connection's reader finishes them when their answers arrive
// (pool.Starter). It declines (false) what would make it wait: no room among the requests
// in flight, no connection up, a dead server, a switch of path (turn.Turn.Switch), a run mixing
// meta and other requests. Meta requests to a server that requires SASL are answered at once
// (see doMetaBatch).
func (s *Server) StartBatch(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) bool {
	walk.Step()
	path := pathBinary
	switch metas := countMeta(reqs); {
	case metas == len(reqs):
		path = pathMeta
	case metas > 0:
		return false
	}
	if path == pathMeta && s.opts.SASL.set() {
		return pool.StartNow(ctx, order, s, reqs, resps, errs, done) // answered by moxi, at once
	}
	if ctx.Err() != nil || s.health.dead.Load() || order.WouldSwitch(s, path) {
		return false
	}
	select {
	case s.slots <- struct{}{}:
		s.inFlight.Add(1)
	default:
		return false
	}
	cl := s.getCall()
	var c *conn
	switch {
	case path == pathMeta:
		c = s.metaConn(order, true)
		cl.prepareMeta(reqs)
	case len(reqs) == 1 && len(reqs[0].Keys) > 1:
		c = s.pick(order)
		cl.prepareRetrieval(&reqs[0]) // a get of many keys, answered as Do answers it
	default:
		c = s.pick(order)
		cl.prepareBatch(reqs)
	}
	cl.then, cl.out, cl.outErrs, cl.count, cl.begun, cl.on = done, resps, errs, len(reqs), time.Now(), c
	cl.refs.Store(2)
	if c == nil || !c.enqueue(cl) {
		cl.then = nil
		s.putCall(cl)
		s.release()
		return false
	}
	s.requests.Add(uint64(len(reqs)))
	order.Switch(s, path) // records the path, which WouldSwitch found needs no wait
	order.Dispatched()
	cl.alarm.Reset(s.opts.Timeout)
	c.flush()
	cl.unref()
	return true
}

// finishStarted ends a started call once it is answered, failed or timed out, and hands
// the answers to its caller.
func (s *Server) finishStarted(cl *call) {
	if !cl.orphaned {
		cl.alarmMu.Lock()
		stopped := cl.alarm.Stop()
		cl.alarmMu.Unlock()
		if !stopped {
			cl.orphaned = true // onAlarm is running: it must not find the call reused
		}
	}
	s.release()
	err := s.outcome(cl.result, cl.count, cl.begun)
	for i := range cl.outErrs {
		cl.outErrs[i] = err
	}
	switch {
	case err != nil:
	case cl.meta:
		copy(cl.out, cl.resps)
	case cl.req != nil:
		cl.answer(cl.req, cl.out)
	default:
		for i := range cl.batch {
			cl.out[i] = answerSingle(&cl.batch[i], &cl.resps[i])
		}
	}
	then := cl.then
	s.putCall(cl)
	then()
}

// exchange sends cl, which stands for n client requests, and waits for its answers,
// keeping the server's health and counters.
//
// It gives the requests' turn on (package turn) once their order among the connection's
// requests is fixed, when cl is queued, or when it fails before that; a request with a turn
// goes on its client connection's backend connection (turn.Turn.Affinity).
func (s *Server) exchange(ctx context.Context, order *turn.Turn, cl *call, n int) error {
	if order.Switch(s, pathBinary) {
		// The client's previous request to s went on a meta connection (see meta.go).
		if err := s.metaBarrier(ctx, order); err != nil {
			order.Dispatched()
			s.requests.Add(uint64(n))
			return s.outcome(err, n, time.Now())
		}
	}
	return s.send(ctx, order, cl, n)
}

// send is exchange once the order of cl among its client's requests is safe.
func (s *Server) send(ctx context.Context, order *turn.Turn, cl *call, n int) error {
	dispatched := false
	defer func() {
		if !dispatched { // failed before it was queued (or panicked): the client may go on
			order.Dispatched()
		}
	}()
	if err := ctx.Err(); err != nil {
		return err // the client is gone: nothing to send
	}
	s.requests.Add(uint64(n))
	if s.health.dead.Load() {
		s.down.Add(uint64(n))
		return fmt.Errorf("%s: %w", s.opts.Addr, ErrDead)
	}
	if err := s.acquire(ctx); err != nil {
		s.overloads.Add(uint64(n))
		return fmt.Errorf("%s: %w", s.opts.Addr, err)
	}
	defer s.release()
	start := time.Now()
	c, err := s.queue(ctx, order, cl)
	if err == nil {
		// Its place among c's requests is fixed: the client's next request may go.
		dispatched = true
		order.Dispatched()
		c.flush()
		err = s.wait(ctx, c, cl)
	}
	if err == nil {
		err = cl.err
	}
	return s.outcome(err, n, start)
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

// queue puts cl on a connection, waiting for a dial in progress if it must.
func (s *Server) queue(ctx context.Context, order *turn.Turn, cl *call) (*conn, error) {
	var c *conn
	if cl.meta {
		c = s.metaConn(order, true)
		if c == nil {
			return nil, ErrClosed
		}
	} else {
		c = s.pick(order)
	}
	if c.enqueue(cl) {
		return c, nil
	}
	// Not connected: wait for a dial in progress, within the request's timeout.
	if err := c.waitReady(ctx, s.opts.Timeout); err != nil {
		return nil, err
	}
	if !c.enqueue(cl) {
		return nil, c.downErr()
	}
	return c, nil
}

// wait waits for the answer to cl, queued on c, until the server has been silent for
// Timeout or ctx is done. On success cl holds the answer; cl.err may hold a connection
// failure.
//
// The server's silence, not the time since cl was queued, is what times out: the answers
// before cl's (one 300 MB get, say) and cl's own may take longer than Timeout to arrive,
// and as long as they keep arriving the server is doing its job; nor is the server late
// while moxi has not written cl out yet, or not read what it sent (c.silence). So when the
// timer fires early in a silence, it is set again for the rest of Timeout.
func (s *Server) wait(ctx context.Context, c *conn, cl *call) error {
	cl.timer.Reset(s.opts.Timeout)
waiting:
	for {
		select {
		case <-cl.done:
			cl.timer.Stop()
			return nil
		case <-ctx.Done():
			cl.timer.Stop()
			break waiting
		case <-cl.timer.C:
			quiet := c.silence(cl.sent.Load())
			if quiet >= s.opts.Timeout {
				break waiting
			}
			cl.timer.Reset(s.opts.Timeout - quiet)
		}
	}
	if cl.abandon() {
		// The connection still owns cl and will drop its late answer; never reuse it.
		cl.orphaned = true
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ErrTimeout
	}
	<-cl.done // answered while we gave up: take the answer
	return nil
}

// clock is a monotonic time in nanoseconds since s was made: it fits an atomic.Int64,
// and a step of the wall clock cannot turn into a silence.
func (s *Server) clock() int64 { return int64(time.Since(s.epoch)) }

// acquire waits for room among the requests in flight, up to the request timeout.
func (s *Server) acquire(ctx context.Context) error {
	select {
	case s.slots <- struct{}{}:
		s.inFlight.Add(1)
		return nil
	default:
	}
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
