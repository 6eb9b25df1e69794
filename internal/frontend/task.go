package frontend

import (
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/reqlog"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// task is one client request (or one run of binary quiet gets answered together) between
// its decoding and the write of its answer. The connection's reader fills it; then whoever
// runs it (the reader itself, or a worker when the request is pipelined)
// owns it until complete, and then the writer, until it is recycled.
//
// The handler gets the server's context and the request's turn (order), never the task:
// a task is recycled once its answer is written, and nothing the handler keeps may refer
// to it.
type task struct {
	conn *conn     // the connection, for a worker (see Server.dispatch)
	turn turn.Turn // zero for a request run by the reader with nothing else in flight

	req    protocol.Request
	lone   [1]protocol.Request // a copy of req, as a run of one for the handler (alone)
	batch  []protocol.Request  // binary quiet gets answered together (req is their multi-key get), or a run
	single bool                // batch is a run of single-key requests (see conn.addToRun); req is unused
	spans  []span              // where each request's key and value are in data, while the run is read
	keys   [][]byte            // backing array of req.Keys when the task owns them
	data   []byte              // the request's bytes when the task owns them (pipelined)
	flags  []protocol.MetaFlag // backing array of meta requests' flags when the task owns them
	resps  []protocol.Response

	stream    bool   // a multi-key retrieval answered part by part (see conn.stream)
	writer    bool   // a stream holding the connection's writer token; guarded by answerQueue.mu
	silent    bool   // moxi's own request, whose answer the client does not see
	weight    int    // the keys the task counts in the connection's window (see conn.admit)
	requests  int    // the client requests it answers
	valueKeys int    // the keys whose answers may carry a value (see conn.reserve)
	held      int64  // its bytes in the connection's account: request, and answer or reservation
	out       []byte // the encoded answer; nil until complete, or for a silent answer
	done      bool   // complete: out is final; guarded by answerQueue.mu

	finishFunc func() // finishStarted, made once per task: the done of a started run

	// life is the task's generation (one per request it serves, bumped by reset) and, in
	// its lowest bit, whether a started run's answer was made (answer): the gate between
	// the run's done and a panic in begin, which may race. poisoned: a panic answered it,
	// and a late done may still look at it: it is never recycled.
	life     atomic.Uint64
	poisoned bool

	fences []uint64 // the fences its writes raised (conn.fences), lowered once it is answered; owned by the reader, then by whoever answers it

	// While someone watches the request log (requestlog.go): when its first byte was read,
	// and what the log shows of its requests.
	firstByte time.Time // when its first byte was read (took.go)
	timed     bool      // a client's request (not moxi's own), timed once answered
	logged    []reqlog.Record
	logKeys   []byte // the keys of logged, back to back
	logTally  tally  // what the parts of a multi-key get answered so far
}

// finishStarted ends a run the handler started (conn.begin) once it is answered.
func (t *task) finishStarted() { t.conn.finishStarted(t) }

// span is where one request of a run has its key and value in its task's data, unless the
// request owns its bytes (a meta command, see ownMeta).
type span struct {
	at, key, value int
	owned          bool
}

// ownMeta copies the bytes of the meta request r, one of a run, into t (protocol.Request.Own),
// so that r no longer refers to the decoder's buffers.
func (t *task) ownMeta(r *protocol.Request) { r.Own(&t.data, &t.keys, &t.flags) }

// order is the request's place in its connection's order, for the handler; nil for a
// request with none (run by the reader with nothing else in flight).
func (t *task) order() *turn.Turn {
	if t.turn.Zero() {
		return nil
	}
	return &t.turn
}

// own copies the request's bytes into the task, which then no longer refers to the
// reader's buffer: the reader goes on decoding while the task runs. A run owns its bytes
// from the start.
func (t *task) own() {
	if t.single {
		return
	}
	r := &t.req
	if n := r.DataBytes(); cap(t.data) < n {
		t.data = make([]byte, 0, n)
	}
	t.data, t.keys, t.flags = t.data[:0], t.keys[:0], t.flags[:0]
	r.Own(&t.data, &t.keys, &t.flags)
}

// bytes is the bytes the task's request holds, as the connection's account counts them.
func (t *task) bytes() int {
	if t.single {
		return len(t.data)
	}
	r := &t.req
	n := len(r.Key) + len(r.Value)
	for _, k := range r.Keys {
		n += len(k)
	}
	return n
}

// reset readies the task for reuse, dropping references to values so that they can be
// collected, and big buffers so that a connection does not pin them.
// answeredBit is task.life's bit set once a started run's answer is made.
const answeredBit = 1

// answer claims the making of a started run's answer for its done; false when a panic in
// begin made it (recoverStarted). Called at most once per request (done's contract), and
// only before the task is recycled.
func (t *task) answer() bool {
	life := t.life.Load()
	return life&answeredBit == 0 && t.life.CompareAndSwap(life, life|answeredBit)
}

func (t *task) reset() {
	t.life.Store((t.life.Load()>>1 + 1) << 1) // the next generation, not answered
	clear(t.resps)
	clear(t.batch)
	clear(t.keys)
	clear(t.spans)
	clear(t.flags)
	// Field by field: the turn keeps what it reuses (Chain.Next readies it again), and a
	// task run by the reader must not look as if it had a turn.
	t.turn.Leave()
	t.req, t.lone[0] = protocol.Request{}, protocol.Request{}
	t.keys, t.data, t.resps, t.batch, t.out, t.spans, t.flags = t.keys[:0], t.data[:0], t.resps[:0], t.batch[:0], t.out[:0], t.spans[:0], t.flags[:0]
	t.stream, t.writer, t.silent, t.single, t.weight, t.done, t.conn = false, false, false, false, 0, false, nil
	t.requests, t.valueKeys, t.held, t.fences = 0, 0, 0, t.fences[:0]
	clear(t.logged)
	t.firstByte, t.timed, t.logged, t.logKeys, t.logTally = time.Time{}, false, t.logged[:0], t.logKeys[:0], tally{}
	if cap(t.logKeys) > keepOutput {
		t.logKeys = nil
	}
	if cap(t.data) > keepOutput {
		t.data = nil
	}
	if cap(t.out) > keepOutput {
		t.out = nil
	}
	if cap(t.resps) > keepResponses || cap(t.keys) > keepResponses || cap(t.batch) > keepResponses || cap(t.spans) > keepResponses || cap(t.flags) > keepResponses {
		t.resps, t.keys, t.batch, t.spans, t.flags = nil, nil, nil, nil, nil
	}
}

// run is the task's requests as the handler gets them: its run, or its request as a run of
// one (alone).
func (t *task) run() []protocol.Request {
	if t.single {
		return t.batch
	}
	return t.alone(&t.req)
}

// alone is req as a run of one, for the handler, without an allocation: a copy in the
// task's own array, which release clears.
func (t *task) alone(req *protocol.Request) []protocol.Request {
	t.lone[0] = *req
	return t.lone[:]
}
