package backend

import (
	"errors"
	"time"
)

// DeadState is a dead server's record, as one process hands it to its successor (an
// upgrade in place), so that the successor goes on probing where it left off rather than
// probe a server dead for an hour at once and at the shortest interval. It holds
// durations, not instants, so that the two processes' clocks need not agree. In JSON a
// duration is nanoseconds.
type DeadState struct {
	Reason  string        `json:"reason"`   // why: what marked it dead, or the last failed probe's error
	DeadFor time.Duration `json:"dead_for"` // how long it has been dead
	Backoff time.Duration `json:"backoff"`  // the wait between probes now: after the next failed probe, twice it, up to dead_backoff_max
	ProbeIn time.Duration `json:"probe_in"` // until the next probe; 0 while one is under way
}

// Dead is the server's record while it is dead, for MarkDead in a successor; false while
// it is up. It changes nothing.
func (s *Server) Dead() (DeadState, bool) {
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.dead.Load() {
		return DeadState{}, false
	}
	now := time.Now()
	return DeadState{Reason: h.reason.Error(), DeadFor: now.Sub(h.since), Backoff: h.backoff, ProbeIn: max(h.probeAt.Sub(now), 0)}, true
}

// MarkDead takes the server out of service as its own failures would, with the record st
// of its predecessor's (Dead): dead for st.DeadFor already (State's since), its first probe
// after st.ProbeIn, the ones after it at intervals doubling from st.Backoff. So its keys
// stay with their stand-ins, rather than go to it until it fails again. Backoff is held
// within this server's dead_backoff and dead_backoff_max (0 is dead_backoff), and ProbeIn
// within Backoff (0 probes at once). A server already dead takes on st in place of its
// own record, though its first probe comes no sooner than the wait its prober has begun.
func (s *Server) MarkDead(st DeadState) {
	backoff := min(max(st.Backoff, s.opts.RetryMin), s.opts.RetryMax)
	wait := min(max(st.ProbeIn, 0), backoff)
	s.die(errors.New(st.Reason), time.Now().Add(-max(st.DeadFor, 0)), backoff, wait, true)
}
