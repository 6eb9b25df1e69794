package frontend

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/sockpeek"
	"github.com/moxi-proxy/moxi/internal/turn"
	"github.com/moxi-proxy/moxi/internal/walk"
)

const (
	readBufferSize = 16 << 10
	// keepOutput is the largest buffer a task keeps for its next use; a larger one (a big
	// answer) is left to the garbage collector rather than pinned by the pool.
	keepOutput = 64 << 10
	// keepResponses bounds the response and key slices a task keeps between requests.
	keepResponses = 256

	// A connection's requests in flight or waiting to be written hold at most windowKeys
	// keys (a request counts its keys, a multi-key get at most one part's worth), besides
	// the byte account (account.go).
	windowKeys = 256

	// maxQuietBatch bounds the binary quiet gets answered as one multi-key get.
	maxQuietBatch = 1024

	// A run of pipelined single-key requests sent to the servers as one batch (see
	// addToRun) holds at most maxRunRequests and, past maxRunBytes of keys and values,
	// ends with the request that crossed it.
	maxRunRequests = 128
	maxRunBytes    = 1 << 20
)

var (
	errQuit           = errors.New("client quit")
	errRequestTimeout = errors.New("request not complete within request_timeout")
	errPanic          = errors.New("panic while serving a request")
)

// conn is one client connection.
//
// Its serve goroutine is the reader: it decodes requests and starts each as a task. A
// request with nothing else in flight and nothing read behind it is run by the reader
// itself (a client waiting for each answer costs no extra goroutine); otherwise each task
// runs on a worker goroutine (Server.dispatch), many at once, in the order package turn
// keeps. Its answers are written in request order by its answerQueue (answers.go).
type conn struct {
	s       *Server
	handler Handler // the listener's: Server.Handler, or the one given to ServeWith
	nc      net.Conn
	raw     syscall.RawConn // nc's descriptor, for reads and writes that must not wait; nil for TLS
	starter Starter         // handler, when it can start runs (see begin); else nil

	// Owned by the reader.
	//
	// While idle a connection holds no read buffer, only idle: the first bytes of the next
	// request are read into it and handed to the pooled bufio.Reader through Read. Most
	// requests fit, so becoming busy costs no extra system call.
	idle    [512]byte
	first   *[]byte // the pooled buffer pending is in, when not idle (see readIdle)
	pending []byte
	br      *bufio.Reader // nil while idle
	filled  bool          // the last read from the socket filled its buffer: more may wait there (see more)
	binary  bool          // decided by the first byte the client ever sends, as memcached does
	sniffed bool
	text    *protocol.TextReader
	bin     *protocol.BinaryReader
	req     protocol.Request // the request just decoded; its bytes are the reader's
	chain   *turn.Chain      // the order of this connection's pipelined requests
	// Binary quiet gets read but not yet started (see batchable).
	batch        []protocol.Request
	batchKeys    []byte   // their keys, back to back
	batchKeyEnds [][2]int // each key's start and end in batchKeys
	building     *task    // pipelined single-key requests read but not yet started (see addToRun)

	answers answerQueue
	fences  fences // keys of writes in flight that may be sent again (fence.go)

	// Authentication (auth.go).
	login        atomic.Pointer[login] // the user the client logged in as; nil: none (yet)
	failedLogins int                   // failed logins in a row; owned by the reader
	storedKeys   []byte                // the request's keys renamed into their namespace; owned by the reader

	// The byte account (account.go).
	unknownKeys int           // keys of the tasks in flight whose answers may carry values; guarded by answers.mu
	held        atomic.Int64  // this connection's bytes in the account
	room        chan struct{} // capacity 1: signaled when held went down
	perKey      atomic.Int64  // the bytes an answer is expected to take per key
	measured    atomic.Bool   // perKey was measured on an answer, not guessed
	// Owned by the reader.
	input        int64     // bytes read that no started request owns yet
	reqSince     time.Time // when the request being read first waited for the socket; zero between requests
	readDeadline bool      // a read deadline is set on nc
	rawRead      rawRead   // readIdle's
}

