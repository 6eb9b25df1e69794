package topology

import (
	"bytes"
	"time"

	"github.com/moxi-proxy/moxi/internal/auth"
	"github.com/moxi-proxy/moxi/internal/hotcache"
	"github.com/moxi-proxy/moxi/internal/hotkeys"
	"github.com/moxi-proxy/moxi/internal/migrate"
	"github.com/moxi-proxy/moxi/internal/pool"
)

// Route sends keys that start with Prefix to Pool.
type Route struct {
	Prefix []byte
	Pool   *pool.Pool
}

// Topology is an immutable routing table: the pools, the prefix routes tried in order, the
// pool for every other key, and the per-key features. A reload builds a new Topology and the
// proxy swaps it in whole; requests in flight finish on the one they started with.
type Topology struct {
	Pools   []*pool.Pool
	Routes  []Route
	Default *pool.Pool
	Dedup   bool            // coalesce identical concurrent get/gets
	Hot     *hotcache.Cache // nil: no hot cache
	// HotKeys is each pool's sketch of the keys that take most of its requests (hot_keys);
	// nil when off. AbsorbHot (hot_keys.cache): a key a sketch finds hot is answered from
	// Hot too, prefix or not (HotKey).
	HotKeys       map[*pool.Pool]*hotkeys.Sketch
	AbsorbHot     bool
	FireAndForget [][]byte // prefixes whose writes are answered at once and sent in the background
	NoFlushAll    bool     // refuse flush_all and binary flush, as memcached -F does (limits.allow_flush_all: false)
	// Namespaced: keys are stored as "<user>:<key>" (auth.namespaces), and routes and
	// prefixes match the client's key, the part after the namespace.
	Namespaced bool

	// Listeners are the table as the clients of each further listener see it, by address:
	// the same but for Default, that listener's default pool. nil when there are none.
	Listeners map[string]*Topology

	// placed is, per pool, each member's server under its failover layer (Compose's
	// answer), for MovingFrom; nil for a table not made by a Builder.
	placed map[*pool.Pool][]pool.Server

	// Next, when set, replaces this table from NextAt on (a config's apply_at): every
	// request that starts then uses it, however late the timer that installs it fires.
	Next   *Topology
	NextAt time.Time
}

// InService is the table a request starting at now uses: t, or from NextAt on, Next.
func (t *Topology) InService(now time.Time) *Topology {
	if t.Next != nil && !now.Before(t.NextAt) {
		return t.Next
	}
	return t
}

// Current is InService now; it reads the clock only when a table is scheduled.
func (t *Topology) Current() *Topology {
	if t.Next == nil {
		return t
	}
	return t.InService(time.Now())
}

// Until returns a copy of t that hands over to next at at (see Next). The copy shares no
// fetches between reads (dedup): a fetch it started just before at, from a server that
// next no longer reads the key from, must not answer a read made after at.
func (t *Topology) Until(at time.Time, next *Topology) *Topology {
	c := *t
	c.Next, c.NextAt, c.Dedup = next, at, false
	if t.Listeners != nil {
		c.Listeners = make(map[string]*Topology, len(t.Listeners))
		for addr, v := range t.Listeners {
			c.Listeners[addr] = c.withDefault(v.Default)
		}
	}
	return &c
}

// ForListener is the table for the clients of the listener at addr: t with that
// listener's default pool, or t itself for the main listen address and any address the
// table has no listener for (one a reload dropped: its port stays open until a restart).
// Call it on the table InService returned: a listener's table has no Next of its own.
func (t *Topology) ForListener(addr string) *Topology {
	if v := t.Listeners[addr]; v != nil {
		return v
	}
	return t
}

// withDefault is a copy of t whose keys that no route matches go to def.
func (t *Topology) withDefault(def *pool.Pool) *Topology {
	c := *t
	c.Default, c.Listeners, c.Next = def, nil, nil
	return &c
}

// InBackground reports whether writes of key are fire-and-forget: answered at once and
// sent in the background.
func (t *Topology) InBackground(key []byte) bool {
	key = t.clientKey(key)
	for _, p := range t.FireAndForget {
		if bytes.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// PoolFor is the pool that key routes to: the first route whose prefix it has, else Default.
func (t *Topology) PoolFor(key []byte) *pool.Pool {
	key = t.clientKey(key)
	for i := range t.Routes {
		if bytes.HasPrefix(key, t.Routes[i].Prefix) {
			return t.Routes[i].Pool
		}
	}
	return t.Default
}

// clientKey is key, as stored, as its client named it.
func (t *Topology) clientKey(key []byte) []byte {
	if t.Namespaced {
		return auth.ClientKey(key)
	}
	return key
}

// Locate is the member that serves key now.
func (t *Topology) Locate(key []byte) *pool.Member {
	p := t.PoolFor(key)
	return p.Member(p.Locate(key))
}

// MovingFrom is, while key moves to member i of pl — the member's migrate_from migration, or
// a reshard moving key to it — the address of the server key is read from until it has
// moved (the old one); "" when key is not moving. It follows key's way down the member's
// stack as a request does: the reshard's way for key (reshardServer.via), then the
// migration it reaches, if any.
func (t *Topology) MovingFrom(pl *pool.Pool, i int, key []byte) string {
	servers := t.placed[pl]
	if servers == nil {
		return ""
	}
	s := servers[i]
	if r, ok := s.(*reshardServer); ok {
		s = r.via(key)
	}
	if m, ok := s.(*migrate.Migration); ok {
		return m.ReadsFrom()
	}
	return ""
}

// Members is every member of every pool, in config order.
func (t *Topology) Members() []*pool.Member {
	var ms []*pool.Member
	for _, pl := range t.Pools {
		for i := range pl.Len() {
			ms = append(ms, pl.Member(i))
		}
	}
	return ms
}
