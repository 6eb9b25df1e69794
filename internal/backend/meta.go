package backend

import (
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
