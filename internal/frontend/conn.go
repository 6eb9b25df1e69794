package frontend

import (
	"bufio"
	"errors"
	"io"
	"net"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

const (
	readBufferSize = 16 << 10
	// keepOutput is the largest output buffer returned to the pool; a larger one (a big
	// multi-get) is left to the garbage collector rather than pinned by the pool.
	keepOutput = 64 << 10
	// keepResponses bounds the response slice a connection keeps between requests.
	keepResponses = 256
)

var errQuit = errors.New("client quit")

// conn is one client connection. Every field is owned by the serve goroutine, except nc,
// which Shutdown may also interrupt or close.
type conn struct {
	s  *Server
	nc net.Conn

	// While idle a connection holds no read or write buffer, only idle: the first bytes of
	// the next request are read into it and handed to the pooled bufio.Reader through Read.
	// Most requests fit, so becoming busy costs no extra system call.
	idle    [512]byte
	pending []byte

	br      *bufio.Reader // nil while idle
	out     *[]byte       // nil while idle
	binary  bool          // decided by the first byte the client ever sends, as memcached does
	sniffed bool
	text    *protocol.TextReader
	bin     *protocol.BinaryReader
	req     protocol.Request
	resps   []protocol.Response

	// Binary quiet gets read but not yet answered (see batchable).
	batch        []protocol.Request
	batchKeys    []byte   // their keys, back to back
	batchKeyEnds [][2]int // each key's start and end in batchKeys
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{s: s, nc: nc}
}

// Read feeds the bufio.Reader: first what the idle read got, then the socket.
func (c *conn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.nc.Read(p)
}

// interrupt makes a blocked read return so that the connection notices Shutdown.
func (c *conn) interrupt() {
	_ = c.nc.SetReadDeadline(time.Now())
}

// serve runs the connection until the client leaves, an I/O error, a fatal protocol error
// or Shutdown. It exits by returning; the deferred close releases everything.
func (c *conn) serve() {
	defer c.close()
	for !c.s.closing.Load() {
		n, err := c.nc.Read(c.idle[:])
		if n == 0 {
			if err != nil {
				return
			}
			continue
		}
		c.pending = c.idle[:n]
		c.acquire()
		err = c.serveBusy()
		c.release()
		if err != nil {
			if !errors.Is(err, errQuit) && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.s.logger().Debug("client connection closed", "remote", c.nc.RemoteAddr().String(), "err", err)
			}
			return
		}
	}
}

// serveBusy answers requests for as long as input is already buffered, then writes all the
// answers at once: a pipeline of many requests costs one write.
func (c *conn) serveBusy() error {
	for {
		rejected := false
		err := c.readRequest()
		if err == nil && c.batchable() {
			c.addToBatch()
			if c.buffered() > 0 && len(c.batch) < maxQuietBatch {
				continue // more may follow: answer them together
			}
			c.answerBatch()
		} else {
			c.answerBatch() // quiet gets read before this request are answered first
			if err != nil {
				var re *protocol.RequestError
				if !errors.As(err, &re) {
					return errors.Join(err, c.flush())
				}
				c.appendError(re)
				if re.Close {
					return errors.Join(err, c.flush())
				}
				rejected = true
			} else if err := c.handle(); err != nil {
				return errors.Join(err, c.flush())
			}
		}
		if c.s.closing.Load() {
			return errors.Join(net.ErrClosed, c.flush())
		}
		if c.buffered() == 0 && len(c.pending) == 0 {
			if !rejected {
				return c.flush()
			}
			// The decoder may still have to swallow the rejected request's body (a value
			// too large) beyond what has arrived. Going idle would forget that (the decoder
			// is Reset when the connection becomes busy again) and the rest of the body
			// would be parsed as commands, so answer now and stay busy: the next read
			// skips the body first.
			if err := c.flush(); err != nil {
				return err
			}
			continue
		}
		if len(*c.out) >= keepOutput {
			if err := c.flush(); err != nil {
				return err
			}
		}
	}
}

// maxQuietBatch bounds the quiet gets answered as one multi-key get.
const maxQuietBatch = 1024

