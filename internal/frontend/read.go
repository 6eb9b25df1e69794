package frontend

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/moxi-proxy/moxi/internal/burst"
	"github.com/moxi-proxy/moxi/internal/nbsys"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/sockpeek"
	"github.com/moxi-proxy/moxi/internal/walk"
)

// Reading a connection: waiting for a request without a buffer, the reads, and decoding
// what arrived into requests, each started alone or in a run (run.go).

// Read feeds the bufio.Reader: first what the idle read got, then the socket, which is read
// only in the middle of a request (readBusy goes idle between requests). Before it waits for
// the socket, the answers ready so far are written: none waits for a request that has not
// fully arrived. It reads only while the byte account has room, and fails with
// errRequestTimeout when the request is not complete within RequestTimeout.
func (c *conn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 && !c.inline {
			c.putFirst()
		}
		return n, nil
	}
	if c.inline {
		return 0, errNeedMore // arrived, which must not wait in the middle of a request
	}
	c.answers.endBurst()
	var deadline time.Time
	if c.s.RequestTimeout > 0 {
		if c.reqSince.IsZero() {
			c.reqSince = time.Now()
		}
		deadline = c.reqSince.Add(c.s.RequestTimeout)
	}
	if err := c.waitRoom(c.readRoomLocked, deadline); err != nil {
		return 0, err
	}
	if !deadline.IsZero() && !c.s.closing.Load() {
		_ = c.nc.SetReadDeadline(deadline)
		c.readDeadline = true
	}
	n, err := c.nc.Read(p)
	if n > 0 {
		c.noteRead()
	}
	c.filled = n == len(p)
	c.input += int64(n)
	c.acct.hold(int64(n))
	if err != nil && !deadline.IsZero() && errors.Is(err, os.ErrDeadlineExceeded) && !c.s.closing.Load() {
		err = errRequestTimeout
	}
	return n, err
}

// readIdle waits for the first bytes of the next request and reads them into pending,
// counted as the connection's input; it reports whether any came (busy), and what ended
// the wait otherwise. On a plain socket it waits without a buffer, reads into a pooled one
// (first) as large as a busy connection's, so that a pipeline that arrived whole costs one
// read, and serves the requests that arrived whole without leaving the wait (arrived);
// otherwise it reads into idle.
func (c *conn) readIdle() (busy bool, err error) {
	if c.raw == nil {
		n, err := c.nc.Read(c.idle[:])
		c.pending, c.filled = c.idle[:n], n == len(c.idle)
		if n > 0 {
			c.got(n)
		}
		return n > 0, err
	}
	w := &c.wait
	if w.fn == nil {
		w.fn = c.arrived // made once: a closure per wait would allocate
	}
	w.busy, w.err = false, nil
	err = c.raw.Read(w.fn)
	if err == nil {
		err = w.err
	}
	return w.busy, err
}

// socketWait is readIdle's wait on a plain socket.
type socketWait struct {
	fn    func(fd uintptr) bool // arrived
	n     int                   // the bytes the last read put in first
	busy  bool                  // it ended with requests for the busy path to read on
	guess burst.Guess           // whether to read again at once after a burst
	err   error                 // else what ended it, if anything
}

// arrived is readIdle's function on the socket (syscall.RawConn.Read): called at once, and
// then each time the socket becomes readable, it reads what came. Requests that came whole
// it serves there and then, and asks to wait again (false): leaving the wait would cost
// the next request a read that finds nothing, as Go's poller tries a socket before it
// waits, so a client that waits for each answer would pay two reads a request instead of
// one. After a read that held several requests it may read again at once instead (a
// client that pipelines: burst.Guess). It ends the wait (true) with bytes for the busy
// path (busy: a read that filled its buffer, or a request that came in part), with an
// error, or for serve to look again (Shutdown, a handover, no room in the byte account).
//
// It holds the socket's read lock: nothing it calls may read nc, or Close it, which would
// wait for the lock (hangUp ends a connection instead).
func (c *conn) arrived(fd uintptr) bool {
	w := &c.wait
	asked, again := c.resumed(), false
	for {
		buf, _ := c.s.firstReads.Get().(*[]byte)
		if buf == nil {
			b := make([]byte, readBufferSize)
			buf = &b
		}
		n, err := nbsys.Read(fd, *buf)
		for errors.Is(err, syscall.EINTR) {
			n, err = nbsys.Read(fd, *buf)
		}
		if again {
			w.guess.Found(n > 0)
		}
		switch {
		case errors.Is(err, syscall.EAGAIN):
			c.s.firstReads.Put(buf)
			if asked {
				// The sweeper's deadline (past) ends the wait at once, and waitEnds parks.
				c.readerState.Store(readerAsked)
			} else {
				c.waitBegins()
			}
			return false // nothing yet: wait for the socket, holding no buffer
		case n <= 0:
			c.s.firstReads.Put(buf)
			w.err = err
			if err == nil {
				w.err = io.EOF
			}
			return true
		}
		if asked && !c.s.closing.Load() {
			_ = c.nc.SetReadDeadline(time.Time{}) // a request came first: no parking
		}
		asked = false
		c.first, c.pending, c.filled = buf, (*buf)[:n], n == len(*buf)
		c.got(n)
		if c.filled {
			w.busy = true // a pipeline larger than one read: the busy path reads on
			return true
		}
		w.n, c.burst = n, 0
		c.inline = true
		err = c.serveRead()
		c.inline = false
		switch {
		case errors.Is(err, errNeedMore):
			c.readOnOutside()
			w.busy = true
			return true
		case err != nil:
			w.err = err
			return true
		}
		c.putFirst()
		if c.s.closing.Load() || c.s.handingOver.Load() {
			return true
		}
		if err := c.waitRoom(c.idleRoomLocked, time.Time{}); err != nil {
			w.err = err
			return true
		}
		if again = w.guess.ReadAgain(c.burst); !again {
			c.waitBegins()
			return false // served: wait for the next request
		}
	}
}

