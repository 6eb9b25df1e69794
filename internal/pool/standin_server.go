package pool

import (
	"context"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// standIn is a member's server in a pool with failover: while another member does not
// serve, some of that member's keys come here (Locate), and a write of such a key is made
// here as a stand-in write. It is remembered for its owner (StandIns), so that the owner
// serves again only once the stand-in copies are gone, and its expiry is capped at the
// pool's failover_ttl (standInExptime). The pool composes it around each member's server
// when it is built; every other request passes through unchanged.
type standIn struct {
	inner Server
	pool  *Pool
	self  int // the member's index in pool
}

var _ Server = (*standIn)(nil)

// composeStandIns wraps each member's server of p in a standIn, when keys can move: with
// failover and more than one member.
func (p *Pool) composeStandIns() {
	if !p.opts.Failover || len(p.members) < 2 {
		return
	}
	for i := range p.members {
		m := &p.members[i]
		m.Server = &standIn{inner: m.Server, pool: p, self: i}
	}
}

// owner is the member that owns a write's key when that is not this one (a stand-in
// write), else -1.
func (s *standIn) owner(req *protocol.Request) int {
	if !req.Op.ChangesKey() {
		return -1
	}
	if o := s.pool.Owner(req.Key); o != s.self {
		return o
	}
	return -1
}

// Start passes reqs on when they hold no stand-in write, else executes them one after the
// other, remembering the stand-in writes (do).
func (s *standIn) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	if !s.standsIn(reqs) {
		s.inner.Start(ctx, order, reqs, resps, errs, done)
		return
	}
	StartWaiting(ctx, order, reqs, resps, errs, done, s.do)
}

// do executes one request, remembering it when it is a stand-in write.
func (s *standIn) do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	owner := s.owner(req)
	if owner < 0 || s.pool.opts.StandIns == nil {
		return Do(ctx, s.inner, order, req, resps)
	}
	written := s.pool.opts.StandIns.remember(s.pool.members[owner].Base, s.pool.name, s.pool.members[owner].Name, req.Key, s.pool.members[s.self].Base)
	if written == nil {
		// The owner serves again since the key was placed here: place it anew, below the
		// features composed around the pool's members, which this request has passed.
		return Do(ctx, s.pool.placed[s.pool.Locate(req.Key)], order, req, resps)
	}
	defer written.Done()
	if req.Op.IsMeta() { // its TTL is one of its flags: remembered, not capped
		return Do(ctx, s.inner, order, req, resps)
	}
	capped := *req
	capped.Exptime = s.pool.standInExptime(req.Exptime)
	return Do(ctx, s.inner, order, &capped, resps)
}

// standsIn reports whether reqs hold a stand-in write to remember.
func (s *standIn) standsIn(reqs []protocol.Request) bool {
	if s.pool.opts.StandIns == nil {
		return false
	}
	for i := range reqs {
		if s.owner(&reqs[i]) >= 0 {
			return true
		}
	}
	return false
}

func (s *standIn) Up() bool               { return s.inner.Up() }
func (s *standIn) Info() Info             { return s.inner.Info() }
func (s *standIn) Stats() []protocol.Stat { return s.inner.Stats() }

// Close does nothing: whoever made the server (the topology's builder) closes it.
func (s *standIn) Close() error { return nil }