func newConn(s *Server, h Handler, nc net.Conn, affinity uint32) *conn {
	c := &conn{s: s, handler: h, nc: nc, chain: turn.NewChain(affinity), room: make(chan struct{}, 1)}
	c.starter, _ = h.(Starter)
	switch plain := nc.(type) { // bytes written to the socket are the client's (not TLS's)
	case *net.TCPConn:
		c.raw, _ = plain.SyscallConn()
	case *net.UnixConn:
		c.raw, _ = plain.SyscallConn()
	}
	c.answers.init(s, nc, c.raw, c)
	c.perKey.Store(int64(s.limits().MaxValueBytes))
	return c
}

// Read feeds the bufio.Reader: first what the idle read got, then the socket, which is read
// only in the middle of a request (readBusy goes idle between requests). Before it waits for
// the socket, the answers ready so far are written: none waits for a request that has not
// fully arrived. It reads only while the byte account has room, and fails with
// errRequestTimeout when the request is not complete within RequestTimeout.
func (c *conn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 && c.first != nil {
			c.s.firstReads.Put(c.first)
			c.first = nil
		}
		return n, nil
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
	c.filled = n == len(p)
	c.input += int64(n)
	c.hold(int64(n))
	if err != nil && !deadline.IsZero() && errors.Is(err, os.ErrDeadlineExceeded) && !c.s.closing.Load() {
		err = errRequestTimeout
	}
	return n, err
}

// readIdle waits for the first bytes of the next request and reads them into pending. On a
// plain socket it waits without a buffer and reads into a pooled one (first) as large as a
// busy connection's, so that a pipeline that arrived whole costs one read; otherwise into
// idle.
func (c *conn) readIdle() (int, error) {
	if c.raw == nil {
		n, err := c.nc.Read(c.idle[:])
		c.pending, c.filled = c.idle[:n], n == len(c.idle)
		return n, err
	}
	r := &c.rawRead
	if r.fn == nil {
		r.fn, r.pool = r.read, &c.s.firstReads // made once: a closure per read would allocate
	}
	err := c.raw.Read(r.fn)
	n, buf := r.n, r.buf
	if err == nil {
		err = r.err
	}
	if n == 0 && err == nil {
		err = io.EOF
	}
	*r = rawRead{fn: r.fn, pool: r.pool}
	if n == 0 {
		if buf != nil {
			c.s.firstReads.Put(buf)
		}
		return 0, err
	}
	c.first = buf
	c.pending, c.filled = (*buf)[:n], n == len(*buf)
	return n, err
}

// rawRead is one readIdle's system call: it takes a buffer only once bytes are there.
type rawRead struct {
	buf  *[]byte
	n    int
	err  error
	pool *sync.Pool
	fn   func(fd uintptr) bool // read
}

func (r *rawRead) read(fd uintptr) bool {
	buf, _ := r.pool.Get().(*[]byte)
	if buf == nil {
		b := make([]byte, readBufferSize)
		buf = &b
	}
	n, err := syscall.Read(int(fd), *buf)
	if errors.Is(err, syscall.EAGAIN) {
		r.pool.Put(buf)
		return false // nothing yet: wait for the socket, holding no buffer
	}
	if errors.Is(err, syscall.EINTR) {
		r.pool.Put(buf)
		return r.read(fd)
	}
	r.buf, r.n, r.err = buf, max(n, 0), err
	return true
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
	if c.hasRoom(0, c.answers.queuedLocked()) {
		return true
	}
	s := c.s
	return !c.overOwnLocked() && (s.exempt.Load() == c || s.exempt.CompareAndSwap(nil, c))
}

// idleRoomLocked reports whether the reader may read a new request. The caller holds
// answers.mu.
func (c *conn) idleRoomLocked() bool {
	return c.answers.broken != nil || c.hasRoom(0, c.answers.queuedLocked())
}

// overOwnLocked reports whether c is past its own bound with answers to write. The caller
// holds answers.mu.
func (c *conn) overOwnLocked() bool {
	b := c.s.MaxConnectionBytes
	return b > 0 && c.answers.queuedLocked() && c.held.Load() > int64(b)
}

