package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// Meta requests (mg ms md ma) go to the server as the client sent them, on text
// connections kept beside the pipelined binary ones: most of their flags (vivify on miss,
// win/stale/recache, invalidate, opaque, base64 keys) have no binary-protocol form, and a
// memcached connection speaks one protocol. Like the binary ones they are pipelined: a
// request is written as soon as it is queued, and memcached answers a connection's requests
// in order, so answers are matched first in, first out. The proxy strips the q flag
// (protocol.AppendMetaRequest), so every request has exactly one answer.
//
// Order among a client's pipelined requests (package turn): a client's requests to a
// server go on its affinity's binary connection or its affinity's meta connection, and
// memcached orders requests only within one connection. So a request that takes the other
// path than the client's previous one to the same server (turn.Switch) first waits for a
// round trip on the path the previous one took — a noop on the binary connection, an mn on
// the meta one — after which everything sent before has been executed.

// The server's paths, for turn.Switch.
const (
	pathBinary turn.Path = iota
	pathMeta
)

// metaConns is a server's meta connections, one per affinity, opened on first use.
type metaConns struct {
	mu     sync.Mutex
	pipes  []*metaPipe // guarded by mu; nil entries until used, replaced when failed
	closed bool        // guarded by mu: Close was called; no pipe opens after it
}

// metaPipe is one meta connection and the requests written on it, awaiting answers.
type metaPipe struct {
	s  *Server
	nc net.Conn

	mu      sync.Mutex
	queue   []*metaCall // queued, unanswered, oldest first; guarded by mu
	pending []byte      // requests queued, not yet written, in queue order; guarded by mu
	spare   []byte      // the buffer of the last write, for reuse; guarded by mu
	writing bool        // a goroutine is writing pending; guarded by mu
	err     error       // why the pipe failed; set once, guarded by mu

	lastRead atomic.Int64 // s.clock() when bytes last arrived
}

// metaCall is one request on a pipe.
type metaCall struct {
	resp      protocol.Response
	err       error
	throughMN bool          // its answer ends with an MN (protocol.MetaThroughMN)
	sent      int64         // s.clock() when written
	done      chan struct{} // closed when resp or err is set
}

// doMeta sends a meta request and waits for its answer.
func (s *Server) doMeta(ctx context.Context, req *protocol.Request, resp *protocol.Response) error {
	var reqs [1]protocol.Request
	var resps [1]protocol.Response
	var errs [1]error
	reqs[0] = *req
	s.doMetaBatch(ctx, reqs[:], resps[:], errs[:])
	*resp = resps[0]
	return errs[0]
}

// doMetaBatch sends a run of meta requests on the client connection's pipe, in one write,
// and waits for their answers (see pool.Server's DoBatch). It gives the requests' turn on
// once they are queued on the pipe, or have failed.
func (s *Server) doMetaBatch(ctx context.Context, reqs []protocol.Request, resps []protocol.Response, errs []error) {
	n := len(reqs)
	each, dispatched := turn.Defer(ctx)
	failAll := func(err error) {
		dispatched()
		for i := range errs {
			errs[i] = err
		}
	}
	if err := ctx.Err(); err != nil {
		failAll(err)
		return
	}
	if turn.Switch(ctx, s, pathMeta) {
		// The client's previous request to s went on the binary connection (see the
		// comment at the top): a noop there first, which gives nothing on.
		cl := s.getCall()
		cl.prepareSingle(&protocol.Request{Op: protocol.OpNoop})
		err := s.send(each, cl, 1)
		s.putCall(cl)
		if err != nil {
			failAll(err)
			return
		}
	}
	s.requests.Add(uint64(n))
	if s.health.dead.Load() {
		s.down.Add(uint64(n))
		failAll(fmt.Errorf("%s: %w", s.opts.Addr, ErrDead))
		return
	}
	if err := s.acquire(ctx); err != nil {
		s.overloads.Add(uint64(n))
		failAll(fmt.Errorf("%s: %w", s.opts.Addr, err))
		return
	}
	defer s.release()
	start := time.Now()
	p, calls, err := s.queueMeta(ctx, reqs)
	if err != nil {
		failAll(s.outcome(err, n, start))
		return
	}
	dispatched()
	var failed error
	for i, cl := range calls {
		if errs[i] = p.wait(ctx, cl); errs[i] == nil {
			resps[i] = cl.resp
		} else if failed == nil {
			failed = errs[i]
		}
	}
	if failed = s.outcome(failed, n, start); failed != nil {
		for i := range errs {
			if errs[i] != nil {
				errs[i] = failed
			}
		}
	}
}

