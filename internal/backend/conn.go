package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/sockpeek"
	"github.com/moxi-proxy/moxi/internal/walk"
)

// errDesync means the server answered an opaque that no request is waiting for: the stream
// can no longer be trusted, so the connection is closed.
var errDesync = errors.New("answer out of step with requests")

// maxYields bounds the times writeLoop yields for more requests to share a write.
const maxYields = 8

// keepWriteBuffer bounds the write buffer kept between bursts (a 1 MB set is not pinned).
const keepWriteBuffer = 256 << 10

// conn is one persistent connection to the server, redialed whenever it breaks: the one
// engine of both kinds of connection a Server keeps, binary ones (its requests' packets are
// matched back to their calls by opaque) and meta ones (meta requests in the text protocol,
// answered in order; meta.go). Only how a call is encoded (call.encode) and how an answer is
// read (readLoop) differ.
//
// Callers encode their packets into wbuf. A caller that finds nobody writing writes wbuf
// itself (flush), once: a lone request costs no hand-off to another goroutine. Packets
// queued meanwhile are written by writeLoop, which writes whatever has accumulated by the
// time it runs: under load many requests share one system call, which is where a proxy
// earns its keep. dialLoop dials and then reads, completing calls in order.
type conn struct {
	s       *Server
	meta    bool         // a meta connection
	up      atomic.Bool  // a connection is established; read without mu to pick a conn
	pending atomic.Bool  // wbuf holds packets a write in progress has not taken (set under mu)
	waiting atomic.Int64 // the clock when readLoop began to wait for bytes; 0 while it is busy with some

	mu      sync.Mutex
	nc      net.Conn      // nil while down
	out     *socketWriter // nc's socket, written without the scheduler (nbsys); nil under TLS or while down
	stop    chan struct{} // closed when nc fails: its writeLoop exits
	kick    chan struct{} // hands nc's writing to its writeLoop (see flush); capacity 1
	dialing bool          // a dial is in progress
	ready   chan struct{} // closed when the dial in progress ends
	dialErr error         // the last dial's failure when it was moxi's own (ownError); nil after one that worked
	writer  net.Conn      // the connection being written to, by a caller or writeLoop; nil when nobody writes
	wbuf    []byte        // packets not yet written
	spare   []byte        // the other write buffer, while writeLoop writes one
	queue   fifo          // calls sent and not yet answered, in send order
	watch   *time.Timer   // times out the calls in queue (watch.go)
	watched bool          // watch is set
	unsent  int           // how many of the newest calls in queue have their packets in wbuf
	opaque  uint32        // next opaque
	closed  bool          // Close was called
}

func newConn(s *Server, meta bool) *conn {
	// Born dialing, so that a request made before dialLoop starts waits for the first dial.
	c := &conn{s: s, meta: meta, ready: make(chan struct{}), dialing: true}
	c.watch = time.AfterFunc(time.Hour, c.onWatch)
	c.watch.Stop()
	return c
}

// enqueue encodes cl and queues it for writing; false when the connection is down. The
// caller then calls flush.
func (c *conn) enqueue(cl *call) bool {
	return c.enqueueOn(nil, cl)
}

// enqueueOn is enqueue, only on the socket via when it is not nil.
func (c *conn) enqueueOn(via net.Conn, cl *call) bool {
	c.mu.Lock()
	if c.nc == nil || (via != nil && c.nc != via) {
		c.mu.Unlock()
		return false
	}
	cl.via = c.nc
	c.wbuf = cl.encode(c.wbuf, c.opaque)
	c.opaque += cl.n
	c.queue.push(cl)
	if !c.watched && !cl.chase {
		c.watched = true
		c.watch.Reset(c.s.opts.Timeout)
	}
	c.unsent++
	c.pending.Store(c.writer != nil)
	c.mu.Unlock()
	return true
}

