package frontend

import (
	"bufio"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moxi-proxy/moxi/internal/nbsys"
	"github.com/moxi-proxy/moxi/internal/protocol"
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

	acct account // the byte account (account.go)
	// Owned by the reader.
	input        int64      // bytes read that no started request owns yet
	reqSince     time.Time  // when the request being read first waited for the socket; zero between requests
	readDeadline bool       // a read deadline is set on nc
	wait         socketWait // readIdle's, on a plain socket
	inline       bool       // requests are served in the wait (arrived): Read must not wait
	burst        int        // requests decoded from the wait's last read (arrived)

	// How long requests take (took.go) and the request log (requestlog.go); owned by the reader.
	timer      Timer                                  // the handler, when it is a Timer
	lastRead   time.Time                              // when the last bytes were read
	reqFirst   time.Time                              // when the first byte of the request being read arrived; zero: not yet
	reqStarted time.Time                              // reqFirst of the request just decoded
	client     string                                 // the client's address, once needed
	locate     func(key []byte) (pool, server string) // the handler's Locate, when it is a Locator

	// Parking (park.go).
	parkable    bool         // the poller can watch nc's socket, and a TLS handshake is over; owned by the reader
	handshaking bool         // the poller can watch nc's socket once its TLS handshake is over; owned by the reader
	readerState atomic.Int32 // readerBusy, readerWaiting…: the reader's, as the sweeper sees it
	parkMu      sync.Mutex   // held by the sweeper while it asks the reader to park
}

// newConn makes the conn of client connection nc of a listener whose handler is h, with
// chain its order: a new connection's, or a parked one's woken up (park.go).
func newConn(s *Server, h Handler, nc net.Conn, chain *turn.Chain) *conn {
	c := &conn{s: s, handler: h, nc: nc, chain: chain}
	c.acct.init(s)
	c.starter, _ = h.(Starter)
	c.timer, _ = h.(Timer)
	if !isTLS(nc) { // bytes written to the socket are the client's (not TLS's)
		c.raw = nbsys.Socket(nc)
	}
	if s.poller != nil && (c.raw != nil || descriptorOf(nc) != nil) { // a plain socket's descriptor is c.raw already
		c.parkable = handshakeDone(nc)
		c.handshaking = !c.parkable
	}
	c.answers.init(s, nc, c.raw, &c.acct, c.fences.lower)
	c.answers.logWritten, c.answers.took = c.logWritten, c.took
	return c
}

// serveAndClose serves the connection (serve), then waits until every request already
// read is answered, and closes it; unless it parked (park.go): then c is no longer this
// connection's.
func (c *conn) serveAndClose() {
	if c.serve() {
		return
	}
	c.answers.drain()
	c.close()
}

// serve reads requests until the client leaves, an I/O error, a fatal protocol error,
// Shutdown, or the connection parks, which it reports.
func (c *conn) serve() (parked bool) {
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
		if c.s.handingOver.Load() && c.parkable && plainSocket(c.nc) && c.park() {
			return true // at a request boundary: HandOver takes it from the poller
		}
		c.waitBegins()
		busy, err := c.readIdle()
		if parked, retry := c.waitEnds(busy, err); parked {
			return true
		} else if retry {
			continue
		}
		if !busy {
			if err != nil {
				break
			}
			continue
		}
		if c.serveRead() != nil {
			break
		}
	}
	return false
}

// serveRead serves the requests whose first bytes readIdle read, until none is buffered or
// an error; or, inline (in arrived), until one that came in part (errNeedMore), which the
// busy path then reads on with the reader and the input as they are.
func (c *conn) serveRead() error {
	walk.Step() // a request arrived
	if c.br == nil {
		c.acquire()
	}
	err := c.readBusy()
	if err == errNeedMore {
		return err
	}
	c.release()
	c.acct.hold(-c.input)
	c.input, c.reqSince = 0, time.Time{}
	if err != nil {
		if errors.Is(err, errRequestTimeout) {
			c.s.closedFor(closedRequestTimeout)
		}
		if !errors.Is(err, errQuit) && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			c.s.logger().Debug("client connection closed", "remote", c.nc.RemoteAddr().String(), "err", err)
		}
	}
	return err
}

// start queues t's answer and runs it: on the reader when it is alone (nothing before it
// unanswered, nothing read behind it), else on a worker, in its turn.
func (c *conn) start(t *task) {
	walk.Step()
	if !t.silent { // moxi's own request is not the client's
		if t.firstByte.IsZero() {
			t.firstByte = c.reqStarted // a run's is set already (addToRun)
		}
		if t.firstByte.IsZero() {
			t.firstByte = time.Now() // bytes a predecessor read (handover.go)
		}
		t.timed = true
		c.snapshot(t)
	}
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
	t.resps = slices.Grow(t.resps[:0], answers)[:answers]
	clear(t.resps)
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
	c.finish(t, false)
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
	c.finish(t, true)
}

// finish answers t once its responses are final: the one tail of every task but a
// streamed one, whether a goroutine that may wait for the client handled it (run,
// mayWait) or whoever finished it started (finishStarted, on a server connection's reader
// perhaps, which must not wait). Its turn is given on, its values observed (partKeys), and
// its answer encoded and queued in its place — or, when large, written in pieces, which
// waits for the client.
func (c *conn) finish(t *task, mayWait bool) {
	defer c.recoverPanic(t)
	t.turn.Release()
	c.s.observe(&t.req, t.resps)
	c.owe(t, &t.req, t.resps) // its user's bytes limit (limits.go)
	c.noteAnswers(t, t.resps)
	if !t.single && len(t.req.Keys) > 1 && valueBytes(t.resps) > partBytes {
		if mayWait {
			c.writeFetched(t)
		} else {
			go c.writeFetchedStarted(t)
		}
		return
	}
	t.out, _ = c.encode(t.out[:0], t, &t.req, t.resps, 0, true)
	clear(t.resps)        // the answer holds its values now: let the server's copies go
	t.resps = t.resps[:0] // cleared: reset need not clear them again
	if mayWait {
		c.answers.complete(t)
	} else {
		c.answers.completeNoWait(t)
	}
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

func (c *conn) close() {
	c.nc.Close()
	c.s.removeConn(c)
}
