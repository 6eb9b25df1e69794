package frontend

import (
	"context"
	"errors"
	"net"
	"os"
	"time"
)

// Handing client connections over to a successor process (an upgrade in place): each
// plain connection parks at its next request boundary — at once when it is idle — and
// leaves the poller as a Handed, its socket and what its conn would need to go on; the
// successor Adopts it and serves its next request. TLS connections cannot be handed over
// (their session keys are crypto/tls's): they stay until they close.

// Handed is a client connection handed over at a request boundary.
type Handed struct {
	File         *os.File // its socket: a duplicate, which the receiver owns
	Listener     string   // the address of the listener that accepted it
	Binary       bool     // the protocol it speaks, once Sniffed
	Sniffed      bool
	User         string // its login; "" for none
	PerKey       int64  // its answers' estimated size per key
	FailedLogins int32
	Affinity     uint32 // the backend connection its requests prefer
}

// maxHandedBatch is the most connections HandOver gives send at once: a message's worth of
// descriptors (SCM_RIGHTS carries at most 253).
const maxHandedBatch = 253

// handOverPoll is how often HandOver collects the connections parked since.
const handOverPoll = 10 * time.Millisecond

// HandOver stops serving plain client connections: every one parks at its next request
// boundary, and batches of them go to send (listenerOf names the listener whose handler
// served each). A connection is closed here once send returned nil for its batch: the
// receiver has its own descriptor by then. It returns when none is left but TLS
// connections (tls, which stay served here), or when ctx ends or send fails: then the
// plain connections not handed over (plain) are served here again, as before.
func (s *Server) HandOver(ctx context.Context, listenerOf func(Handler) string, send func([]Handed) error) (plain, tls int, err error) {
	s.mu.Lock()
	pl := s.poller
	s.mu.Unlock()
	if pl == nil {
		return 0, 0, errors.New("connections can only be handed over where they park (Linux)")
	}
	s.handingOver.Store(true)
	defer s.handingOver.Store(false)
	tick := time.NewTicker(handOverPoll)
	defer tick.Stop()
	for {
		taken := pl.takeIf(func(p *parked) bool { return plainSocket(p.nc) })
		for len(taken) > 0 {
			n := min(len(taken), maxHandedBatch)
			if err := s.handBatch(taken[:n], listenerOf, send); err != nil {
				for _, p := range taken {
					go s.wake(p)
				}
				plain, tls := s.unparked()
				return plain, tls, err
			}
			taken = taken[n:]
		}
		plain, tls := s.unparked()
		if plain == 0 {
			return 0, tls, nil
		}
		select {
		case <-ctx.Done():
			return plain, tls, ctx.Err()
		case <-tick.C:
		}
	}
}

// handBatch sends ps, and closes them once sent.
func (s *Server) handBatch(ps []parked, listenerOf func(Handler) string, send func([]Handed) error) error {
	batch := make([]Handed, 0, len(ps))
	defer func() {
		for _, h := range batch {
			h.File.Close()
		}
	}()
	for _, p := range ps {
		f, err := p.nc.(interface{ File() (*os.File, error) }).File()
		if err != nil {
			return err
		}
		h := Handed{File: f, Listener: listenerOf(p.handler), Binary: p.binary, Sniffed: p.sniffed, PerKey: p.perKey,
			FailedLogins: p.failedLogins, Affinity: p.affinity}
		if p.login != nil {
			h.User = p.login.user
		}
		batch = append(batch, h)
	}
	if err := send(batch); err != nil {
		return err
	}
	for _, p := range ps {
		s.closeParked(p)
	}
	return nil
}

// unparked counts the connections still served here, plain and TLS. A connection the poller
// is waking is in neither its table nor conns for a moment: current counts it, as plain
// (a TLS one only makes the caller look again).
func (s *Server) unparked() (plain, tls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if !plainSocket(c.nc) {
			tls++
		}
	}
	tls += s.poller.count(func(p *parked) bool { return !plainSocket(p.nc) })
	return int(s.current.Load()) - tls, tls
}

// Gone waits until every client connection has closed, or ctx ends: after HandOver, the
// TLS connections it left, which end when their clients close them.
func (s *Server) Gone(ctx context.Context) error {
	tick := time.NewTicker(handOverPoll)
	defer tick.Stop()
	for s.current.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// plainSocket reports whether nc is a TCP or Unix socket, which can be handed over.
func plainSocket(nc net.Conn) bool {
	switch nc.(type) {
	case *net.TCPConn, *net.UnixConn:
		return true
	}
	return false
}

// Adopt serves a connection a predecessor handed over, as a connection of the listener
// whose handler is h: parked, until its next request arrives (perhaps already there).
func (s *Server) Adopt(h Handler, hd Handed) error {
	nc, err := net.FileConn(hd.File)
	hd.File.Close()
	if err != nil {
		return err
	}
	p := parked{handler: h, nc: nc, perKey: hd.PerKey, failedLogins: hd.FailedLogins, affinity: hd.Affinity,
		binary: hd.Binary, sniffed: hd.Sniffed, measured: hd.PerKey > 0}
	if hd.User != "" {
		p.login = &login{user: hd.User, namespace: []byte(hd.User + ":")}
	}
	if n := s.current.Add(1); s.MaxConnections > 0 && n > int64(s.MaxConnections) {
		s.current.Add(-1)
		s.refused.Add(1)
		refuse(nc)
		return errors.New("over max_connections")
	}
	s.total.Add(1)
	s.mu.Lock()
	if !s.closing.Load() {
		s.startLocked()
	}
	pl := s.poller
	s.done.Add(1)
	parkedNow := pl != nil && !s.closing.Load() && pl.park(&p)
	s.mu.Unlock()
	if !parkedNow {
		go s.wake(p)
	}
	return nil
}
