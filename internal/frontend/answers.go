package frontend

import (
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moxi-proxy/moxi/internal/nbsys"
	"github.com/moxi-proxy/moxi/internal/walk"
)

// writeProgress is what a client must take of its pending answers (or all of them) in every
// WriteTimeout.
const writeProgress = 64 << 10

var errWriteTimeout = errors.New("answers not taken within write_timeout")

// answerQueue is a connection's answers not yet written, in request order, and the writing
// of them: named for the queue, since its order is what it guarantees. The reader queues
// each task as it admits it (conn.admit), and whoever makes the task's answer completes it.
// Each answer is written as soon as it and every answer before it are ready, by whichever
// goroutine holds the writer token; answers that are ready together leave in one write.
//
// The zero value is not ready for use: the connection sets it up with init.
type answerQueue struct {
	s     *Server
	nc    net.Conn
	raw   syscall.RawConn // nc's descriptor, for writes that must not wait (tryWrite); nil for TLS
	acct  *account        // the connection's byte account (account.go)
	lower func([]uint64)  // lowers the fences a task's writes raised (fence.go)
	// took times a task's requests and logWritten offers them to the request log, once its
	// answer was written at the time given.
	took, logWritten func(*task, time.Time)

	mu         sync.Mutex
	cond       sync.Cond   // broadcast when answers were written or the writer token is free
	queue      []*task     // tasks whose answers are not yet written, in request order, from head; guarded by mu
	head       int         // guarded by mu
	windowUsed int         // keys of the queued tasks (see conn.admit); guarded by mu
	writing    bool        // a goroutine holds the writer token; guarded by mu
	burst      bool        // the reader is decoding input already received: answers wait for the end of it; guarded by mu
	broken     error       // a write failed: answers are dropped; guarded by mu
	failed     atomic.Bool // broken is set: for the reader, without mu

	// Owned by the writer token's holder.
	written  []*task
	wbuf     []byte
	wbufs    net.Buffers
	restAt   int      // what of wbuf a write that must not wait left to writeRest; -1: all of written
	rawWrite rawWrite // tryWrite's
	// deadline is set while nc has a write deadline (withProgress's), which a raw write that
	// must not wait would otherwise fail on once it has passed (tryWrite clears it).
	deadline bool
}

func (q *answerQueue) init(s *Server, nc net.Conn, raw syscall.RawConn, acct *account, lower func([]uint64)) {
	q.s, q.nc, q.raw, q.acct, q.lower = s, nc, raw, acct, lower
	q.cond.L = &q.mu
}

// queuedLocked reports whether answers wait to be written. The caller holds mu.
func (q *answerQueue) queuedLocked() bool { return q.head < len(q.queue) }

// pushLocked queues t, counting its keys in the window, and reports whether it is the only
// task queued. The caller holds mu.
func (q *answerQueue) pushLocked(t *task) (only bool) {
	q.windowUsed += t.weight
	only = q.head == len(q.queue)
	q.queue = append(q.queue, t)
	return only
}

// beginBurst holds answers back while the reader decodes input already received, so that
// the answers to a pipeline that arrived together leave together, in one write.
func (q *answerQueue) beginBurst() {
	q.mu.Lock()
	q.burst = true
	q.mu.Unlock()
}

// endBurst writes the answers held back by beginBurst.
func (q *answerQueue) endBurst() {
	q.mu.Lock()
	if !q.burst {
		q.mu.Unlock()
		return
	}
	q.burst = false
	if q.writing || q.head == len(q.queue) || !q.queue[q.head].done {
		q.mu.Unlock()
		return
	}
	q.writing = true
	q.writeLocked()
}

// complete marks t's answer ready and writes every answer that is now due, unless another
// goroutine holds the writer token, which then writes it.
func (q *answerQueue) complete(t *task) {
	if !q.ready(t) {
		return
	}
	if q.head+1 < len(q.queue) {
		// More answers are being made: let the goroutines making them run first, so that
		// theirs share this write. With nothing else ready to run this returns at once.
		q.mu.Unlock()
		runtime.Gosched()
		q.mu.Lock()
	}
	q.writeLocked()
}

// completeNoWait is complete for a caller that must not wait for the client (a server
// connection's reader, see conn.finishStarted): see writeDue.
func (q *answerQueue) completeNoWait(t *task) {
	if q.ready(t) {
		q.writeDue(true)
	}
}

// answered puts t's answer, now made, in the place of its reservation in the byte account,
// and lowers the fences its writes raised.
func (q *answerQueue) answered(t *task) {
	q.lower(t.fences)
	t.fences = t.fences[:0]
	q.acct.answered(t)
}

