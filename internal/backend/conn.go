package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// errDesync means the server answered an opaque that no request is waiting for: the stream
// can no longer be trusted, so the connection is closed.
var errDesync = errors.New("answer out of step with requests")

// keepWriteBuffer bounds the write buffer kept between bursts (a 1 MB set is not pinned).
const keepWriteBuffer = 256 << 10

// conn is one persistent connection to the server, redialed whenever it breaks.
//
// Callers encode their packets into wbuf and wake writeLoop, which writes whatever has
// accumulated by the time it runs: under load many requests share one system call, which
// is where a proxy earns its keep. dialLoop dials and then reads, completing calls in order.
type conn struct {
	s       *Server
	up      atomic.Bool   // a connection is established; read without mu to pick a conn
	pending atomic.Bool   // wbuf holds packets writeLoop has not taken yet (set under mu)
	kick    chan struct{} // wakes writeLoop; capacity 1, so a wake-up is never lost or blocking

	mu      sync.Mutex
	nc      net.Conn      // nil while down
	stop    chan struct{} // closed when nc fails: its writeLoop exits
	dialing bool          // a dial is in progress
	ready   chan struct{} // closed when the dial in progress ends
	wbuf    []byte        // packets not yet written
	spare   []byte        // the other write buffer, while writeLoop writes one
	queue   fifo          // calls sent and not yet answered, in send order
	opaque  uint32        // next opaque
	closed  bool          // Close was called
}

func newConn(s *Server) *conn {
	// Born dialing, so that a request made before dialLoop starts waits for the first dial.
	return &conn{s: s, ready: make(chan struct{}), dialing: true, kick: make(chan struct{}, 1)}
}

// enqueue encodes cl and queues it for writing; false when the connection is down.
func (c *conn) enqueue(cl *call) bool {
	c.mu.Lock()
	if c.nc == nil {
		c.mu.Unlock()
		return false
	}
	c.wbuf = cl.encode(c.wbuf, c.opaque)
	c.opaque += cl.n
	c.queue.push(cl)
	c.pending.Store(true)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default: // already woken
	}
	return true
}

// writeLoop writes queued packets to nc until nc fails (stop is closed).
func (c *conn) writeLoop(nc net.Conn, stop <-chan struct{}) {
	defer c.s.wg.Done()
	for {
		select {
		case <-c.kick:
		case <-stop:
			return
		}
		// Let the goroutines that are ready to run (clients with requests of their own)
		// queue them first, so that they share this write. When nothing else is ready this
		// returns at once, so an idle proxy adds no latency.
		runtime.Gosched()
		c.mu.Lock()
		for len(c.wbuf) > 0 && c.nc == nc {
			buf := c.wbuf
			c.wbuf, c.spare = c.spare[:0], nil
			c.pending.Store(false)
			c.mu.Unlock()

			_ = nc.SetWriteDeadline(time.Now().Add(c.s.opts.Timeout))
			c.s.writes.Add(1)
			if _, err := nc.Write(buf); err != nil {
				c.fail(nc, fmt.Errorf("write: %w", err))
				return
			}

			c.mu.Lock()
			if cap(buf) <= keepWriteBuffer {
				c.spare = buf[:0]
			}
		}
		c.mu.Unlock()
	}
}

// waitReady waits for a dial in progress to end, up to timeout; ErrDown when no dial is in
// progress (the connection is waiting to retry).
func (c *conn) waitReady(ctx context.Context, timeout time.Duration) error {
	c.mu.Lock()
	dialing, ready := c.dialing, c.ready
	c.mu.Unlock()
	if !dialing {
		if !c.s.Up() {
			return ErrDead
		}
		return ErrDown
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

// dialLoop connects, reads answers until the connection breaks, and connects again at once.
// A dial that fails marks the server dead, and the loop then waits until the prober finds
// it alive again. It exits when the server is closed.
func (c *conn) dialLoop() {
	defer c.s.wg.Done()
	opts := &c.s.opts
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

		d := net.Dialer{Timeout: opts.ConnectTimeout}
		nc, err := d.Dial("tcp", opts.Addr)

		c.mu.Lock()
		c.dialing = false
		close(c.ready)
		c.ready = make(chan struct{})
		if err == nil && c.closed {
			nc.Close()
			err = ErrClosed
		}
		stop := make(chan struct{})
		if err == nil {
			c.nc, c.stop = nc, stop
			c.up.Store(true)
		}
		c.mu.Unlock()

		if errors.Is(err, ErrClosed) {
			return
		}
		if err != nil {
			c.s.markDead(fmt.Errorf("connect: %w", err))
			continue
		}
		c.s.wg.Add(1)
		go c.writeLoop(nc, stop)
		c.readLoop(nc)
	}
}

// readLoop decodes answers from nc and completes their calls until nc fails.
func (c *conn) readLoop(nc net.Conn) {
	br := bufio.NewReaderSize(nc, 32<<10)
	lim := c.s.opts.Limits
	var h protocol.BinaryResponseHeader
	for {
		var resp protocol.Response
		err := protocol.ReadBinaryResponse(br, lim, &h, &resp)
		if errors.Is(err, protocol.ErrBinaryTooLarge) {
			resp = protocol.Response{Status: protocol.StatusTempFailure, Msg: "answer larger than max_value_bytes"}
			err = nil
		}
		if err == nil {
			err = c.deliver(&h, &resp)
		}
		if err != nil {
			c.fail(nc, fmt.Errorf("read: %w", err))
			return
		}
	}
}

// deliver gives one answer packet to the call it belongs to: the oldest call in the queue,
// since memcached answers in order.
func (c *conn) deliver(h *protocol.BinaryResponseHeader, resp *protocol.Response) error {
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
	} else {
		cl.resps[i] = *resp // a batch's noop lands in its own slot, which nobody reads
	}
	if last {
		c.queue.pop()
	}
	c.mu.Unlock()
	if last {
		cl.complete()
	}
	return nil
}

// fail closes nc after an I/O error and fails every call waiting on it; dialLoop redials.
func (c *conn) fail(nc net.Conn, err error) {
	c.mu.Lock()
	if c.nc != nc {
		c.mu.Unlock()
		return // already failed
	}
	c.nc = nil
	close(c.stop)
	c.up.Store(false)
	c.pending.Store(false)
	c.wbuf = c.wbuf[:0]
	calls := c.queue.drain()
	closed := c.closed
	c.mu.Unlock()
	nc.Close()
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

func (q *fifo) drain() []*call {
	out := append([]*call(nil), q.items[q.head:]...)
	clear(q.items)
	q.items, q.head = q.items[:0], 0
	return out
}
