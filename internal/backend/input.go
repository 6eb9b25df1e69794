package backend

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"

	"github.com/moxi-proxy/moxi/internal/burst"
	"github.com/moxi-proxy/moxi/internal/nbsys"
)

// Reading a server connection's answers without a read that finds nothing. Go's poller
// tries a socket before each wait, so a reader that goes back to waiting after each burst
// of answers pays one failed read a burst. readLoop instead decodes the answers that came
// whole inside the socket's raw read (answerInput.wait) — after a burst of them it may read
// again at once instead of waiting (burst.Guess) — and leaves that wait only for an answer
// that came in part, which it decodes again, from its first byte, as before:
// reading the rest at the answer's pace (pacedReader).

// errNeedMore is answerInput's Read inside the wait when the answer being decoded has not
// all come.
var errNeedMore = errors.New("answer not all read yet")

// inputBuffers holds the buffers of reads in the wait: a connection holds one only while
// it decodes what came.
var inputBuffers = sync.Pool{New: func() any { b := make([]byte, inputBufferSize); return &b }}

// inputBufferSize is a read's size in the wait: as large as readLoop's bufio.Reader, so
// that a burst that fits one costs one read. A read that fills it is decoded outside the
// wait, where the rest is read.
const inputBufferSize = 32 << 10

// answerInput is what readLoop's bufio.Reader reads: the bytes a read in the wait got
// (pending), then the socket, at the answer's pace. It is owned by readLoop.
type answerInput struct {
	c       *conn
	r       *pacedReader
	raw     syscall.RawConn // the socket, for the wait; nil under TLS, which is read as before
	buf     *[]byte         // the buffer pending is in, from inputBuffers; nil when none
	pending []byte
	inWait  bool        // decoding inside the wait: Read must not wait
	guess   burst.Guess // whether to read again at once after a burst of answers
}

func newAnswerInput(c *conn, r *pacedReader, nc net.Conn) *answerInput {
	return &answerInput{c: c, r: r, raw: plainSocket(nc)}
}

// tlsState is a connection under TLS: crypto/tls's, or a type that embeds it (dial's
// tlsConn, which also offers the socket under it). Whether a connection is TLS is asked of
// this capability, never of a concrete type: read as a socket, TLS records are not answers.
type tlsState interface {
	ConnectionState() tls.ConnectionState
}

var _ tlsState = tlsConn{}

func (in *answerInput) Read(p []byte) (int, error) {
	if len(in.pending) > 0 {
		n := copy(p, in.pending)
		in.pending = in.pending[n:]
		if len(in.pending) == 0 && !in.inWait {
			in.putBuffer()
		}
		return n, nil
	}
	if in.inWait {
		return 0, errNeedMore
	}
	// Waiting for the server: the only time a silence can be the server's.
	in.c.waiting.Store(in.c.s.clock())
	n, err := in.r.Read(p)
	in.c.waiting.Store(0)
	return n, err
}

func (in *answerInput) putBuffer() {
	if in.buf != nil {
		inputBuffers.Put(in.buf)
		in.buf = nil
	}
}

// wait waits for answers on the socket, and decodes (decode, one answer a call) those that
// come whole, without leaving the wait, until one comes in part or an error. It reports
// what ended it: nil when the bufio.Reader br holds, or pending, the start of an answer for
// readLoop to decode outside. Only called with nothing buffered, in br or pending.
func (in *answerInput) wait(br interface{ Buffered() int }, reset func(), decode func() error) error {
	var ended error
	err := in.raw.Read(func(fd uintptr) bool {
		for again := false; ; {
			buf := inputBuffers.Get().(*[]byte)
			n, err := nbsys.Read(fd, *buf)
			for errors.Is(err, syscall.EINTR) {
				n, err = nbsys.Read(fd, *buf)
			}
			if again {
				in.guess.Found(n > 0)
			}
			in.c.waiting.Store(0)
			switch {
			case errors.Is(err, syscall.EAGAIN):
				inputBuffers.Put(buf)
				in.c.waiting.Store(in.c.s.clock())
				return false
			case n <= 0:
				inputBuffers.Put(buf)
				ended = err
				if err == nil {
					ended = io.EOF
				}
				return true
			}
			in.buf, in.pending = buf, (*buf)[:n]
			if n == len(*buf) {
				return true // a burst larger than one read: decoded outside, where the rest is read
			}
			answers := 0
			in.inWait = true
			for br.Buffered() > 0 || len(in.pending) > 0 {
				undecoded := br.Buffered() + len(in.pending) // the bytes of this answer and those after it
				switch err := decode(); {
				case errors.Is(err, errNeedMore):
					in.inWait = false
					reset() // what br holds of the answer goes
					in.pending = (*buf)[n-undecoded : n]
					return true
				case err != nil:
					in.inWait = false
					ended = err
					return true
				}
				answers++
			}
			in.inWait = false
			in.putBuffer()
			if again = in.guess.ReadAgain(answers); !again {
				in.c.waiting.Store(in.c.s.clock())
				return false
			}
		}
	})
	if err != nil {
		return err
	}
	return ended
}

// hangUp ends nc both ways at once, waking its reader and its writer; readLoop closes it
// when it leaves. Close would wait for a reader in its wait, which holds the socket's read
// lock. A TLS connection, never read that way, is closed.
func hangUp(nc net.Conn) {
	if raw := plainSocket(nc); raw != nil {
		_ = raw.Control(func(fd uintptr) { _ = syscall.Shutdown(int(fd), syscall.SHUT_RDWR) })
		return
	}
	_ = nc.Close()
}
