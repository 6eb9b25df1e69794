package backend

import (
	"context"
	"sync"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// Meta requests (mg ms md ma) go to the server as the client sent them, on text
// connections kept beside the pipelined binary ones: most of their flags (vivify on miss,
// win/stale/recache, invalidate, opaque, base64 keys) have no binary-protocol form, and a
// memcached connection speaks one protocol. They are the same engine as the binary ones
// (conn): a run of requests is one call, written with whatever else is queued, and memcached
// answers a connection's requests in order, so answers are matched first in, first out. The proxy strips the q flag
// (protocol.AppendMetaRequest), so every request has exactly one answer.
//
// Order among a client's pipelined requests (package turn): a client's requests to a
// server go on its affinity's binary connection or its affinity's meta connection, and
// memcached orders requests only within one connection. So a request that takes the other
// path than the client's previous one to the same server (turn.Turn.Switch) first waits for a
// round trip on the path the previous one took — a noop on the binary connection, an mn on
// the meta one — after which everything sent before has been executed.

// The server's paths, for turn.Turn.Switch.
const (
	pathBinary turn.Path = iota
	pathMeta
)

// metaConns is a server's meta connections, one per affinity, each dialed on first use and
// from then on kept like the binary ones (conn).
type metaConns struct {
	mu     sync.Mutex
	conns  []*conn // guarded by mu; nil entries until used
	closed bool    // guarded by mu: Close was called; no connection opens after it
}

// doMeta sends a meta request and waits for its answer.
func (s *Server) doMeta(ctx context.Context, order *turn.Turn, req *protocol.Request, resp *protocol.Response) error {
	var reqs [1]protocol.Request
	var resps [1]protocol.Response
	var errs [1]error
	reqs[0] = *req
	s.doMetaBatch(ctx, order, reqs[:], resps[:], errs[:])
	*resp = resps[0]
	return errs[0]
}

// doMetaBatch sends a run of meta requests on the client connection's meta connection, as
// one call, and waits for their answers (see pool.Server's DoBatch). A server that requires
// SASL has no meta connection: moxi answers them (sasl.go).
func (s *Server) doMetaBatch(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
	if s.opts.SASL.set() {
		order.Dispatched() // nothing to send
		for i := range reqs {
			resps[i], errs[i] = binaryOnly("meta commands are"), nil
		}
		return
	}
	var err error
	if order.Switch(s, pathMeta) {
		// The client's previous request to s went on the binary connection (see the
		// comment at the top): a noop there first, which gives nothing on.
		each, _ := order.Defer()
		cl := s.getCall()
		cl.prepareSingle(&protocol.Request{Op: protocol.OpNoop})
		err = s.send(ctx, each, cl, 1)
		s.putCall(cl)
		if err != nil {
			order.Dispatched()
		}
	}
	if err == nil {
		cl := s.getCall()
		defer s.putCall(cl)
		cl.prepareMeta(reqs)
		err = s.send(ctx, order, cl, len(reqs))
		if err == nil {
			copy(resps, cl.resps)
		}
	}
	for i := range errs {
		errs[i] = err
	}
}

// metaBarrier waits until every meta request the client connection sent to s has been
// executed: an mn on its meta connection, answered after them. Called for a request about
// to go on the binary path after meta ones (see turn.Turn.Switch).
func (s *Server) metaBarrier(ctx context.Context, order *turn.Turn) error {
	c := s.metaConn(order, false)
	if c == nil {
		return nil // never opened: no request went on it
	}
	var mn [1]protocol.Request
	mn[0].Op = protocol.OpMetaNoop
	cl := s.getCall()
	defer s.putCall(cl)
	cl.prepareMeta(mn[:])
	if !c.enqueue(cl) {
		return nil // down: the requests on it failed with it
	}
	c.flush()
	if err := s.wait(ctx, c, cl); err != nil {
		return err
	}
	return cl.err
}

// metaConn is the meta connection of ctx's affinity (round robin without one), dialed now
// when it never was and open says so; else nil.
func (s *Server) metaConn(order *turn.Turn, open bool) *conn {
	n := uint32(s.opts.Connections)
	a, ok := order.Affinity()
	if !ok {
		a = s.next.Add(1)
	}
	m := &s.meta
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conns == nil {
		m.conns = make([]*conn, n)
	}
	c := m.conns[a%n]
	if c == nil && open && !m.closed {
		c = newConn(s, true)
		m.conns[a%n] = c
		s.wg.Add(1)
		go c.dialLoop()
	}
	return c
}

// closeMeta closes the meta connections; their requests fail with ErrClosed.
func (s *Server) closeMeta() {
	m := &s.meta
	m.mu.Lock()
	conns := m.conns
	m.closed = true
	m.mu.Unlock()
	for _, c := range conns {
		if c != nil {
			c.shutdown()
		}
	}
}

// oneLine puts the server's text in a meta answer (its error text, its flags) on one
// line, as the client's answer carries it (see protocol.OneLine).
func oneLine(resp *protocol.Response) {
	if resp.Msg != "" {
		resp.Msg = string(protocol.OneLine([]byte(resp.Msg)))
	}
	protocol.OneLine(resp.Meta.Flags)
}

// countMeta counts the meta requests among reqs.
func countMeta(reqs []protocol.Request) int {
	n := 0
	for i := range reqs {
		if reqs[i].Op.IsMeta() {
			n++
		}
	}
	return n
}
