package frontend

import (
	"math"
	"net"
	"sync/atomic"
	"time"
)

// The byte account bounds what clients make moxi hold, in bytes. A connection's held counts
// the input read from its socket that no started request owns yet (a request arriving), the
// request bytes of its requests in flight or not yet answered, a reservation for each answer
// in flight, and its answers not yet written. Server.buffered is the sum over connections.
//
// Past MaxConnectionBytes a connection is not read, nor its decoded requests started, while
// it has answers to write: the kernel's buffers and TCP push back on the client. Past
// MaxBufferedBytes, the connections holding more than an equal share of it wait the same way,
// a lone request included, so that the total stays bounded however many connections there
// are, while a connection holding little is still read and answered.
//
// An answer's size is known only once its values have arrived, so a request in flight
// reserves its connection's estimate per key (perKey): at first max_value_bytes, the
// largest a value can be, then what the connection's answers measured, falling at most by
// half per key answered and rising at once. An estimate can be wrong (a client that reads
// small values, then pipelines large ones): besides a lone request, at most maxUnknownKeys
// keys whose answers are not yet known are in flight, so the overshoot is bounded whatever
// the estimate (see docs/resource-bounds.md).
const (
	// unknownFactor sets how many keys whose answers are not yet known a connection may have
	// in flight besides a lone request: at max_value_bytes each, their worst case is at most
	// unknownFactor times its bound, however its estimate was trained. 32 (128 keys by
	// default, a whole run) keeps a pipeline of 100 gets one round trip: 16 measured it 1.5×
	// slower, 8 a quarter less throughput on pipelines of sets and gets.
	unknownFactor = 32
	// answerReserve is reserved for an answer without values (STORED, a binary header).
	answerReserve = 64
	// minPerKey is the least reserved per key of a retrieval.
	minPerKey = 1 << 10
)

// account is one connection's byte account: its counters are atomic, so that whoever
// makes an answer changes them without a lock; admission (conn.admit), which checks them
// together with the answer queue, does so under the queue's lock.
type account struct {
	s           *Server
	held        atomic.Int64  // this connection's bytes in the account
	unknownKeys atomic.Int64  // keys of the tasks in flight whose answers may carry values
	room        chan struct{} // capacity 1: signaled when held or unknownKeys went down
	perKey      atomic.Int64  // the bytes an answer is expected to take per key
	measured    atomic.Bool   // perKey was measured on an answer, not guessed
}

func (a *account) init(s *Server) {
	a.s, a.room = s, make(chan struct{}, 1)
	a.perKey.Store(int64(s.limits().MaxValueBytes))
}

// hold adds n bytes (or releases -n) to the account and to the server's.
func (a *account) hold(n int64) {
	if n == 0 {
		return
	}
	a.held.Add(n)
	total := a.s.buffered.Add(n)
	if n < 0 {
		a.signalRoom()
		if a.s.roomWaiters.Load() > 0 && (a.s.MaxBufferedBytes == 0 || total <= int64(a.s.MaxBufferedBytes)) {
			a.s.wakeRoom()
		}
	}
}

// answered puts t's answer, now made, in the place of its reservation.
func (a *account) answered(t *task) {
	if t.valueKeys > 0 && len(t.out) > 0 {
		per := int64(len(t.out)) / int64(t.valueKeys)
		a.perKey.Store(max(per, a.perKey.Load()>>min(t.valueKeys, 62), minPerKey))
		a.measured.Store(true)
		a.s.measured(per)
	}
	held := int64(t.bytes()) + int64(len(t.out))
	a.hold(held - t.held)
	t.held = held
	if t.valueKeys > 0 {
		a.unknownKeys.Add(-int64(t.valueKeys))
		a.signalRoom()
	}
}

// signalRoom tells the connection's reader, if it waits for room, that the account went
// down.
func (a *account) signalRoom() {
	select {
	case a.room <- struct{}{}:
	default:
	}
}

// hasRoom reports whether the connection may take extra more bytes: false when that would
// put it past its own bound while it has answers to write (queued), or past its share of
// the global bound while the total is past it.
func (a *account) hasRoom(extra int64, queued bool) bool {
	s := a.s
	held := a.held.Load() + extra
	if queued && s.MaxConnectionBytes > 0 && held > int64(s.MaxConnectionBytes) {
		return false
	}
	if s.MaxBufferedBytes > 0 && s.buffered.Load()+extra > int64(s.MaxBufferedBytes) && held > s.share() {
		return false
	}
	return true
}

// share is a connection's equal share of the global bound (unbounded without one).
func (s *Server) share() int64 {
	if s.MaxBufferedBytes <= 0 {
		return math.MaxInt64 / 2
	}
	return int64(s.MaxBufferedBytes) / max(1, s.current.Load())
}

