package backend

import "github.com/moxi-proxy/moxi/internal/sockpeek"

// A conn's watch times out the calls in its queue: one timer per connection rather than one
// per call, so that a request costs no timer set and stopped (each takes the runtime's timer
// locks and heap). It is set when a call is queued and the watch is not, fires at most once
// per Timeout while calls wait, and is left unset once the queue has none waiting.
//
// What times out is the server's silence, not the time since the call was queued: the
// answers before a call's (one 300 MB get, say) and its own may take longer than Timeout to
// arrive, and as long as they keep arriving the server is doing its job; nor is the server
// late while moxi has not written the call out yet, or not read what it sent (silence).
// The calls of a queue were written in order and share the connection's silence, so the
// oldest call waiting is the first to time out: when it has not, none has, and the watch
// is set again for the rest of its Timeout.

// onWatch gives up the calls whose server has been silent for Timeout, oldest first, and
// sets the watch again for the first that has not. It runs on a goroutine of its own.
func (c *conn) onWatch() {
	timeout := c.s.opts.Timeout
	peeked := false
	for {
		c.mu.Lock()
		cl := c.queue.oldestWaiting()
		if cl == nil {
			c.watched = false
			c.mu.Unlock()
			return
		}
		quiet := c.quiet(cl.sent.Load())
		if quiet < timeout {
			c.watch.Reset(timeout - quiet)
			c.mu.Unlock()
			return
		}
		if !peeked {
			// Bytes waiting that the reader has not been scheduled to read are moxi's delay,
			// not the server's: asked once (a system call), outside the lock, then the
			// queue is looked at again.
			nc := c.nc
			c.mu.Unlock()
			peeked = true
			if nc != nil && sockpeek.Waiting(nc) {
				c.mu.Lock()
				c.watch.Reset(timeout)
				c.mu.Unlock()
				return
			}
			continue
		}
		// In the queue under mu, cl is neither answered nor reused: abandon decides.
		abandoned := cl.abandon()
		c.mu.Unlock()
		if abandoned {
			cl.timedOut()
		}
	}
}

// oldestWaiting is the oldest call in q that its conn's watch times out: neither given up
// already (it stays until its late answer) nor moxi's own chase, which has no timeout.
func (q *fifo) oldestWaiting() *call {
	for _, cl := range q.items[q.head:] {
		if !cl.chase && cl.state.Load() == callWaiting {
			return cl
		}
	}
	return nil
}