// ready marks t's answer, now made, ready. It reports whether the caller is to write the
// answers due: then it holds mu and the writer token; else mu is unlocked.
func (q *answerQueue) ready(t *task) bool {
	q.answered(t)
	q.mu.Lock()
	t.done = true
	if q.writing || q.burst || q.queue[q.head] != t {
		q.mu.Unlock()
		return false // the writer, or the end of the reader's burst, writes it
	}
	q.writing = true
	return true
}

// takeWriter waits until t is the first answer due and takes the writer token for it, so
// that t's goroutine writes t's answer itself, in pieces (see conn.stream). It returns the
// error of an earlier failed write, if any.
func (q *answerQueue) takeWriter(t *task) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.queue[q.head] != t || q.writing {
		q.cond.Wait()
	}
	q.writing, t.writer = true, true
	return q.broken
}

// wroteOwn ends t, whose answer its own goroutine wrote holding the writer token (see
// takeWriter), which failed with err when not nil: it gives the token back and writes the
// answers now due.
func (q *answerQueue) wroteOwn(t *task, err error) {
	t.out = t.out[:0] // written already
	q.answered(t)
	q.mu.Lock()
	if err != nil {
		q.fail(err)
	}
	t.done = true
	q.writeLocked()
}

// writeLocked writes the answers that are due, in order, until the first one not ready;
// the caller holds mu and the writer token, which it gives up, and mu is unlocked on
// return.
func (q *answerQueue) writeLocked() { q.writeDue(false) }

// writeDue is writeLocked. When the caller must not wait for the client (a server
// connection's reader, see conn.finishStarted), it writes only what the socket takes at
// once, and leaves the rest, with the writer token, to a goroutine of its own (writeRest): a
// client that stops reading costs its own connection alone.
func (q *answerQueue) writeDue(mustNotWait bool) {
	walk.Step()
	for {
		n := 0
		for q.head+n < len(q.queue) && q.queue[q.head+n].done {
			n++
		}
		if n == 0 {
			q.writing = false
			q.cond.Broadcast()
			q.mu.Unlock()
			return
		}
		q.written = append(q.written[:0], q.queue[q.head:q.head+n]...)
		clear(q.queue[q.head : q.head+n])
		q.head += n
		if q.head == len(q.queue) {
			q.queue, q.head = q.queue[:0], 0
		} else if q.head >= len(q.queue)/2 {
			m := copy(q.queue, q.queue[q.head:])
			clear(q.queue[m:])
			q.queue, q.head = q.queue[:m], 0
		}
		broken := q.broken
		q.mu.Unlock()

		var err error
		if broken == nil {
			if mustNotWait {
				var left bool
				if left, err = q.tryWriteOut(q.written); left {
					go q.writeRest()
					return
				}
			} else {
				err = q.writeOut(q.written)
			}
		}
		q.wrote(err)
	}
}

// wrote ends the write of the answers in written, which failed with err when not nil; it
// returns holding mu.
func (q *answerQueue) wrote(err error) {
	var released int64
	for _, t := range q.written {
		released += t.held
	}
	q.acct.hold(-released)
	q.mu.Lock()
	if err != nil {
		q.fail(err)
	}
	var now time.Time
	for _, t := range q.written {
		if t.timed && err == nil { // a broken connection's answers were not written
			if now.IsZero() {
				now = time.Now()
			}
			q.took(t, now)
			if len(t.logged) > 0 {
				q.logWritten(t, now)
			}
		}
		q.windowUsed -= t.weight
		q.s.putTask(t)
	}
	clear(q.written)
	q.cond.Broadcast()
	q.acct.signalRoom() // the window has room again, whatever the account says
}

// tryWriteOut writes the answers of tasks as far as the socket takes them without waiting.
// left reports that some are left to writeRest: the part of wbuf from restAt, or, when
// restAt is -1, all of them (too large to copy together, or no descriptor to write to
// without waiting).
func (q *answerQueue) tryWriteOut(tasks []*task) (left bool, err error) {
	total := 0
	for _, t := range tasks {
		total += len(t.out)
	}
	if total > keepOutput || q.raw == nil {
		q.restAt = -1
		return total > 0, nil
	}
	q.wbuf = q.wbuf[:0]
	for _, t := range tasks {
		q.wbuf = append(q.wbuf, t.out...)
	}
	n, err := q.tryWrite(q.wbuf)
	if err != nil || n == len(q.wbuf) {
		return false, err
	}
	q.restAt = n
	return true, nil
}