// errNeedMore is Read's answer, in arrived, when the request being decoded has not all
// come: the busy path reads the rest, outside the wait (readOnOutside).
var errNeedMore = errors.New("request not all read yet")

// readOnOutside readies the busy path to read on, outside the wait, a request that came in
// part: its decoder starts it again from its first byte, which the read kept (first),
// unless all it did was drop a rejected request's body, which it goes on dropping.
func (c *conn) readOnOutside() {
	if c.skipping() {
		c.putFirst() // all read, nothing of a request decoded
		return
	}
	// readBusy left the input as it was before the request: the request and what follows
	// are the last bytes of the read.
	n := c.wait.n
	c.pending = (*c.first)[n-int(c.input) : n]
	c.release() // what was decoded of the request goes with the buffer; serveRead takes another
}

// skipping reports whether the decoder is dropping a rejected request's body that has not
// all come.
func (c *conn) skipping() bool {
	switch {
	case c.bin != nil:
		return c.bin.Skipping()
	case c.text != nil:
		return c.text.Skipping()
	}
	return false
}

// got counts n bytes just read as the connection's input.
func (c *conn) got(n int) {
	c.noteRead()
	c.input += int64(n)
	c.acct.hold(int64(n))
}

// putFirst returns the pooled buffer of the last idle read, once nothing is pending in it.
func (c *conn) putFirst() {
	if c.first != nil {
		c.s.firstReads.Put(c.first)
		c.first = nil
	}
}

// readRoomLocked reports whether the reader may read more of a request that has begun (see
// account.go): within the connection's bound, or with nothing else to write; and within its
// share of the global bound, or as the one connection the server lets past its share (see
// Server.exempt), so that requests larger than their shares still complete one at a time
// rather than all waiting on each other. The caller holds answers.mu.
func (c *conn) readRoomLocked() bool {
	if c.answers.broken != nil {
		return true
	}
	if c.acct.hasRoom(0, c.answers.queuedLocked()) {
		return true
	}
	s := c.s
	return !c.overOwnLocked() && (s.exempt.Load() == c || s.exempt.CompareAndSwap(nil, c))
}

// idleRoomLocked reports whether the reader may read a new request. The caller holds
// answers.mu.
func (c *conn) idleRoomLocked() bool {
	return c.answers.broken != nil || c.acct.hasRoom(0, c.answers.queuedLocked())
}

// overOwnLocked reports whether c is past its own bound with answers to write. The caller
// holds answers.mu.
func (c *conn) overOwnLocked() bool {
	b := c.s.MaxConnectionBytes
	return b > 0 && c.answers.queuedLocked() && c.acct.held.Load() > int64(b)
}

// settleInput counts, after a request was decoded, only the input still buffered (the next
// requests) as the connection's input: what the request took is now its task's, or gone.
func (c *conn) settleInput() {
	c.decoded()
	now := int64(c.buffered() + len(c.pending))
	c.acct.hold(now - c.input)
	c.input = now
	c.reqSince = time.Time{}
	if c.s.exempt.Load() == c && c.s.exempt.CompareAndSwap(c, nil) {
		c.s.wakeRoom()
	}
}

// interrupt makes a blocked read return so that the connection notices Shutdown.
func (c *conn) interrupt() {
	_ = c.nc.SetReadDeadline(time.Now())
}

