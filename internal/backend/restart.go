package backend

import (
	"context"
	"strconv"
	"sync"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// A server's start instant is memcached's "time" − "uptime" (both whole seconds), read
// from its stats on every new connection. A later instant than the one recorded means
// memcached restarted, and so is empty, whether moxi saw it die or not: a restart faster
// than failure_limit notices, or a container, where a pid says nothing. Options.Restarted
// is told.

// restartSlack is how far the start instant must move to be a restart: time and uptime are
// whole seconds, so two reads of one process's differ by at most one.
const restartSlack = 2

// startCheck is the state of the server's start-instant checks.
type startCheck struct {
	mu      sync.Mutex
	running bool  // a check runs
	again   bool  // a connection was made since that check began: check once more
	started int64 // the recorded start instant (unix seconds); 0 before the first
}

// checkStart checks the start instant once a connection is made: at once, or after the
// check in progress, whose answer may have come from the process before a restart.
func (s *Server) checkStart() {
	if s.opts.Restarted == nil {
		return
	}
	c := &s.starts
	c.mu.Lock()
	c.again = true
	if c.running {
		c.mu.Unlock()
		return
	}
	c.running = true
	c.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c.mu.Lock()
			if !c.again {
				c.running = false
				c.mu.Unlock()
				return
			}
			c.again = false
			c.mu.Unlock()
			s.checkStartOnce()
		}
	}()
}

// checkStartOnce reads the start instant and compares it with the one recorded.
func (s *Server) checkStartOnce() {
	// Within the server's own timeouts; Close fails it at once.
	ctx := context.Background()
	var resp [1]protocol.Response
	if err := pool.Do(ctx, s, nil, &protocol.Request{Op: protocol.OpStats}, resp[:]); err != nil {
		return // the next connection checks again
	}
	start, ok := startInstant(resp[0].Stats)
	if !ok {
		return
	}
	c := &s.starts
	c.mu.Lock()
	prev := c.started
	c.started = start
	c.mu.Unlock()
	if prev != 0 && start-prev >= restartSlack {
		s.opts.Logger.Warn("memcached restarted: it is empty", "addr", s.opts.Addr, "started_at", start, "was_started_at", prev)
		s.opts.Restarted(start)
	}
}

// startInstant is time − uptime of a memcached's general stats.
func startInstant(stats []protocol.Stat) (int64, bool) {
	var now, uptime int64
	var haveNow, haveUptime bool
	for _, st := range stats {
		switch st.Name {
		case "time":
			n, err := strconv.ParseInt(st.Value, 10, 64)
			now, haveNow = n, err == nil
		case "uptime":
			n, err := strconv.ParseInt(st.Value, 10, 64)
			uptime, haveUptime = n, err == nil
		}
	}
	return now - uptime, haveNow && haveUptime
}
