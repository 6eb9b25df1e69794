package frontend

import "github.com/moxi-proxy/moxi/internal/protocol"

// Answers written in parts: a multi-key get larger than a part is fetched and answered
// part by part, by the task's own goroutine holding the connection's writer token.

// stream answers a multi-key retrieval too large to hold whole, part by part: it waits to
// be the first answer due, takes the writer token, and then fetches a part, writes it,
// fetches the next. It holds its turn to the end, so that no later request overtakes a
// later part.
func (c *conn) stream(t *task) {
	each, given := t.order().Defer() // the parts' turn; the task's is given on after the last
	broken := c.answers.takeWriter(t)
	keys := t.req.Keys
	part := c.s.partKeys()
	for first := 0; first < len(keys) && broken == nil; {
		end := min(first+part, len(keys))
		sub := t.req
		sub.Keys = keys[first:end]
		t.resps = c.handler.Handle(c.s.ctx, each, t.alone(&sub), t.resps[:0])
		avg := c.s.observe(&sub, t.resps)
		c.owe(t, &sub, t.resps) // its user's bytes limit (limits.go)
		c.noteAnswers(t, t.resps)
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
	given()
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
	c.writeFetched(t)
}
