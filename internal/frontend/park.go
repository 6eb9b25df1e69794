package frontend

import (
	"crypto/tls"
	"errors"
	"maps"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/moxi-proxy/moxi/internal/nbsys"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// Parking idle connections. Most of a tier's client connections are idle most of the time
// (a PHP or Python fleet holds one per worker); a goroutine and a conn each would cost them
// about 10 KB apiece. So a connection whose reader has waited parkCheck to 2×parkCheck for
// its next request, with nothing in flight, parks: it keeps only a parked record (its
// socket, listener, protocol, login and chain), and its conn and goroutine end; the poller
// (poller_linux.go) serves it again on a new goroutine when its socket becomes readable or
// hangs up. A connection that is busy pays for this an atomic store and swap per wait for
// a request, nothing else: the sweeper finds the idle ones.

// parkCheck is the sweeper's period. Short, so that a wave of connections that go idle
// (a fleet's workers starting, say) never holds a goroutine each for long: the runtime
// keeps a goroutine's descriptor (about 480 bytes) for good once made. A client that waits
// longer than that between requests pays a park and a wake-up (microseconds) per request.
const parkCheck = 100 * time.Millisecond

// A wave of connections that park leaves their goroutine stacks and conns free in the
// heap, which the runtime returns to the system over minutes. When releaseAfter more are
// parked than at its last release, the sweeper returns it at once (two collections and a
// scavenge, a few milliseconds), at most once per releaseEvery. Connections that park and
// wake in turn, their number steady, cause none.
const (
	releaseAfter = 1024
	releaseEvery = 10 * time.Second
)

// The reader's states as the sweeper sees them (conn.readerState): the sweeper marks a
// waiting reader seen, and asks one it saw on its last sweep too to park, by cutting its
// wait short with a read deadline in the past.
const (
	readerBusy int32 = iota
	readerWaiting
	readerSeen
	readerAsked
)

// parked is what a parked connection keeps, in the poller's table (by value: a parked
// connection costs no object of moxi's own).
type parked struct {
	handler      Handler
	nc           net.Conn
	chain        *turn.Chain // nil when it remembered nothing but affinity (Chain.Remembers)
	login        *login
	perKey       int64
	failedLogins int32
	affinity     uint32
	binary       bool
	sniffed      bool
	measured     bool

	gen uint32 // its slot's generation: an event for an earlier occupant is ignored
}

// Parked is the number of connections parked now.
func (s *Server) Parked() int {
	s.mu.Lock()
	pl := s.poller
	s.mu.Unlock()
	if pl == nil {
		return 0
	}
	return pl.parked()
}

// sweep asks the readers idle since its last sweep to park, every parkCheck, until Shutdown.
func (s *Server) sweep() {
	defer s.workers.Done()
	tick := time.NewTicker(parkCheck)
	defer tick.Stop()
	var released time.Time
	var releasedAt int // connections parked at the last release
	for {
		select {
		case <-s.stop:
			return
		case now := <-tick.C:
			parked := s.poller.parked()
			releasedAt = min(releasedAt, parked)
			if parked-releasedAt >= releaseAfter && now.Sub(released) >= releaseEvery {
				runtime.GC() // the pools' buffers survive one collection, as sync.Pool's victims
				debug.FreeOSMemory()
				released, releasedAt = now, parked
			}
		}
		s.mu.Lock()
		for c := range s.conns {
			c.tick()
		}
		if len(s.conns) < s.connsPeak/4 {
			// Most connections parked: a map keeps its size once grown, so make it anew.
			conns := make(map[*conn]struct{}, len(s.conns))
			maps.Copy(conns, s.conns)
			s.conns, s.connsPeak = conns, len(conns)
		}
		s.mu.Unlock()
	}
}

// tick is one sweep's look at c.
func (c *conn) tick() {
	if c.s.handingOver.Load() && plainSocket(c.nc) {
		c.readerState.CompareAndSwap(readerWaiting, readerSeen) // asked at once: HandOver waits for it
	}
	if c.readerState.CompareAndSwap(readerWaiting, readerSeen) || c.readerState.Load() != readerSeen ||
		c.acct.held.Load() != 0 { // answers still due: not quiet, no use asking
		return
	}
	c.parkMu.Lock()
	if c.readerState.CompareAndSwap(readerSeen, readerAsked) {
		_ = c.nc.SetReadDeadline(aLongTimeAgo)
	}
	c.parkMu.Unlock()
}

// aLongTimeAgo is a deadline that has passed: a read waiting under it returns at once.
var aLongTimeAgo = time.Unix(1, 0)

// waitBegins and waitEnds bracket the reader's wait for a request (readIdle), whose
// outcome was bytes (got) or err. waitEnds reports whether the connection parked: then c
// is no longer the caller's, which returns at once. Else retry says the wait was only cut
// short by the sweeper and is to be waited again. On a plain socket the wait may end and
// begin again inside readIdle (arrived), which ends it with resumed.
func (c *conn) waitBegins() {
	if c.parkable {
		c.readerState.Store(readerWaiting)
	}
}

func (c *conn) waitEnds(got bool, err error) (parked, retry bool) {
	if !c.parkable {
		// A TLS connection parks once its handshake is over, which its first bytes of a
		// request say: a wait cut short in the middle of the handshake would fail it.
		c.parkable, c.handshaking = c.handshaking && got, c.handshaking && !got
		return false, false
	}
	if !c.resumed() {
		return false, false
	}
	if !got && errors.Is(err, os.ErrDeadlineExceeded) && c.park() {
		return true, false
	}
	if c.s.closing.Load() {
		return false, false // Shutdown's interrupt: leave its deadline
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	return false, !got && errors.Is(err, os.ErrDeadlineExceeded)
}

// resumed marks the reader busy, and reports whether the sweeper had asked it to park: its
// deadline (past) is set by then, for the caller to park on or to lift.
func (c *conn) resumed() (asked bool) {
	if !c.parkable || c.readerState.Swap(readerBusy) != readerAsked {
		return false
	}
	c.parkMu.Lock() // the sweeper's deadline is set once it lets go
	c.parkMu.Unlock()
	return true
}

// quiet reports whether nothing of c is in flight or held: no request read but not
// started, no answer unwritten, no fence up, no byte in the account: no other goroutine
// will look at c again.
func (c *conn) quiet() bool {
	if c.building != nil || len(c.batch) > 0 || len(c.pending) > 0 || c.br != nil || c.first != nil {
		return false
	}
	c.fences.collect()
	if c.fences.up > 0 {
		return false
	}
	q := &c.answers
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.queuedLocked() && !q.writing && q.broken == nil &&
		c.acct.held.Load() == 0 && c.acct.unknownKeys.Load() == 0
}

// park hands the idle connection to the poller, when it is quiet and the server not
// closing; it reports whether it did.
func (c *conn) park() bool {
	s := c.s
	if s.poller == nil || s.closing.Load() || !c.quiet() {
		return false
	}
	if err := c.nc.SetReadDeadline(time.Time{}); err != nil {
		return false
	}
	if c.answers.deadline { // the last blocking write's bound (the writer token is free: quiet)
		if err := c.nc.SetWriteDeadline(time.Time{}); err != nil {
			return false
		}
	}
	p := parked{
		handler: c.handler, nc: c.nc, login: c.login.Load(), perKey: c.acct.perKey.Load(), failedLogins: int32(c.failedLogins),
		affinity: c.chain.Affinity(), binary: c.binary, sniffed: c.sniffed, measured: c.acct.measured.Load(),
	}
	if c.chain.Remembers() {
		p.chain = c.chain
	}
	// Out of conns and into the poller at once, for SetAuth, which looks at both.
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.poller.park(&p) { // closing
		return false
	}
	delete(s.conns, c)
	return true // c is garbage now: a woken connection gets a new one
}

// wake serves a parked connection again, on its own goroutine: the poller's, or Shutdown's
// and SetAuth's.
func (s *Server) wake(p parked) {
	chain := p.chain
	if chain == nil {
		chain = turn.NewChain(p.affinity)
	}
	c := newConn(s, p.handler, p.nc, chain)
	c.login.Store(p.login)
	c.failedLogins, c.binary, c.sniffed = int(p.failedLogins), p.binary, p.sniffed
	c.acct.perKey.Store(p.perKey)
	c.acct.measured.Store(p.measured)
	if p.sniffed {
		if lim := s.limits(); p.binary {
			c.bin = protocol.NewBinaryReader(nil, lim)
		} else {
			c.text = protocol.NewTextReader(nil, lim)
		}
	}
	s.mu.Lock()
	if s.conns == nil { // a connection adopted before any was accepted
		s.conns = make(map[*conn]struct{})
	}
	s.conns[c] = struct{}{} // listed before serve looks at closing: Shutdown interrupts it, or it sees closing
	s.mu.Unlock()
	c.serveAndClose()
}

// hangUp ends client connection nc both ways at once, waking its reader and its writer,
// and leaves the closing to the reader (serveAndClose). Close would wait for a reader in
// its wait (arrived holds the socket's read lock): forever when the caller is that reader,
// or holds a lock it needs. A TLS connection, never read that way, is closed.
func hangUp(nc net.Conn) {
	if raw := descriptorOf(nc); raw != nil && !isTLS(nc) {
		_ = raw.Control(func(fd uintptr) { _ = syscall.Shutdown(int(fd), syscall.SHUT_RDWR) })
		return
	}
	_ = nc.Close()
}

// closeParked closes a parked connection taken out of the poller.
func (s *Server) closeParked(p parked) {
	_ = p.nc.Close()
	s.gone(nil)
}

// TLSConn is a client connection under TLS: crypto/tls's, or a type that embeds it (the
// client listener's bounds the handshake). Whether a connection is TLS is asked of this
// capability, never of a concrete type: a wrapper missed would park mid-handshake.
type TLSConn interface {
	net.Conn
	ConnectionState() tls.ConnectionState
	NetConn() net.Conn // the socket under TLS
}

// isTLS reports whether nc is a TLS connection.
func isTLS(nc net.Conn) bool {
	_, ok := nc.(TLSConn)
	return ok
}

// handshakeDone reports whether nc, when TLS, has completed its handshake.
func handshakeDone(nc net.Conn) bool {
	t, ok := nc.(TLSConn)
	return !ok || t.ConnectionState().HandshakeComplete
}

// descriptorOf is the socket under nc, for the poller: a TCP or Unix socket, or the one
// under TLS; nil for any other connection, which never parks.
func descriptorOf(nc net.Conn) syscall.RawConn {
	if t, ok := nc.(TLSConn); ok {
		nc = t.NetConn()
	}
	return nbsys.Socket(nc)
}