// settleInput counts, after a request was decoded, only the input still buffered (the next
// requests) as the connection's input: what the request took is now its task's, or gone.
func (c *conn) settleInput() {
	now := int64(c.buffered() + len(c.pending))
	c.hold(now - c.input)
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

// serve reads requests until the client leaves, an I/O error, a fatal protocol error or
// Shutdown; then it waits until every request already read is answered, and closes.
func (c *conn) serve() {
	defer c.close()
	defer c.answers.drain()
	defer c.recoverPanic(nil)
	for !c.s.closing.Load() {
		if err := c.waitRoom(c.idleRoomLocked, time.Time{}); err != nil {
			break
		}
		if c.readDeadline {
			_ = c.nc.SetReadDeadline(time.Time{}) // idle: no bound on the wait for the next request
			c.readDeadline = false
			if c.s.closing.Load() {
				break // Shutdown's interrupt may have been undone
			}
		}
		n, err := c.readIdle()
		if n == 0 {
			if err != nil {
				break
			}
			continue
		}
		c.input += int64(n)
		c.hold(int64(n))
		walk.Step() // a request arrived
		c.acquire()
		err = c.readBusy()
		c.release()
		c.hold(-c.input)
		c.input, c.reqSince = 0, time.Time{}
		if err != nil {
			if errors.Is(err, errRequestTimeout) {
				c.s.closedFor(closedRequestTimeout)
			}
			if !errors.Is(err, errQuit) && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.s.logger().Debug("client connection closed", "remote", c.nc.RemoteAddr().String(), "err", err)
			}
			break
		}
	}
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
				c.answerNow(func(dst []byte) []byte {
					if c.binary {
						return protocol.AppendBinaryError(dst, &c.req, re)
					}
					return protocol.AppendTextError(dst, re)
				})
				if c.s.Rejected != nil {
					c.s.Rejected(re)
				}
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

// startBatch starts the quiet gets kept by addToBatch as one task, a multi-key get whose
// answers keep each request's own opaque, key and quiet rules.
func (c *conn) startBatch() {
	if len(c.batch) == 0 {
		return
	}
	walk.Step()
	t := c.s.getTask()
	t.batch = append(t.batch, c.batch...)
	for _, e := range c.batchKeyEnds {
		t.keys = append(t.keys, c.batchKeys[e[0]:e[1]:e[1]])
	}
	t.req = protocol.Request{Op: protocol.OpGet, Keys: t.keys, Binary: true}
	clear(c.batch)
	c.batch, c.batchKeys, c.batchKeyEnds = c.batch[:0], c.batchKeys[:0], c.batchKeyEnds[:0]
	c.start(t)
}

// runnable reports whether the request just read may join a run (see addToRun): a write,
// a get/gets of one key (binary quiet gets have their own batch, see batchable), or a meta
// command with a key.
func (c *conn) runnable() bool {
	r := &c.req
	return r.Op.IsWrite() || (r.Op == protocol.OpGet || r.Op == protocol.OpGets) && len(r.Keys) == 1 && !r.Quiet ||
		r.Op.IsMeta() && r.Op != protocol.OpMetaNoop
}

// addToRun adds the request just read to the run being read. A client that pipelines
// single-key requests (pymemcache's set_many, libmemcached's quiet sets, a Java client's
// threads sharing one connection) gets them sent to each server as one batch
// (Handler.Handle), and answered together.
func (c *conn) addToRun() {
	if c.building == nil {
		c.building = c.s.getTask()
		c.building.single = true
	}
	t, r := c.building, c.req
	if r.Op.IsRetrieval() || r.Op == protocol.OpMetaGet {
		t.valueKeys++
	}
	if r.Op.IsMeta() {
		// Its flags and key token too point into the decoder's buffers: copied with it.
		t.ownMeta(&r)
		t.spans = append(t.spans, span{owned: true})
		t.batch = append(t.batch, r)
		return
	}
	key := r.Key
	if r.Op.IsRetrieval() {
		key = r.Keys[0]
	}
	// The bytes are copied, since the decoder reuses its buffers; the request points at
	// them when the run starts, once data no longer moves as it grows.
	t.spans = append(t.spans, span{at: len(t.data), key: len(key), value: len(r.Value)})
	t.data = append(t.data, key...)
	t.data = append(t.data, r.Value...)
	r.Key, r.Value, r.Keys, r.Args = nil, nil, nil, nil
	t.batch = append(t.batch, r)
}

// startRun starts the run kept by addToRun as one task.
func (c *conn) startRun() {
	t := c.building
	if t == nil {
		return
	}
	walk.Step()
	c.building = nil
	t.keys = t.keys[:0]
	for _, sp := range t.spans {
		k := sp.at + sp.key
		t.keys = append(t.keys, t.data[sp.at:k:k])
	}
	for i, sp := range t.spans {
		r := &t.batch[i]
		if sp.owned {
			continue
		}
		if r.Op.IsRetrieval() {
			r.Keys = t.keys[i : i+1 : i+1]
		} else {
			k, v := sp.at+sp.key, sp.at+sp.key+sp.value
			r.Key, r.Value = t.keys[i], t.data[k:v:v]
		}
	}
	c.start(t)
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

// answerFits reports whether a run of gets may take one more key: within the keys whose
// answers may be in flight at once (maxUnknownKeys), and within the connection's bound at
// its estimate per key, so that a run, answered as one, is not itself an answer past the
// bound. (A multi-key get is answered in parts instead, see stream.)
func (c *conn) answerFits(keys int) bool {
	b := c.s.MaxConnectionBytes
	return b <= 0 || keys+1 <= c.s.maxUnknownKeys() && int64(keys+1)*c.perKey.Load() <= int64(b)
}

// start queues t's answer and runs it: on the reader when it is alone (nothing before it
// unanswered, nothing read behind it), else on a worker, in its turn.
func (c *conn) start(t *task) {
	walk.Step()
	reqs := t.run()
	c.fences.wait(reqs, c.answers.endBurst) // an earlier write of one of its keys may be retried: not overtaken
	t.fences = c.fences.raise(reqs, t.fences)
	r := &t.req
	t.weight, t.requests = 1, 1
	switch {
	case t.single:
		t.weight, t.requests = len(t.batch), len(t.batch)
	case r.Op.IsRetrieval():
		part := c.s.partKeys()
		t.weight = min(len(r.Keys), part)
		t.stream = len(r.Keys) > part
		t.valueKeys, t.requests = t.weight, max(1, len(t.batch))
	case r.Op == protocol.OpMetaGet:
		t.valueKeys = 1
	}
	alone := !c.more()
	if !c.admit(t) {
		alone = false
	}
	if c.starter != nil && (t.single || r.Op.IsRetrieval() && !t.stream) {
		// A run (or a get) whose turn has come is started here, and answered by whoever
		// reads its answers; the reader goes on reading.
		c.chain.Next(&t.turn)
		t.own()
		if t.turn.Ready() && c.begin(t) {
			return
		}
	}
	if alone {
		c.run(t)
		return
	}
	if t.turn.Zero() {
		c.chain.Next(&t.turn)
	}
	t.own()
	t.conn = c
	c.s.dispatch(t)
}

// begin offers t, a run whose turn has come, to the handler's Start; false when it
// declined, and t is run as any other.
func (c *conn) begin(t *task) (started bool) {
	started = true // a panic completes t (recoverStarted): it must not be run again
	defer c.recoverStarted(t, t.life.Load())
	if hook := c.s.PanicHook; hook != nil {
		if !t.single {
			hook(&t.req)
		}
		for i := range t.batch {
			hook(&t.batch[i])
		}
	}
	reqs, answers := t.batch, len(t.batch)
	if !t.single { // a get: one request, an answer per key
		reqs, answers = t.alone(&t.req), len(t.req.Keys)
	}
	t.resps = t.resps[:0]
	for range answers {
		t.resps = append(t.resps, protocol.Response{})
	}
	t.conn = c
	return c.starter.Start(c.s.ctx, t.order(), reqs, t.resps, t.finishFunc)
}

// finishStarted answers t, a run the handler started, once its answers are final (the
// run's done, called once, see Starter), unless a panic in begin answered it first. It runs
// on whatever goroutine finished the run, a server connection's reader perhaps, and so
// never waits for the client (see answerQueue.completeNoWait).
func (c *conn) finishStarted(t *task) {
	walk.Step()
	if !t.answer() {
		return // a panic in begin answered it already (recoverStarted)
	}
	if !t.single {
		c.s.observe(&t.req, t.resps)
		if len(t.req.Keys) > 1 && valueBytes(t.resps) > partBytes {
			go c.writeFetchedStarted(t) // written in pieces, which waits for the client
			return
		}
	}
	if !c.encodeStarted(t) {
		return // it panicked: recoverPanic completed t
	}
	c.answers.completeNoWait(t)
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
	own := bytes + c.reserve(t)
	lone := bytes + reserveFor(t, min(c.perKey.Load(), max(c.s.perKey.Load(), minPerKey)))
	if !c.measured.Load() {
		lone = min(lone, bytes+c.s.share())
	}
	_ = c.waitRoom(func() bool {
		switch {
		case c.answers.broken != nil:
			t.held = own // answers are dropped: nothing will be held long
		case c.answers.queuedLocked():
			t.held = own
			return c.answers.windowUsed+t.weight <= windowKeys && c.unknownKeys+t.valueKeys <= c.s.maxUnknownKeys() && c.hasRoom(own, true)
		default:
			t.held = lone
			return t.valueKeys == 0 || c.hasRoom(lone, false)
		}
		return true
	}, time.Time{})
	c.answers.mu.Lock()
	c.unknownKeys += t.valueKeys
	only = c.answers.pushLocked(t)
	c.answers.mu.Unlock()
	c.hold(t.held)
	return only
}

// answerNow queues an answer that needs no server (an error, a noop), in its place.
func (c *conn) answerNow(encode func(dst []byte) []byte) {
	t := c.s.getTask()
	c.admit(t)
	t.out = encode(t.out[:0])
	c.answers.complete(t)
}

// run handles t once every request before it has been dispatched, and completes it.
func (c *conn) run(t *task) {
	defer c.recoverPanic(t)
	t.turn.Wait()
	if hook := c.s.PanicHook; hook != nil {
		hook(&t.req)
		for i := range t.batch {
			hook(&t.batch[i])
		}
	}
	if t.stream {
		c.stream(t)
		return
	}
	if t.single {
		t.resps = c.handler.Handle(c.s.ctx, t.order(), t.batch, t.resps[:0]) // a run, or a lone request made one for Start
	} else {
		t.resps = c.handler.Handle(c.s.ctx, t.order(), t.alone(&t.req), t.resps[:0])
	}
	t.turn.Release()
	c.s.observe(&t.req, t.resps)
	if !t.single && len(t.req.Keys) > 1 && valueBytes(t.resps) > partBytes {
		c.writeFetched(t)
		return
	}
	t.out, _ = c.encode(t.out[:0], t, &t.req, t.resps, 0, true)
	clear(t.resps) // the answer holds its values now: let the server's copies go
	c.answers.complete(t)
}

// encode appends the answer to req: the part of t's answer that resps make, whose first
// key is t's key number first, the last part when last. It reports whether the answer has
// ended (a text retrieval ends early with an error line when a key failed).
func (c *conn) encode(dst []byte, t *task, req *protocol.Request, resps []protocol.Response, first int, last bool) ([]byte, bool) {
	switch {
	case t.silent:
		return dst, true
	case t.single:
		for i := range resps {
			if c.binary {
				dst = protocol.AppendBinaryResponse(dst, &t.batch[i], &resps[i])
			} else {
				dst = protocol.AppendTextResponse(dst, &t.batch[i], resps[i:i+1])
			}
		}
		return dst, true
	case len(t.batch) > 0:
		for i := range resps {
			q := &t.batch[first+i]
			q.Keys = req.Keys[i : i+1]
			dst = protocol.AppendBinaryResponse(dst, q, &resps[i])
		}
		return dst, last
	case c.binary:
		return protocol.AppendBinaryResponse(dst, req, &resps[0]), true
	case req.Op.IsRetrieval():
		return protocol.AppendTextRetrievalPart(dst, req, resps, last)
	default:
		return protocol.AppendTextResponse(dst, req, resps), true
	}
}

// stream answers a multi-key retrieval too large to hold whole, part by part: it waits to
// be the first answer due, takes the writer token, and then fetches a part, writes it,
// fetches the next. It holds its turn to the end, so that no later request overtakes a
// later part.
func (c *conn) stream(t *task) {
	t.turn.Hold()
	broken := c.answers.takeWriter(t)
	keys := t.req.Keys
	part := c.s.partKeys()
	for first := 0; first < len(keys) && broken == nil; {
		end := min(first+part, len(keys))
		sub := t.req
		sub.Keys = keys[first:end]
		t.resps = c.handler.Handle(c.s.ctx, t.order(), t.alone(&sub), t.resps[:0])
		avg := c.s.observe(&sub, t.resps)
		ended, err := c.writeParts(t, &sub, t.resps, first, end == len(keys))
		clear(t.resps)
		if err != nil {
			broken = err
		}
		if ended {
			break
		}
		// The next part is sized by this answer's own values, whatever other clients fetch.
		first = end
		if avg > 0 {
			part = keysFor(avg)
		}
	}
	t.turn.Release()
	c.answers.wroteOwn(t, broken)
}

// writeFetched writes the answer of t, a multi-key retrieval whose values are fetched, in
// pieces as it is encoded, once every answer before it is written: a get that names one
// large value many times ("get k k k …") is never built whole.
func (c *conn) writeFetched(t *task) {
	broken := c.answers.takeWriter(t)
	if broken == nil {
		if _, err := c.writeParts(t, &t.req, t.resps, 0, true); err != nil {
			broken = err
		}
	}
	clear(t.resps)
	c.answers.wroteOwn(t, broken) // its turn was given on when its values had been fetched
}

// writeParts encodes and writes the answer that resps make (t's keys from first on, the last
// part of t's answer when last), a piece of about partBytes of values at a time. It reports
// whether the answer has ended (last, or a text retrieval ended early by an error line), and
// a write's error. The caller holds the writer token.
func (c *conn) writeParts(t *task, req *protocol.Request, resps []protocol.Response, first int, last bool) (bool, error) {
	for i := 0; i < len(resps); {
		j, size := i+1, len(resps[i].Value)
		for j < len(resps) && size < partBytes {
			size += len(resps[j].Value)
			j++
		}
		piece := *req
		piece.Keys = req.Keys[i:j]
		var ended bool
		t.out, ended = c.encode(t.out[:0], t, &piece, resps[i:j], first+i, last && j == len(resps))
		if err := c.answers.write(t.out); err != nil {
			return true, err
		}
		if ended {
			return true, nil
		}
		i = j
	}
	return last, nil
}

// valueBytes is the bytes of the values in resps, a value named twice counted twice: what
// the answer will hold.
func valueBytes(resps []protocol.Response) int {
	n := 0
	for i := range resps {
		n += len(resps[i].Value)
	}
	return n
}

// writeFetchedStarted writes the large answer of a started get, as run does.
func (c *conn) writeFetchedStarted(t *task) {
	defer c.recoverPanic(t)
	t.turn.Release()
	c.writeFetched(t)
}

// encodeStarted encodes the answer of a started run; false when that panicked.
func (c *conn) encodeStarted(t *task) (ok bool) {
	defer c.recoverPanic(t)
	t.turn.Release()
	t.out, _ = c.encode(t.out[:0], t, &t.req, t.resps, 0, true)
	clear(t.resps) // the answer holds its values now: let the server's copies go
	return true
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

func (c *conn) close() {
	c.nc.Close()
	c.s.removeConn(c)
}
