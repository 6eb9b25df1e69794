package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// ErrDead is returned at once for requests to a server marked dead, without waiting for a
// timeout; the pool sends the server's keys elsewhere when failover is on.
var ErrDead = errors.New("server marked dead")

// health decides whether the server is up. failure_limit consecutive failures, or a
// connection that cannot be made, mark it dead: its connections are closed (requests in
// flight fail at once) and not redialed; a prober asks it for a noop after dead_backoff,
// doubling up to dead_backoff_max, and the first good answer marks it up again.
type health struct {
	dead     atomic.Bool  // read on every request; written under mu
	failures atomic.Int32 // consecutive failures

	mu    sync.Mutex
	since time.Time     // when the current state began; guarded by mu
	up    chan struct{} // closed while the server is up; replaced when it dies; guarded by mu
}

func (h *health) init() {
	h.up = make(chan struct{})
	close(h.up)
	h.since = time.Now()
}

// Up reports whether the server is considered alive.
func (s *Server) Up() bool { return !s.health.dead.Load() }

// State is whether the server is up, and since when.
func (s *Server) State() (up bool, since time.Time) {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	return !s.health.dead.Load(), s.health.since
}

// upSignal is closed while the server is up; dialers wait on it while it is dead.
func (s *Server) upSignal() <-chan struct{} {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	return s.health.up
}

// succeeded records an answer from the server.
func (s *Server) succeeded() {
	if s.health.failures.Load() != 0 {
		s.health.failures.Store(0)
	}
}

// failed records a request the server did not answer.
func (s *Server) failed(err error) {
	if n := s.health.failures.Add(1); int(n) >= s.opts.FailureLimit {
		s.markDead(fmt.Errorf("%d consecutive failures, the last: %w", n, err))
	}
}

// markDead takes the server out of service and starts probing it, once per death.
func (s *Server) markDead(reason error) {
	h := &s.health
	h.mu.Lock()
	if h.dead.Load() {
		h.mu.Unlock()
		return
	}
	h.dead.Store(true)
	h.since = time.Now()
	h.up = make(chan struct{})
	h.mu.Unlock()
	s.opts.Logger.Warn("backend marked dead", "addr", s.opts.Addr, "reason", reason.Error(), "probe_in", s.opts.RetryMin)
	for _, c := range s.conns {
		c.drop(ErrDead)
	}
	s.wg.Add(1)
	go s.probeLoop()
}

func (s *Server) markUp() {
	// Requests that arrive between now and the dialers' first attempt wait for that dial
	// instead of failing for want of a connection.
	for _, c := range s.conns {
		c.mu.Lock()
		if c.nc == nil {
			c.dialing = true
		}
		c.mu.Unlock()
	}
	h := &s.health
	h.mu.Lock()
	down := time.Since(h.since)
	h.dead.Store(false)
	h.failures.Store(0)
	h.since = time.Now()
	close(h.up)
	h.mu.Unlock()
	s.opts.Logger.Info("backend up again", "addr", s.opts.Addr, "was_dead_for", down.Round(time.Millisecond))
}

// pause waits for d; false when the Server was closed meanwhile.
func (s *Server) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.quit:
		return false
	case <-t.C:
		return true
	}
}

// probeLoop probes a dead server until it answers or the Server is closed.
func (s *Server) probeLoop() {
	defer s.wg.Done()
	wait := s.opts.RetryMin
	for s.pause(wait) {
		if err := s.probe(); err != nil {
			s.opts.Logger.Debug("backend probe failed", "addr", s.opts.Addr, "err", err, "next_in", min(2*wait, s.opts.RetryMax))
			wait = min(2*wait, s.opts.RetryMax)
			continue
		}
		s.markUp()
		return
	}
}

// probe dials the server and asks for a noop, within connect_timeout and timeout.
func (s *Server) probe() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	nc, err := s.dial(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	defer context.AfterFunc(ctx, func() { nc.Close() })() // Close does not wait out a silent server
	_ = nc.SetDeadline(time.Now().Add(s.opts.Timeout))
	noop := protocol.Request{Op: protocol.OpNoop, Opaque: 0x6d6f7869}
	if _, err := nc.Write(protocol.AppendBinaryRequest(nil, &noop)); err != nil {
		return err
	}
	var hdr protocol.BinaryResponseHeader
	var resp protocol.Response
	if err := protocol.ReadBinaryResponse(bufio.NewReaderSize(nc, 512), s.opts.Limits, &hdr, &resp); err != nil {
		return err
	}
	if hdr.Opaque != noop.Opaque || resp.Status != protocol.StatusOK {
		return fmt.Errorf("probe: unexpected answer (opaque %#x, status %d)", hdr.Opaque, resp.Status)
	}
	return nil
}