// flush has the queued packets written when nobody is writing to the connection: the
// caller writes them itself, once, rather than waking another goroutine to. When other
// requests are in flight it first yields, so that the goroutines about to queue theirs (other
// clients' requests) do so and share this write: under load many requests share one system
// call, which is where a proxy earns its keep. What is queued during the write is left to
// writeLoop, so that a caller never writes for others for long.
func (c *conn) flush() {
	walk.Step()
	c.mu.Lock()
	nc := c.nc
	if c.writer != nil || nc == nil || len(c.wbuf) == 0 {
		c.mu.Unlock() // the writer in progress writes it, or it is written, or failed
		return
	}
	c.writer = nc
	kick := c.kick
	if c.s.inFlight.Load() > 1 {
		c.pending.Store(true) // requests picking a connection join this write (Server.pick)
		c.mu.Unlock()
		runtime.Gosched()
		c.mu.Lock()
		if c.writer != nc {
			c.mu.Unlock() // nc failed meanwhile
			return
		}
	}
	if !c.writeOnce(nc) {
		return
	}
	switch {
	case c.writer != nc:
		c.mu.Unlock() // nc failed meanwhile; the next connection has writing of its own
	case len(c.wbuf) > 0:
		c.mu.Unlock()
		// writeLoop takes over. Nothing else sends on kick until writeLoop has taken this
		// and given the writing up, so the send does not block.
		kick <- struct{}{}
	default:
		c.writer = nil
		c.mu.Unlock()
	}
}

// writeOnce writes wbuf to nc; the caller holds mu and the writing (c.writer), and still
// does on true. On false nc failed and mu is unlocked.
func (c *conn) writeOnce(nc net.Conn) bool {
	buf, batch, out := c.wbuf, c.unsent, c.out
	c.wbuf, c.spare, c.unsent = c.spare[:0], nil, 0
	c.pending.Store(false)
	c.mu.Unlock()

	if err := c.write(nc, out, buf); err != nil {
		c.fail(nc, fmt.Errorf("write: %w", err))
		return false
	}

	c.mu.Lock()
	if c.nc == nc {
		c.queue.sent(c.unsent, batch, c.s.clock())
	}
	if cap(buf) <= keepWriteBuffer {
		c.spare = buf[:0]
	}
	return true
}

// writeLoop writes the packets flush left, until nc fails (stop is closed).
func (c *conn) writeLoop(nc net.Conn, stop, kick <-chan struct{}) {
	defer c.s.wg.Done()
	for {
		select {
		case <-kick:
		case <-stop:
			return
		}
		// Let the goroutines that are ready to run (clients with requests of their own)
		// queue them first, so that they share this write. While requests keep arriving,
		// yield again, a few times at most.
		c.mu.Lock()
		for range maxYields {
			n := len(c.wbuf)
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
			if len(c.wbuf) == n {
				break
			}
		}
		for len(c.wbuf) > 0 && c.nc == nc {
			if !c.writeOnce(nc) {
				return
			}
		}
		if c.writer == nc {
			c.writer = nil
		}
		c.mu.Unlock()
	}
}

// write writes buf to nc, whose socket is out when it is plain. What the socket takes at
// once is written without a deadline, in one system call that does not wait (nbsys). Like
// a call's timeout, the rest's measures the server, not the size of buf: it fails when the
// server has taken nothing for Timeout, unless it has been sending answers meanwhile
// (memcached reads no more requests from a connection while it is writing a large answer
// on it, until moxi has read that).
func (c *conn) write(nc net.Conn, out *socketWriter, buf []byte) error {
	if out != nil {
		n, err := out.now(buf)
		if err != nil {
			return err
		}
		c.s.writes.Add(1)
		if buf = buf[n:]; len(buf) == 0 {
			return nil
		}
	}
	timeout := c.s.opts.Timeout
	for {
		since := c.s.clock()
		_ = nc.SetWriteDeadline(time.Now().Add(timeout))
		c.s.writes.Add(1)
		n, err := nc.Write(buf)
		buf = buf[n:]
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 && c.silence(since) >= timeout {
			return err
		}
	}
}