// queueMeta queues reqs on the meta pipe of their client connection.
func (s *Server) queueMeta(ctx context.Context, reqs []protocol.Request) (*metaPipe, []*metaCall, error) {
	var err error
	for range 2 { // a pipe that failed just now (another request timed out) is replaced once
		var p *metaPipe
		if p, err = s.metaPipe(ctx, true); err != nil {
			return nil, nil, err
		}
		var calls []*metaCall
		if calls, err = p.queueRequests(reqs); err == nil {
			return p, calls, nil
		}
	}
	return nil, nil, err
}

// metaBarrier waits until every meta request the client connection sent to s has been
// executed: an mn on its pipe, answered after them. Called for a request about to go on
// the binary path after meta ones (see turn.Switch).
func (s *Server) metaBarrier(ctx context.Context) error {
	p, err := s.metaPipe(ctx, false)
	if p == nil || err != nil {
		return err // no pipe: its requests, if any, failed with it
	}
	var mn [1]protocol.Request
	mn[0].Op = protocol.OpMetaNoop
	calls, err := p.queueRequests(mn[:])
	if err != nil {
		return nil // the pipe failed: so did the requests on it
	}
	return p.wait(ctx, calls[0])
}

// metaPipe returns the pipe of ctx's affinity (round robin without one). When it has
// failed or was never opened, open says whether to open it; else the answer is nil.
func (s *Server) metaPipe(ctx context.Context, open bool) (*metaPipe, error) {
	n := uint32(s.opts.Connections)
	a, ok := turn.Affinity(ctx)
	if !ok {
		a = s.next.Add(1)
	}
	i := int(a % n)
	m := &s.meta
	m.mu.Lock()
	if m.pipes == nil {
		m.pipes = make([]*metaPipe, n)
	}
	p := m.pipes[i]
	m.mu.Unlock()
	if p != nil && p.ok() {
		return p, nil
	}
	if !open {
		return nil, nil
	}
	nc, err := s.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	fresh := &metaPipe{s: s, nc: nc}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		nc.Close()
		return nil, ErrClosed
	}
	if cur := m.pipes[i]; cur != nil && cur != p && cur.ok() {
		nc.Close() // another request opened it meanwhile
		return cur, nil
	}
	m.pipes[i] = fresh
	s.wg.Add(1)
	go fresh.readLoop()
	return fresh, nil
}

// closeMeta closes the meta connections; their requests fail with ErrClosed.
func (s *Server) closeMeta() {
	m := &s.meta
	m.mu.Lock()
	pipes := m.pipes
	m.pipes, m.closed = nil, true
	m.mu.Unlock()
	for _, p := range pipes {
		if p != nil {
			p.fail(ErrClosed)
		}
	}
}

// ok reports whether p has not failed.
func (p *metaPipe) ok() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err == nil
}

