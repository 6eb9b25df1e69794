package frontend

import (
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// How long requests take as their clients see them: from a request's first byte read to
// its answer's last byte written, the one measure both moxi_request_duration_seconds and
// the request log's micros use, so that "slower than X" counts the same requests in both.

// Timer is a Handler that counts how long its requests took (Took: n requests of op took
// seconds each, counted once their answers were written).
type Timer interface {
	Took(op protocol.Op, n int, seconds float64)
}

// took counts, once t's answer was written at now, how long each of its client requests
// took: a run's all took the run's time, counted a stretch of one command at a time.
func (c *conn) took(t *task, now time.Time) {
	if c.timer == nil || !t.timed {
		return
	}
	seconds := now.Sub(t.firstByte).Seconds()
	if !t.single {
		c.timer.Took(t.req.Op, 1, seconds)
		return
	}
	for from := 0; from < len(t.batch); {
		op, to := t.batch[from].Op, from+1
		for to < len(t.batch) && t.batch[to].Op == op {
			to++
		}
		c.timer.Took(op, to-from, seconds)
		from = to
	}
}