// batchable reports whether the request just read is a binary quiet get (getq, getkq):
// clients pipeline those (libmemcached's binary mget sends getkq… and a noop), and moxi
// answers a run of them as one multi-key get, one batch per server instead of a round
// trip per key.
func (c *conn) batchable() bool {
	return c.binary && c.req.Op == protocol.OpGet && c.req.Quiet
}

// addToBatch keeps the request just read: its key is copied, since the decoder reuses its
// buffers for the next one.
func (c *conn) addToBatch() {
	r := c.req
	start := len(c.batchKeys)
	c.batchKeys = append(c.batchKeys, r.Keys[0]...)
	r.Keys = nil
	c.batch = append(c.batch, r)
	c.batchKeyEnds = append(c.batchKeyEnds, [2]int{start, len(c.batchKeys)})
}

// answerBatch answers the quiet gets kept by addToBatch, each with its own opaque, key and
// quiet rules, in the order they came.
func (c *conn) answerBatch() {
	if len(c.batch) == 0 {
		return
	}
	keys := make([][]byte, len(c.batch))
	for i, e := range c.batchKeyEnds {
		keys[i] = c.batchKeys[e[0]:e[1]:e[1]]
	}
	get := protocol.Request{Op: protocol.OpGet, Keys: keys, Binary: true}
	c.resps = c.s.Handler.Handle(c.s.ctx, &get, c.resps[:0])
	for i := range c.batch {
		c.batch[i].Keys = keys[i : i+1]
		*c.out = protocol.AppendBinaryResponse(*c.out, &c.batch[i], &c.resps[i])
	}
	clear(c.resps)
	clear(c.batch)
	c.batch, c.batchKeys, c.batchKeyEnds = c.batch[:0], c.batchKeys[:0], c.batchKeyEnds[:0]
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

// handle answers the request just decoded. It returns errQuit when the client asked to leave.
func (c *conn) handle() error {
	req := &c.req
	switch req.Op {
	case protocol.OpQuit:
		if c.binary {
			*c.out = protocol.AppendBinaryResponse(*c.out, req, &protocol.Response{})
		}
		return errQuit
	case protocol.OpNoop:
		*c.out = protocol.AppendBinaryResponse(*c.out, req, &protocol.Response{})
		return nil
	}
	c.resps = c.s.Handler.Handle(c.s.ctx, req, c.resps[:0])
	if c.binary {
		*c.out = protocol.AppendBinaryResponse(*c.out, req, &c.resps[0])
	} else {
		*c.out = protocol.AppendTextResponse(*c.out, req, c.resps)
	}
	clear(c.resps) // drop references to values so that they can be collected
	return nil
}

func (c *conn) appendError(e *protocol.RequestError) {
	if c.binary {
		*c.out = protocol.AppendBinaryError(*c.out, &c.req, e)
	} else {
		*c.out = protocol.AppendTextError(*c.out, e)
	}
}

func (c *conn) flush() error {
	if len(*c.out) == 0 {
		return nil
	}
	_, err := c.nc.Write(*c.out)
	*c.out = (*c.out)[:0]
	return err
}

// acquire lends the connection a read and a write buffer for a busy period.
func (c *conn) acquire() {
	if br, ok := c.s.readers.Get().(*bufio.Reader); ok {
		br.Reset(c)
		c.br = br
	} else {
		c.br = bufio.NewReaderSize(c, readBufferSize)
	}
	if out, ok := c.s.writers.Get().(*[]byte); ok {
		c.out = out
	} else {
		b := make([]byte, 0, 4<<10)
		c.out = &b
	}
	if c.text != nil {
		c.text.Reset(c.br)
	}
	if c.bin != nil {
		c.bin.Reset(c.br)
	}
}

// release returns the buffers; only called when the reader holds no unread input.
func (c *conn) release() {
	c.br.Reset(nil)
	c.s.readers.Put(c.br)
	c.br = nil
	if cap(*c.out) <= keepOutput {
		*c.out = (*c.out)[:0]
		c.s.writers.Put(c.out)
	}
	c.out = nil
	if cap(c.resps) > keepResponses {
		c.resps = nil
	}
	if cap(c.batch) > keepResponses || cap(c.batchKeys) > keepOutput {
		c.batch, c.batchKeys, c.batchKeyEnds = nil, nil, nil
	}
}

func (c *conn) close() {
	c.nc.Close()
	c.s.removeConn(c)
}