// queueRequests queues a call for each of reqs and writes them on p, in one write with
// whatever else was queued meanwhile: requests queued while a write is in progress go out
// together in the next one, written by the goroutine that queued the first of them — no
// writer goroutine, and one system call for a burst.
func (p *metaPipe) queueRequests(reqs []protocol.Request) ([]*metaCall, error) {
	calls := make([]*metaCall, len(reqs))
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		return nil, err
	}
	now := p.s.clock()
	for i := range reqs {
		calls[i] = &metaCall{done: make(chan struct{}), throughMN: protocol.MetaThroughMN(&reqs[i]), sent: now}
		p.pending = protocol.AppendMetaRequest(p.pending, &reqs[i])
	}
	p.queue = append(p.queue, calls...)
	if p.writing {
		p.mu.Unlock()
		return calls, nil
	}
	p.writing = true
	for len(p.pending) > 0 && p.err == nil {
		out := p.pending
		p.pending, p.spare = p.spare[:0], nil
		p.mu.Unlock()
		_ = p.nc.SetWriteDeadline(time.Now().Add(p.s.opts.Timeout))
		if _, err := p.nc.Write(out); err != nil {
			p.fail(fmt.Errorf("write: %w", err))
		}
		p.mu.Lock()
		if cap(out) <= 64<<10 { // a big ms: do not keep its buffer
			p.spare = out[:0]
		}
	}
	p.writing = false
	p.mu.Unlock()
	return calls, nil
}

// wait waits for cl's answer until the server has been silent for Timeout (as the binary
// connections do: an answer that keeps arriving is not late) or ctx is done. A timeout
// fails the pipe: every request behind cl waits for the same silent server.
func (p *metaPipe) wait(ctx context.Context, cl *metaCall) error {
	timeout := p.s.opts.Timeout
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case <-cl.done:
			return cl.err
		case <-ctx.Done():
			return ctx.Err() // the answer, when it comes, goes to cl, which nobody reads
		case <-timer.C:
			quiet := time.Duration(p.s.clock() - max(cl.sent, p.lastRead.Load()))
			if quiet >= timeout {
				p.fail(ErrTimeout)
				<-cl.done
				return cl.err
			}
			timer.Reset(timeout - quiet)
		}
	}
}

// readLoop reads answers and hands each to the oldest call, until the connection fails.
func (p *metaPipe) readLoop() {
	defer p.s.wg.Done()
	pr := &pacedReader{nc: p.nc}
	r := bufio.NewReaderSize(readTimer{p, pr}, 16<<10)
	for {
		// The reader's next answer is the oldest call's: only that call can say how far
		// the answer goes, and only a byte from the server can end the wait for one. From
		// that byte on, the answer must keep the pace (pacedReader).
		if _, err := r.Peek(1); err != nil {
			p.fail(err)
			return
		}
		p.mu.Lock()
		if len(p.queue) == 0 {
			p.mu.Unlock()
			p.fail(errors.New("answer to no request"))
			return
		}
		cl := p.queue[0]
		p.mu.Unlock()
		var resp protocol.Response
		pr.begin()
		err := protocol.ReadMetaAnswerFor(r, p.s.opts.Limits, cl.throughMN, &resp)
		pr.end()
		if err != nil {
			p.fail(err)
			return
		}
		oneLine(&resp)
		p.mu.Lock()
		if p.err != nil { // failed meanwhile (a timeout): fail has answered cl
			p.mu.Unlock()
			return
		}
		p.queue[0] = nil
		p.queue = p.queue[1:]
		cl.resp = resp
		p.mu.Unlock()
		close(cl.done)
	}
}

// fail closes p's connection (once) and fails every call waiting on it with err.
func (p *metaPipe) fail(err error) {
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return
	}
	p.err = err
	queue := p.queue
	p.queue = nil
	p.mu.Unlock()
	p.nc.Close()
	for _, cl := range queue {
		cl.err = err
		close(cl.done)
	}
}

// readTimer notes when bytes arrive on a pipe's connection.
type readTimer struct {
	p *metaPipe
	r *pacedReader
}

func (r readTimer) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if n > 0 {
		r.p.lastRead.Store(r.p.s.clock())
	}
	return n, err
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
