package failover

import (
	"context"
	"time"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// StandIns wraps each member's server of pl (servers[i], what is under this layer) in a
// stand-in, when keys can move: with failover, more than one member and no replicas (a
// key's other replicas stand in for a dead one, package replica). It returns the servers
// unchanged otherwise.
//
// While a member does not serve, some of its keys come to another member (pool.Locate),
// and a write of such a key is made there as a stand-in write: remembered for its owner
// (l, see StandIns), so that the owner serves again only once the stand-in copies are
// gone, and its expiry capped at failoverTTL (Exptime). Every other request passes through
// unchanged.
func Wrap(pl *pool.Pool, l *StandIns, failoverTTL time.Duration, servers []pool.Server) []pool.Server {
	if !pl.Failover() || pl.Len() < 2 || pl.Replicas() > 1 || l == nil {
		return servers
	}
	wrapped := make([]pool.Server, len(servers))
	for i, next := range servers {
		wrapped[i] = &standIn{next: next, pool: pl, self: i, standIns: l, ttl: failoverTTL, placed: wrapped}
	}
	return wrapped
}

type standIn struct {
	next     pool.Server
	pool     *pool.Pool
	self     int // the member's index in pool
	standIns *StandIns
	ttl      time.Duration
	// placed is every member's stand-in: where a write placed anew goes, under the layers
	// above this one, which it has passed already.
	placed []pool.Server
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
		s.next.Start(ctx, order, reqs, resps, errs, done)
		return
	}
	pool.StartWaiting(ctx, order, reqs, resps, errs, done, s.do)
}

// do executes one request, remembering it when it is a stand-in write.
func (s *standIn) do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	owner := s.owner(req)
	if owner < 0 {
		return pool.Do(ctx, s.next, order, req, resps)
	}
	home := s.pool.Member(owner)
	written := s.standIns.remember(home.Base, s.pool.Name(), home.Name, req.Key, s.pool.Member(s.self).Base)
	if written == nil {
		// The owner serves again since the key was placed here: place it anew.
		return pool.Do(ctx, s.placed[s.pool.Locate(req.Key)], order, req, resps)
	}
	defer written.Done()
	if req.Op.IsMeta() { // its TTL is one of its flags: remembered, not capped
		return pool.Do(ctx, s.next, order, req, resps)
	}
	capped := *req
	capped.Exptime = Exptime(req.Exptime, s.ttl)
	return pool.Do(ctx, s.next, order, &capped, resps)
}

// standsIn reports whether reqs hold a stand-in write to remember.
func (s *standIn) standsIn(reqs []protocol.Request) bool {
	for i := range reqs {
		if s.owner(&reqs[i]) >= 0 {
			return true
		}
	}
	return false
}

func (s *standIn) Up() bool               { return s.next.Up() }
func (s *standIn) Info() pool.Info        { return s.next.Info() }
func (s *standIn) Stats() []protocol.Stat { return s.next.Stats() }

// Close does nothing: whoever made the server (the topology's builder) closes it.
func (s *standIn) Close() error { return nil }

// Exptime is the expiry a write with exptime gets on a stand-in: at most failoverTTL from
// now, with memcached's rules (0 never expires, up to 30 days is relative, more is a unix
// time, negative has expired).
func Exptime(exptime int64, failoverTTL time.Duration) int64 {
	limit := int64((failoverTTL + time.Second - 1) / time.Second)
	if limit <= 0 || exptime < 0 {
		return exptime
	}
	const maxDelta = 60 * 60 * 24 * 30 // memcached's REALTIME_MAXDELTA
	rel := exptime
	if exptime > maxDelta {
		rel = exptime - time.Now().Unix()
		if rel <= 0 {
			return -1 // already expired
		}
	}
	if rel == 0 || rel > limit {
		return limit
	}
	return rel
}