// waitRoom waits until ok, which is asked under answers.mu, reports room: after each write
// of answers (or a failed one), and each time the global account goes back under its bound.
// It fails with errRequestTimeout when deadline (unless zero) passes first, and with
// net.ErrClosed at Shutdown. ok must report room once c's writes have failed: answers are
// dropped then, and their bytes released.
func (c *conn) waitRoom(ok func() bool, deadline time.Time) error {
	c.answers.mu.Lock()
	room := ok()
	c.answers.mu.Unlock()
	if room {
		return nil
	}
	c.answers.endBurst() // the answers due must leave to make room
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	s := c.s
	s.roomWaiters.Add(1)
	defer s.roomWaiters.Add(-1)
	for {
		// Taken before the check, so that a wake-up between the check and the wait is not lost.
		global := s.roomSignal()
		c.answers.mu.Lock()
		room := ok()
		c.answers.mu.Unlock()
		switch {
		case room:
			return nil
		case s.closing.Load():
			return net.ErrClosed
		}
		select {
		case <-c.acct.room:
		case <-global:
		case <-timeout:
			return errRequestTimeout
		}
	}
}

// roomSignal returns the channel that the next wakeRoom closes.
func (s *Server) roomSignal() <-chan struct{} {
	s.roomMu.Lock()
	defer s.roomMu.Unlock()
	if s.roomCh == nil {
		s.roomCh = make(chan struct{})
	}
	return s.roomCh
}

// wakeRoom wakes every connection waiting for room in the global account: the total went
// back under its bound, or a connection closed (every share grew).
func (s *Server) wakeRoom() {
	s.roomMu.Lock()
	if s.roomCh != nil {
		close(s.roomCh)
		s.roomCh = nil
	}
	s.roomMu.Unlock()
}

// maxUnknownKeys is how many keys whose answers may carry values and are not yet known a
// connection may have in flight besides a lone request (see unknownFactor); at least 4.
func (s *Server) maxUnknownKeys() int {
	if s.MaxConnectionBytes <= 0 {
		return math.MaxInt / 2
	}
	return max(4, unknownFactor*s.MaxConnectionBytes/s.limits().MaxValueBytes)
}

// reserve is what task t reserves in the account for its answer while in flight.
func (a *account) reserve(t *task) int64 {
	return reserveFor(t, a.perKey.Load())
}

func reserveFor(t *task, perKey int64) int64 {
	return int64(t.requests)*answerReserve + int64(t.valueKeys)*perKey
}

// measured folds an answer's bytes per key into the server-wide estimate: it rises at once
// and falls by a sixteenth per answer, so that it stays near the largest values being read.
func (s *Server) measured(per int64) {
	old := s.perKey.Load()
	s.perKey.Store(max(per, old-old/16)) // a lost update between racing callers is harmless
}

// admit waits for room in the window and the byte account, and queues t: its request's
// bytes and a reservation for its answer count in the account from now until the answer is
// written. It reports whether t is the only request in the queue.
//
// A request with nothing queued before it is admitted within the connection's own bound (a
// lone request larger than the bound passes), but one whose answer carries values waits
// while it would take the connection past its share of the global bound: the bytes it would
// hold are its answer's, not yet spent. Its answer is estimated then by the smaller of the
// connection's estimate and the server's (see Server.measured), and a connection's first
// answer at most at its share, so that a new client holding little is served while others
// hold the global bound. One without values (a write) never waits then: its bytes are read
// already, and sending it on is how they are let go.
func (c *conn) admit(t *task) (only bool) {
	bytes := int64(t.bytes())
	a := &c.acct
	own := bytes + a.reserve(t)
	lone := bytes + reserveFor(t, min(a.perKey.Load(), max(c.s.perKey.Load(), minPerKey)))
	if !a.measured.Load() {
		// At most what is left of its share, so that a client that holds little is
		// answered while others hold the global bound (hasRoom: held past the share).
		lone = min(lone, max(bytes, c.s.share()-a.held.Load()))
	}
	_ = c.waitRoom(func() bool {
		switch {
		case c.answers.broken != nil:
			t.held = own // answers are dropped: nothing will be held long
		case c.answers.queuedLocked():
			t.held = own
			return c.answers.windowUsed+t.weight <= windowKeys && a.unknownKeys.Load()+int64(t.valueKeys) <= int64(c.s.maxUnknownKeys()) && a.hasRoom(own, true)
		default:
			t.held = lone
			return t.valueKeys == 0 || a.hasRoom(lone, false)
		}
		return true
	}, time.Time{})
	a.unknownKeys.Add(int64(t.valueKeys)) // only the reader adds: what ok saw holds, or went down
	c.answers.mu.Lock()
	only = c.answers.pushLocked(t)
	c.answers.mu.Unlock()
	a.hold(t.held)
	return only
}
