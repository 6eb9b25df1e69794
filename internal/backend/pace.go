package backend

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/moxi-proxy/moxi/internal/sockpeek"
)

// The pace an answer must keep once it has begun (docs/resource-bounds.md): answerPaceBytes of it, or
// the rest of it, in every answerPaceWindow while moxi reads it. A call's timeout measures
// the server's silence only, and a server that drips a byte now and then is never silent:
// without a pace it would hold every request on its connection forever.
const (
	answerPaceBytes  = 128 << 10
	answerPaceWindow = 125 * time.Millisecond
)

// errSlowAnswer fails the requests on a connection whose answer fell below the pace: as
// a timeout, which the caller retries and the server's health counts.
var errSlowAnswer = fmt.Errorf("answer slower than %d KiB per %v: %w", answerPaceBytes>>10, answerPaceWindow, ErrTimeout)

// pacedReader is a server connection as its reading goroutine reads it, which owns every
// field: between begin and end, one answer's reads, which must keep the pace.
type pacedReader struct {
	nc        net.Conn
	answering bool // between begin and end
	timed     bool // nc has a read deadline, which end clears
	got       int  // bytes read in the current window
}

// begin starts an answer, once its first byte has been read.
func (r *pacedReader) begin() { r.answering = true }

// end ends the answer begun last.
func (r *pacedReader) end() {
	r.answering = false
	if r.timed {
		r.timed = false
		_ = r.nc.SetReadDeadline(time.Time{})
	}
}

// Read reads from nc. While an answer is in progress, it fails with errSlowAnswer when a
// window ends before answerPaceBytes (or the rest of the answer, which ends it) have come,
// unless bytes wait that moxi was too slow to read: that delay is moxi's, not the server's,
// and a new window begins.
func (r *pacedReader) Read(p []byte) (int, error) {
	if !r.answering {
		return r.nc.Read(p)
	}
	if !r.timed { // only now: an answer already buffered whole costs no deadline
		r.restart()
	}
	for {
		n, err := r.nc.Read(p)
		if r.got += n; r.got >= answerPaceBytes {
			r.restart()
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		if n > 0 {
			return n, nil // the next Read meets the deadline again
		}
		if !sockpeek.Waiting(r.nc) {
			return 0, errSlowAnswer
		}
		r.restart()
	}
}

// restart begins a window now: the answer's first read from nc, or one after the last
// answerPaceBytes.
func (r *pacedReader) restart() {
	r.got, r.timed = 0, true
	_ = r.nc.SetReadDeadline(time.Now().Add(answerPaceWindow))
}
