package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
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

	mu     sync.Mutex
	since  time.Time     // when the current state began; guarded by mu
	up     chan struct{} // closed while the server is up; replaced when it dies; guarded by mu
	reason error         // while dead, why: what marked it dead, then each failed probe's error; guarded by mu
	// While dead, the wait between probes, which each failed probe doubles up to RetryMax,
	// and when the next probe is due; guarded by mu.
	backoff time.Duration
	probeAt time.Time
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

// deadReason is why the server is dead, "" while it is up.
func (s *Server) deadReason() string {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	if s.health.reason == nil {
		return ""
	}
	return s.health.reason.Error()
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

// markDead takes the server out of service and starts probing it, once per death: dead
// from now, first probed after dead_backoff.
func (s *Server) markDead(reason error) {
	s.die(reason, time.Now(), s.opts.RetryMin, s.opts.RetryMin, false)
}

// die takes the server out of service, dead since since, and starts probing it: first
// after wait, then at intervals doubling from backoff. A server already dead keeps its
// record unless replace; its prober, already running, then waits on for the new probeAt.
func (s *Server) die(reason error, since time.Time, backoff, wait time.Duration, replace bool) {
	h := &s.health
	h.mu.Lock()
	wasDead := h.dead.Load()
	if wasDead && !replace || s.closed() {
		h.mu.Unlock()
		return
	}
	h.since, h.reason, h.backoff, h.probeAt = since, reason, backoff, time.Now().Add(wait)
	if !wasDead {
		h.dead.Store(true)
		h.up = make(chan struct{})
		// Under mu, which Close takes to close quit: the prober is counted before Close
		// waits for the count to reach zero, or not started at all.
		s.wg.Add(1)
	}
	h.mu.Unlock()
	s.opts.Logger.Warn("backend marked dead", "addr", s.opts.Addr, "reason", reason.Error(), "probe_in", wait)
	if wasDead {
		return
	}
	for _, c := range s.conns {
		c.drop(ErrDead)
	}
	go s.probeLoop()
}

func (s *Server) markUp() {
	// Requests that arrive between now and the dialers' first attempt wait for that dial
	// instead of failing for want of a connection: the binary connections' and the meta
	// ones' (a meta request has no other connection to go on).
	s.meta.mu.Lock()
	conns := append(slices.Clip(s.conns), s.meta.conns...)
	s.meta.mu.Unlock()
	for _, c := range conns {
		if c == nil {
			continue // a meta connection never opened
		}
		c.mu.Lock()
		if c.nc == nil && !c.closed {
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
	h.reason = nil
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

// probeLoop probes a dead server, each time a probe is due, until it answers or the Server
// is closed.
func (s *Server) probeLoop() {
	defer s.wg.Done()
	for s.awaitProbe() {
		if err := s.probe(); err != nil {
			s.probeFailed(err)
			continue
		}
		s.markUp()
		return
	}
}

// awaitProbe waits until the next probe is due; false when the Server was closed
// meanwhile. It looks again when its wait ends, since MarkDead may have put the probe off.
func (s *Server) awaitProbe() bool {
	for {
		s.health.mu.Lock()
		wait := time.Until(s.health.probeAt)
		s.health.mu.Unlock()
		if wait <= 0 {
			return true
		}
		if !s.pause(wait) {
			return false
		}
	}
}

// probeFailed records why a probe found the server still dead. A refusal to authenticate
// is logged as a warning when it is news (the server was marked dead for another reason:
// a write that failed as it hung up, say), since it will not pass by itself; other
// failures at debug level, once per probe. The next probe is due after twice the last wait,
// up to dead_backoff_max.
func (s *Server) probeFailed(err error) {
	h := &s.health
	h.mu.Lock()
	news := isAuthError(err) && !isAuthError(h.reason)
	h.reason = err
	h.backoff = min(2*h.backoff, s.opts.RetryMax)
	h.probeAt = time.Now().Add(h.backoff)
	next := h.backoff
	h.mu.Unlock()
	if news {
		s.opts.Logger.Warn("backend still dead: it refuses moxi's connections", "addr", s.opts.Addr, "reason", err.Error(), "probe_in", next)
		return
	}
	s.opts.Logger.Debug("backend probe failed", "addr", s.opts.Addr, "err", err, "next_in", next)
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
	hdr, resp, err := s.askOnce(nc, protocol.AppendBinaryRequest(nil, &noop))
	if err != nil {
		return err
	}
	if err := s.refusal(&hdr); err != nil {
		return err
	}
	if hdr.Opaque != noop.Opaque || resp.Status != protocol.StatusOK {
		return fmt.Errorf("probe: unexpected answer (opaque %#x, status %d)", hdr.Opaque, resp.Status)
	}
	return nil
}

// askOnce writes one request packet on a connection of its own (a probe's, a handshake's)
// and reads the one answer packet, within the deadline the caller set. Nothing follows the
// answer (the server sends no more until asked), so the reader's buffer holds nothing else.
func (s *Server) askOnce(nc net.Conn, packet []byte) (protocol.BinaryResponseHeader, protocol.Response, error) {
	var h protocol.BinaryResponseHeader
	var resp protocol.Response
	if _, err := nc.Write(packet); err != nil {
		return h, resp, err
	}
	err := protocol.ReadBinaryResponse(bufio.NewReaderSize(nc, 512), s.opts.Limits, &h, &resp)
	return h, resp, err
}

// closed reports whether Close has begun.
func (s *Server) closed() bool {
	select {
	case <-s.quit:
		return true
	default:
		return false
	}
}