// tryWrite writes what the socket takes of b at once: one system call that does not wait.
func (q *answerQueue) tryWrite(b []byte) (int, error) {
	if q.deadline {
		// The last write's bound: a raw write checks the deadline first, and fails once
		// it has passed, however ready the socket is.
		_ = q.nc.SetWriteDeadline(time.Time{})
		q.deadline = false
	}
	w := &q.rawWrite
	if w.fn == nil {
		w.fn = w.write // made once: a closure per call would allocate
	}
	w.b = b
	err := q.raw.Write(w.fn)
	n, werr := w.n, w.err
	*w = rawWrite{fn: w.fn}
	if err != nil {
		return n, err
	}
	return n, werr
}

// rawWrite is one tryWrite's system call and its outcome.
type rawWrite struct {
	b   []byte
	n   int
	err error
	fn  func(fd uintptr) bool // write
}

func (w *rawWrite) write(fd uintptr) bool {
	w.n, w.err = nbsys.Write(fd, w.b)
	if errors.Is(w.err, syscall.EAGAIN) || errors.Is(w.err, syscall.EINTR) {
		w.err = nil
	}
	w.n = max(w.n, 0)
	return true // never wait for the socket
}

// writeRest finishes a write that tryWriteOut left, holding the writer token, and then
// writes what has become due meanwhile.
func (q *answerQueue) writeRest() {
	var err error
	if q.restAt < 0 {
		err = q.writeOut(q.written)
	} else {
		err = q.write(q.wbuf[q.restAt:])
	}
	q.wrote(err)
	q.writeDue(false)
}

// writeOut writes the answers of tasks in one system call: copied together when small,
// else gathered (writev) so that large values are not copied again.
func (q *answerQueue) writeOut(tasks []*task) error {
	if len(tasks) == 1 {
		if len(tasks[0].out) == 0 {
			return nil
		}
		return q.write(tasks[0].out)
	}
	total := 0
	for _, t := range tasks {
		total += len(t.out)
	}
	if total <= keepOutput {
		q.wbuf = q.wbuf[:0]
		for _, t := range tasks {
			q.wbuf = append(q.wbuf, t.out...)
		}
		if len(q.wbuf) == 0 {
			return nil
		}
		return q.write(q.wbuf)
	}
	q.wbufs = q.wbufs[:0]
	for _, t := range tasks {
		if len(t.out) > 0 {
			q.wbufs = append(q.wbufs, t.out)
		}
	}
	keep := q.wbufs
	err := q.writeBuffers(&q.wbufs)
	clear(keep)
	q.wbufs = keep[:0]
	return err
}

// write writes b to the client within WriteTimeout (see withProgress). The caller holds the
// writer token.
func (q *answerQueue) write(b []byte) error {
	return q.withProgress(func() (int, error) {
		n, err := q.nc.Write(b)
		b = b[n:]
		return n, err
	})
}

// writeBuffers writes bufs to the client (writev), consuming them, within WriteTimeout.
func (q *answerQueue) writeBuffers(bufs *net.Buffers) error {
	return q.withProgress(func() (int, error) {
		n, err := bufs.WriteTo(q.nc)
		return int(n), err
	})
}

// withProgress runs write, which writes what is left of an answer to the client, until it
// has all been written. The client must take writeProgress bytes, or all that is left, in
// every WriteTimeout: one that stops reading costs its own connection, closed with
// errWriteTimeout, and nobody else.
func (q *answerQueue) withProgress(write func() (int, error)) error {
	timeout := q.s.WriteTimeout
	for {
		if timeout > 0 {
			_ = q.nc.SetWriteDeadline(time.Now().Add(timeout))
			q.deadline = true
		}
		n, err := write()
		if err == nil || timeout <= 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if n < writeProgress {
			q.s.closedFor(closedWriteTimeout)
			return errWriteTimeout
		}
	}
}

// fail records the first failed write (or panic) and closes the socket, so that the reader
// stops; the answers still to come are dropped. The caller holds mu.
func (q *answerQueue) fail(err error) {
	if q.broken != nil {
		return
	}
	q.broken = err
	q.failed.Store(true)
	hangUp(q.nc)
}

// drain waits until every queued answer is written (or dropped, after a failed write).
// The requests in flight end within their timeouts, or at once when Shutdown gives up.
func (q *answerQueue) drain() {
	q.mu.Lock()
	for q.head < len(q.queue) || q.writing {
		q.cond.Wait()
	}
	q.mu.Unlock()
	if cap(q.wbuf) > keepOutput {
		q.wbuf = nil
	}
}
