// Package backend is a pool.Server for one remote memcached: a few persistent
// binary-protocol connections, each carrying many client requests pipelined at once and
// matched back to their callers by opaque.
package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"moxi/internal/protocol"
)

// Options configure a Server. Zero values take the documented defaults.
type Options struct {
	Addr           string          // host:port of the memcached server
	Connections    int             // persistent connections; default 4
	ConnectTimeout time.Duration   // per dial; default 1s
	Timeout        time.Duration   // per request, from send to answer; default 250ms
	RetryMin       time.Duration   // first wait before redialing a broken connection; default 100ms
	RetryMax       time.Duration   // the wait doubles up to this; default 10s
	Limits         protocol.Limits // bounds on answers; protocol.DefaultLimits when zero
	Logger         *slog.Logger    // nil = slog.Default()
}

func (o *Options) setDefaults() {
	if o.Connections <= 0 {
		o.Connections = 4
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 250 * time.Millisecond
	}
	if o.RetryMin <= 0 {
		o.RetryMin = 100 * time.Millisecond
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(10*time.Second, o.RetryMin)
	}
	if o.Limits == (protocol.Limits{}) {
		o.Limits = protocol.DefaultLimits
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Errors a request can end with when the server did not answer.
var (
	ErrTimeout = errors.New("timeout")
	ErrDown    = errors.New("not connected")
	ErrClosed  = errors.New("server closed")
)

// Server sends requests to one memcached server. Safe for concurrent use.
type Server struct {
	opts  Options
	conns []*conn
	next  atomic.Uint32
	calls sync.Pool      // of *call
	quit  chan struct{}  // closed by Close: dialers stop
	wg    sync.WaitGroup // the connections' goroutines
	once  sync.Once

	requests, timeouts, down, ioErrors atomic.Uint64 // requests sent and how they failed
	inFlight                           atomic.Int64
	writes                             atomic.Uint64 // system calls that wrote requests
}

// New returns a Server for opts.Addr and starts connecting in the background; requests made
// before a connection is up wait for it up to their timeout.
func New(opts Options) *Server {
	opts.setDefaults()
	s := &Server{opts: opts, quit: make(chan struct{})}
	s.conns = make([]*conn, opts.Connections)
	for i := range s.conns {
		s.conns[i] = newConn(s)
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
		s.wg.Wait()
	})
	return nil
}

// Do sends req and waits for its answer (see pool.Server). A retrieval of several keys is
// one batch of quiet gets ended by a noop; a key repeated in it is asked for once.
func (s *Server) Do(ctx context.Context, req *protocol.Request, resps []protocol.Response) error {
	s.requests.Add(1)
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	cl := s.getCall()
	defer s.putCall(cl)
	if req.Op.IsRetrieval() {
		cl.prepareRetrieval(req)
	} else {
		cl.prepareSingle(req)
	}
	err := s.send(ctx, cl)
	if err == nil {
		err = cl.err
	}
	if err != nil {
		switch {
		case errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded):
			s.timeouts.Add(1)
		case errors.Is(err, ErrDown):
			s.down.Add(1)
		default:
			s.ioErrors.Add(1)
		}
		return fmt.Errorf("%s: %w", s.opts.Addr, err)
	}
	cl.answer(req, resps)
	return nil
}

// send queues cl on a connection and waits for its answer, its timeout or ctx. On success
// cl holds the answer; cl.err may hold a connection failure.
func (s *Server) send(ctx context.Context, cl *call) error {
	c := s.pick()
	if !c.enqueue(cl) {
		// Not connected: wait for a dial in progress, within the request's timeout.
		if err := c.waitReady(ctx, s.opts.Timeout); err != nil {
			return err
		}
		if !c.enqueue(cl) {
			return ErrDown
		}
	}
	cl.timer.Reset(s.opts.Timeout)
	select {
	case <-cl.done:
		cl.timer.Stop()
		return nil
	case <-cl.timer.C:
	case <-ctx.Done():
		cl.timer.Stop()
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

// Stats are moxi's counters for this server, for "stats proxy".
func (s *Server) Stats() []protocol.Stat {
	up := 0
	for _, c := range s.conns {
		if c.up.Load() {
			up++
		}
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	return []protocol.Stat{
		{Name: "connections", Value: strconv.Itoa(len(s.conns))},
		{Name: "connections_up", Value: strconv.Itoa(up)},
		{Name: "requests", Value: u(s.requests.Load())},
		{Name: "in_flight", Value: strconv.FormatInt(s.inFlight.Load(), 10)},
		{Name: "errors_timeout", Value: u(s.timeouts.Load())},
		{Name: "errors_down", Value: u(s.down.Load())},
		{Name: "errors_io", Value: u(s.ioErrors.Load())},
		{Name: "writes", Value: u(s.writes.Load())},
	}
}

// pick chooses a connection: one whose next write is already pending, so that the request
// joins that batch (fewer, larger writes are what makes a proxy fast), else the next one
// that is up, round-robin, which spreads load over the server's worker threads.
func (s *Server) pick() *conn {
	for _, c := range s.conns {
		if c.pending.Load() {
			return c
		}
	}
	n := uint32(len(s.conns))
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
	return newCall()
}

func (s *Server) putCall(cl *call) {
	if cl.orphaned {
		return
	}
	cl.reset()
	s.calls.Put(cl)
}