// readBusy starts requests for as long as input is buffered. A request that arrived whole
// is always started, Shutdown or not: every request a client has sent is answered.
func (c *conn) readBusy() error {
	walk.Step()
	c.answers.beginBurst()
	defer c.answers.endBurst()
	for {
		rejected, answered := false, false
		err := c.readRequest()
		c.burst++
		if err == errNeedMore {
			// Inline (arrived): the requests read so far go, and the input stays as it was
			// before this one, which the busy path reads again from its first byte.
			c.startBatch()
			c.startRun()
			return err
		}
		c.settleInput()
		if err == nil && (c.req.Op.IsSASL() || c.s.auth.Load() != nil) {
			answered, err = c.guard()
		}
		if answered {
			// Answered by guard: the login exchange, or a refusal.
		} else if err == nil && c.batchable() {
			c.startRun() // the run read before the quiet gets comes first
			c.addToBatch()
			if c.more() && len(c.batch) < maxQuietBatch {
				continue // more may follow: answer them together
			}
			c.startBatch()
		} else if err == nil && c.runnable() && (c.building != nil || c.more() || c.starter != nil) {
			c.startBatch()
			c.addToRun()
			if c.more() && len(c.building.batch) < maxRunRequests && len(c.building.data) < maxRunBytes && c.answerFits(c.building.valueKeys) {
				continue // more may follow: send them together
			}
			c.startRun()
		} else {
			c.startBatch() // quiet gets and the run read before this request come first
			c.startRun()
			switch {
			case err != nil:
				var re *protocol.RequestError
				if !errors.As(err, &re) {
					return err
				}
				if !c.authorized() {
					// Before the login, every request is refused alike, and none reaches a server.
					refusal := *errUnauthenticated
					refusal.Close = re.Close
					re = &refusal
				}
				if re.Unlink != nil {
					// A set too large to store: like memcached, drop what the key held, so
					// that the value the client meant to replace is not read afterwards.
					t := c.s.getTask()
					t.req = protocol.Request{Op: protocol.OpDelete, Key: re.Unlink, Binary: c.binary}
					if ns := c.namespace(); ns != nil {
						t.req.Key = append(append([]byte(nil), ns...), re.Unlink...)
					}
					t.silent = true
					c.start(t)
				}
				c.answerError(re)
				if re.Close {
					return err
				}
				rejected = true
			case c.req.Op == protocol.OpQuit:
				if c.binary {
					c.answerNow(func(dst []byte) []byte {
						return protocol.AppendBinaryResponse(dst, &c.req, &protocol.Response{})
					})
				}
				return errQuit
			case c.req.Op == protocol.OpNoop:
				c.answerNow(func(dst []byte) []byte {
					return protocol.AppendBinaryResponse(dst, &c.req, &protocol.Response{})
				})
			default:
				t := c.s.getTask()
				t.req = c.req
				c.start(t)
			}
		}
		if c.answers.failed.Load() {
			return net.ErrClosed // answers are dropped: starting more requests would only cost
		}
		if c.more() {
			continue
		}
		if c.s.closing.Load() {
			return net.ErrClosed
		}
		if !rejected {
			return nil
		}
		// The decoder may still have to swallow the rejected request's body (a value too
		// large) beyond what has arrived. Going idle would forget that (the decoder is Reset
		// when the connection becomes busy again) and the rest of the body would be parsed
		// as commands, so stay busy: the next read skips the body first.
	}
}

// more reports whether input already received waits to be decoded: in moxi's buffers, or
// in the socket when the last read filled its buffer (a pipeline larger than the idle
// read, say), which is asked once per read. Requests read in one go are sent on together.
func (c *conn) more() bool {
	if c.buffered() > 0 || len(c.pending) > 0 {
		return true
	}
	if c.filled {
		c.filled = false
		return sockpeek.Waiting(c.nc)
	}
	return false
}

// buffered is the input already received beyond the requests decoded so far.
func (c *conn) buffered() int {
	switch {
	case c.bin != nil:
		return c.bin.Buffered()
	case c.text != nil:
		return c.text.Buffered()
	}
	return c.br.Buffered()
}

func (c *conn) readRequest() error {
	if !c.sniffed {
		first, err := c.br.Peek(1)
		if err != nil {
			return err
		}
		c.sniffed = true
		c.binary = first[0] == 0x80
		lim := c.s.limits()
		if c.binary {
			c.bin = protocol.NewBinaryReader(c.br, lim)
		} else {
			c.text = protocol.NewTextReader(c.br, lim)
		}
	}
	if c.binary {
		return c.bin.Read(&c.req)
	}
	return c.text.Read(&c.req)
}

// acquire lends the connection a read buffer for a busy period.
func (c *conn) acquire() {
	if br, ok := c.s.readers.Get().(*bufio.Reader); ok {
		br.Reset(c)
		c.br = br
	} else {
		c.br = bufio.NewReaderSize(c, readBufferSize)
	}
	if c.text != nil {
		c.text.Reset(c.br)
	}
	if c.bin != nil {
		c.bin.Reset(c.br)
	}
}

// release returns the read buffer; only called when the reader holds no unread input.
func (c *conn) release() {
	c.br.Reset(nil)
	c.s.readers.Put(c.br)
	c.br = nil
	if cap(c.batch) > keepResponses || cap(c.batchKeys) > keepOutput {
		c.batch, c.batchKeys, c.batchKeyEnds = nil, nil, nil
	}
}

// answerError answers the request just read with e, an error answer (the decoder's, or a
// refusal of the same form), in its place, and counts it (Server.Rejected).
func (c *conn) answerError(e *protocol.RequestError) {
	c.answerNow(func(dst []byte) []byte {
		if c.binary {
			return protocol.AppendBinaryError(dst, &c.req, e)
		}
		return protocol.AppendTextError(dst, e)
	})
	if c.s.Rejected != nil {
		c.s.Rejected(e)
	}
}