// silence is how long the server has kept c waiting for bytes, counted from since (a
// clock) at the earliest. Only the server's delays count, not moxi's: it is 0 while since
// is 0 (a call's packets are not written yet: write measures the server meanwhile), while
// readLoop is busy with bytes received, and when bytes wait that readLoop has not been
// scheduled to read yet (on a loaded machine that can take longer than Timeout).
func (c *conn) silence(since int64) time.Duration {
	d := c.quiet(since)
	if d >= c.s.opts.Timeout && c.unread() {
		return 0
	}
	return d
}

// quiet is silence without its look at the socket.
func (c *conn) quiet(since int64) time.Duration {
	w := c.waiting.Load()
	if since == 0 || w == 0 {
		return 0
	}
	return time.Duration(c.s.clock() - max(since, w))
}

// unread reports whether bytes from the server wait in the socket's receive buffer. It
// costs a system call, so it is asked only before a timeout.
func (c *conn) unread() bool {
	c.mu.Lock()
	nc := c.nc
	c.mu.Unlock()
	return nc != nil && sockpeek.Waiting(nc)
}

// waitReady waits for a dial in progress to end, up to timeout: nil when the connection is
// up (perhaps already, by a dial that ended since the caller found it down), downErr when
// no dial is in progress (the connection is waiting to retry).
func (c *conn) waitReady(ctx context.Context, timeout time.Duration) error {
	c.mu.Lock()
	dialing, ready, connected := c.dialing, c.ready, c.nc != nil
	c.mu.Unlock()
	switch {
	case connected:
		return nil // a dial ended since the caller found the connection down
	case !dialing:
		return c.downErr()
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-t.C:
		return ErrTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// beingDialed reports whether a dial of c is in progress.
func (c *conn) beingDialed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dialing
}

// downErr is why c, not connected, cannot take a request now.
func (c *conn) downErr() error {
	c.mu.Lock()
	err := c.dialErr
	c.mu.Unlock()
	switch {
	case err != nil:
		return err
	case !c.s.Up():
		return ErrDead
	}
	return ErrDown
}

// dialLoop connects, reads answers until the connection breaks, and connects again at once.
// A dial that fails marks the server dead, and the loop then waits until the prober finds
// it alive again; unless moxi itself lacked what a dial takes (ownError), which is no
// fault of the server's: then the loop dials again after ownErrorRetry. It exits when the
// server is closed.
func (c *conn) dialLoop() {
	defer c.s.wg.Done()
	for {
		select {
		case <-c.s.upSignal():
		case <-c.s.quit:
			return
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		c.dialing = true
		c.mu.Unlock()

		nc, err := c.s.dial(context.Background())

		c.mu.Lock()
		c.dialing = false
		close(c.ready)
		c.ready = make(chan struct{})
		again := c.dialErr != nil // the previous dial failed so too: logged then
		c.dialErr = nil
		if ownError(err) {
			c.dialErr = fmt.Errorf("connect: %w", err)
		}
		if err == nil && c.closed {
			nc.Close()
			err = ErrClosed
		}
		stop, kick := make(chan struct{}), make(chan struct{}, 1)
		if err == nil {
			c.nc, c.stop, c.kick, c.out = nc, stop, kick, newSocketWriter(nc)
			c.up.Store(true)
		}
		c.mu.Unlock()

		switch {
		case errors.Is(err, ErrClosed):
			return
		case ownError(err):
			if !again {
				c.s.opts.Logger.Warn("backend dial failed for want of moxi's own resources; retrying", "addr", c.s.opts.Addr, "err", err, "retry_in", ownErrorRetry)
			}
			if !c.s.pause(ownErrorRetry) {
				return
			}
			continue
		case err != nil:
			c.s.markDead(fmt.Errorf("connect: %w", err))
			continue
		}
		c.s.wg.Add(1)
		go c.writeLoop(nc, stop, kick)
		if !c.meta {
			c.s.checkStart()
		}
		c.readLoop(nc)
	}
}

// ownErrorRetry is how long a connection waits to dial again after moxi lacked what a dial
// takes: soon, since requests fail meanwhile, and each try costs one failed system call.
const ownErrorRetry = 50 * time.Millisecond

// readLoop decodes answers from nc and completes their calls until nc fails. An answer
// starts with its first byte, and must keep the pace from there (pacedReader).
func (c *conn) readLoop(nc net.Conn) {
	defer nc.Close() // fail only hangs it up (hangUp)
	pr := &pacedReader{nc: nc}
	in := newAnswerInput(c, pr, nc)
	br := bufio.NewReaderSize(in, inputBufferSize)
	lim := c.s.opts.Limits
	var h protocol.BinaryResponseHeader
	decode := func() error { return c.readAnswer(br, pr, lim, &h) } // made once: a closure per wait would allocate
	reset := func() { br.Reset(in) }
	for {
		if in.raw != nil && br.Buffered() == 0 && len(in.pending) == 0 {
			if err := in.wait(br, reset, decode); err != nil {
				c.failRead(nc, err)
				return
			}
		}
		if _, err := br.Peek(1); err != nil {
			c.fail(nc, fmt.Errorf("read: %w", err))
			return
		}
		if err := decode(); err != nil {
			c.failRead(nc, err)
			return
		}
	}
}

// readAnswer reads an answer whose first byte has come, at the pace an answer must keep,
// and gives it to its call.
func (c *conn) readAnswer(br *bufio.Reader, pr *pacedReader, lim protocol.Limits, h *protocol.BinaryResponseHeader) error {
	walk.Step() // an answer arrived
	var err error
	pr.begin()
	if c.meta {
		err = c.readMeta(br, lim)
	} else {
		err = c.readBinary(br, lim, h)
	}
	pr.end()
	return err
}

// failRead fails nc after err, an error reading or decoding an answer.
func (c *conn) failRead(nc net.Conn, err error) {
	err = fmt.Errorf("read: %w", err)
	if isAuthError(err) {
		// Dead before failing nc: its calls end as the dead server's, and the one line
		// logged says why.
		c.s.markDead(err)
	}
	c.fail(nc, err)
}

// readBinary reads one answer packet and gives it to the call it belongs to: the oldest
// call in the queue, since memcached answers in order, which knows it by its opaque.
func (c *conn) readBinary(br *bufio.Reader, lim protocol.Limits, h *protocol.BinaryResponseHeader) error {
	var resp protocol.Response
	err := protocol.ReadBinaryResponse(br, lim, h, &resp)
	if errors.Is(err, protocol.ErrBinaryTooLarge) {
		resp = protocol.Response{Status: protocol.StatusTempFailure, Msg: "answer larger than max_value_bytes"}
		err = nil
	}
	if err != nil {
		return err
	}
	if err := c.s.refusal(h); err != nil {
		return err // not an answer: the server hangs up after it
	}
	c.mu.Lock()
	cl := c.queue.front()
	if cl == nil {
		c.mu.Unlock()
		return errDesync
	}
	i := h.Opaque - cl.base // wraps past 2^32 like the opaques themselves
	if i >= cl.n {
		c.mu.Unlock()
		return errDesync
	}
	last := i == cl.n-1
	if cl.stats {
		last = h.StatEnd()
		if !last {
			cl.resps[0].Stats = append(cl.resps[0].Stats, resp.Stats...)
		} else if resp.Status != protocol.StatusOK {
			cl.resps[0].Status, cl.resps[0].Msg = resp.Status, resp.Msg
		}
	} else if cl.batch != nil {
		cl.answerRun(i, &resp)
	} else {
		cl.resps[i] = resp
	}
	c.deliveredLocked(cl, last)
	return nil
}

// readMeta reads the answer to the oldest call's next meta request: only that request can
// say how far its answer goes (protocol.ReadMetaAnswerFor).
func (c *conn) readMeta(br *bufio.Reader, lim protocol.Limits) error {
	c.mu.Lock()
	cl := c.queue.front()
	if cl == nil {
		c.mu.Unlock()
		return errDesync
	}
	throughMN := cl.mn[cl.got]
	c.mu.Unlock()
	var resp protocol.Response
	if err := protocol.ReadMetaAnswerFor(br, lim, throughMN, &resp); err != nil {
		return err
	}
	oneLine(&resp)
	c.mu.Lock()
	if c.queue.front() != cl {
		c.mu.Unlock()
		return errDesync // failed meanwhile: fail has answered cl
	}
	cl.answerRun(cl.got, &resp)
	cl.got++
	c.deliveredLocked(cl, cl.got == cl.n)
	return nil
}

// deliveredLocked ends the delivery of an answer to cl, the oldest call, which is complete
// when this was its last answer. The caller holds mu, which is unlocked on return.
func (c *conn) deliveredLocked(cl *call, last bool) {
	if last {
		c.queue.pop()
	}
	c.mu.Unlock()
	if last {
		cl.complete()
	}
}

// fail ends nc after an I/O error (readLoop closes it) and fails every call waiting on it;
// dialLoop redials.
func (c *conn) fail(nc net.Conn, err error) {
	c.mu.Lock()
	if c.nc != nc {
		c.mu.Unlock()
		return // already failed
	}
	c.nc, c.writer, c.out = nil, nil, nil
	// The dial loop redials at once (dialLoop): from now on, not from when it starts, a
	// request that must keep its order waits for that dial (pick, waitReady) rather than go
	// on another connection, where it could be executed before the requests sent before it
	// on this one that memcached has yet to execute.
	c.dialing = !c.closed
	close(c.stop)
	c.up.Store(false)
	c.pending.Store(false)
	c.wbuf, c.unsent = c.wbuf[:0], 0
	calls := c.queue.drain()
	closed := c.closed
	c.mu.Unlock()
	hangUp(nc)
	if !closed && !errors.Is(err, ErrDead) {
		c.s.opts.Logger.Info("backend connection broken", "addr", c.s.opts.Addr, "err", err, "failed_requests", len(calls))
	}
	for _, cl := range calls {
		if closed {
			cl.err = ErrClosed
		} else {
			cl.err = err
		}
		cl.complete()
	}
}

// shutdown closes the connection for good.
func (c *conn) shutdown() {
	c.mu.Lock()
	c.closed = true
	c.watch.Stop() // the calls fail now: nothing is left to time out
	c.mu.Unlock()
	c.drop(ErrClosed)
}

// drop closes the current connection, failing the requests in flight on it with err.
func (c *conn) drop(err error) {
	c.mu.Lock()
	nc := c.nc
	c.mu.Unlock()
	if nc != nil {
		c.fail(nc, err)
	}
}

// fifo is a queue of calls; the zero value is empty.
type fifo struct {
	items []*call
	head  int
}

func (q *fifo) push(cl *call) {
	if q.head > 0 && q.head >= len(q.items)/2 {
		// Under steady load the queue is never empty: move the live part down so that
		// the backing array does not grow without end.
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, cl)
}

func (q *fifo) front() *call {
	if q.head == len(q.items) {
		return nil
	}
	return q.items[q.head]
}

func (q *fifo) pop() {
	q.items[q.head] = nil
	q.head++
}

// sent stamps with now the n calls queued before the newest skip: a batch just written,
// and the calls queued since. Those of the n already answered are gone from the front.
func (q *fifo) sent(skip, n int, now int64) {
	end := max(q.head, len(q.items)-skip)
	for _, cl := range q.items[max(q.head, end-n):end] {
		cl.sent.Store(now)
	}
}

func (q *fifo) drain() []*call {
	out := append([]*call(nil), q.items[q.head:]...)
	clear(q.items)
	q.items, q.head = q.items[:0], 0
	return out
}
