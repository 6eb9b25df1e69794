package topology

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/migrate"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// A reshard keeps the keys of a pool warm when its servers change (a reload, an apply_at,
// a DNS answer): every key whose server changes moves from the server that held it before,
// through a migrate.Migration per pair of servers keys move between (pool.MovedFrom). A
// member that keys move to is a reshardServer: a key another server held before goes
// through that pair's Migration — a miss read through from the old server and copied with
// add, a write made here and deleted there — and the Migrations' background copies move
// the rest, deleting each moved key on its old server. The machinery is migrate_from's,
// for many slots at once.

// placing is a pool's key placement in a topology, and the reshard that is moving keys
// into it, if any.
type placing struct {
	placement Placement
	pool      *pool.Pool // places keys as placement says: its members' Addr are the servers
	reshard   *reshardRun
	copy      copySettings // how keys are copied between its servers (a rebuild's)
}

// reshardRun is one change of a pool's servers whose keys are still moving.
type reshardRun struct {
	name   string     // reshard-<n>: its /migrations entry and metric series
	before *pool.Pool // the placement the keys move from
	from   Placement  // what before was made of, for a successor (Builder.Moving)
}

// Placement is what places a pool's keys on its servers, as a value that a successor
// process can be handed (JSON): two equal Placements place every key on the same server.
type Placement struct {
	Distribution string         `json:"distribution"`
	Hash         string         `json:"hash"`
	HashTag      string         `json:"hash_tag,omitempty"`
	Replicas     int            `json:"replicas,omitempty"`
	Zones        []string       `json:"zones,omitempty"`
	Servers      []PlacedServer `json:"servers"`
}

// PlacedServer is a server of a Placement.
type PlacedServer struct {
	Name   string `json:"name"` // the member's name (config.Server.MemberName)
	Addr   string `json:"addr"`
	Weight int    `json:"weight"`
	Zone   string `json:"zone,omitempty"`
}

// placementOf is the placement of pc's keys.
func placementOf(pc *config.Pool) Placement {
	p := Placement{Distribution: pc.Distribution, Hash: pc.Hash, HashTag: pc.HashTag, Replicas: pc.Replicas, Zones: slices.Clone(pc.Zones)}
	for _, s := range pc.Servers {
		p.Servers = append(p.Servers, PlacedServer{Name: s.MemberName(), Addr: s.Addr, Weight: s.Weight, Zone: s.Zone})
	}
	return p
}

// equal reports whether p and q place every key on the same server.
func (p Placement) equal(q Placement) bool {
	return p.Distribution == q.Distribution && p.Hash == q.Hash && p.HashTag == q.HashTag && p.Replicas == q.Replicas &&
		slices.Equal(p.Zones, q.Zones) && slices.Equal(p.Servers, q.Servers)
}

// newPool is a pool named name that only places keys, as p does, without connections.
func (p Placement) newPool(name string) (*pool.Pool, error) {
	members := make([]pool.Member, len(p.Servers))
	for i, s := range p.Servers {
		members[i] = pool.Member{Name: s.Name, Addr: s.Addr, Weight: s.Weight, Zone: s.Zone, Server: unconnected{}}
	}
	return pool.New(name, pool.Options{Distribution: p.Distribution, Hash: p.Hash, HashTag: p.HashTag, Replicas: p.Replicas, Zones: p.Zones}, members)
}

// The kinds of runs that move a pool's keys, which its /migrations entries are named after.
const (
	reshardKind = "reshard"
	rebuildKind = "rebuild"
)

// runName is the name of a pool's n-th run of kind: kind-<n>.
func runName(kind string, n int) string { return kind + "-" + strconv.Itoa(n) }

// runNumber is n of kind-<n>, or 0 for another name.
func runNumber(kind, name string) int {
	digits, ok := strings.CutPrefix(name, kind+"-")
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n < 1 {
		return 0
	}
	return n
}

// reshardServer is a member's server while keys move to it: the member's own server for
// the keys it held before, and for each other server keys move from, the Migration from
// that server.
type reshardServer struct {
	self          string // the member's address
	next          pool.Server
	before, after *pool.Pool                    // the placements keys move from and to
	from          map[string]*migrate.Migration // by the old server's address
}

var _ pool.Server = (*reshardServer)(nil)

// via is the server that answers for key: the Migration from the server whose copy of it
// this one takes over (pool.PairedFrom), when there is one.
func (r *reshardServer) via(key []byte) pool.Server {
	if from, ok := r.after.PairedFrom(r.before, key, r.self); ok {
		if m := r.from[from]; m != nil {
			return m
		}
	}
	return r.next
}

// Start passes reqs on to the one server all their keys go through (via), when there is
// one; else it answers them one request after the other (do), on a goroutine that waits.
func (r *reshardServer) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	var to pool.Server
	through := func(key []byte) bool { // key's way is to's, or the first one
		via := r.next
		if key != nil {
			via = r.via(key)
		}
		if to != nil && via != to {
			return false
		}
		to = via
		return true
	}
	for i := range reqs {
		req := &reqs[i]
		same := true
		if len(req.Keys) > 0 {
			for _, k := range req.Keys {
				same = same && through(k)
			}
		} else {
			same = through(keyOf(req))
		}
		if !same {
			pool.StartWaiting(ctx, order, reqs, resps, errs, done, r.do)
			return
		}
	}
	to.Start(ctx, order, reqs, resps, errs, done)
}

// do answers a request through via of its key. A get of several keys that other servers
// held is answered here, and each one missing read through from the server that held it.
func (r *reshardServer) do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	switch {
	case len(req.Keys) > 1:
		first := r.via(req.Keys[0])
		if !slices.ContainsFunc(req.Keys[1:], func(k []byte) bool { return r.via(k) != first }) {
			return pool.Do(ctx, first, order, req, resps)
		}
	case keyOf(req) != nil:
		return pool.Do(ctx, r.via(keyOf(req)), order, req, resps)
	default:
		return pool.Do(ctx, r.next, order, req, resps) // no key: flush_all, stats…
	}
	if req.Op != protocol.OpGet && req.Op != protocol.OpGets {
		// A touch of many keys (gat): each through its own path, one at a time.
		return r.each(ctx, order, req, resps)
	}
	if err := pool.Do(ctx, r.next, order, req, resps); err != nil {
		return err
	}
	missed := map[*migrate.Migration][]int{}
	for i, k := range req.Keys {
		if m, ok := r.via(k).(*migrate.Migration); ok && resps[i].Status == protocol.StatusNotFound {
			missed[m] = append(missed[m], i)
		}
	}
	for m, at := range missed {
		keys := make([][]byte, len(at))
		for j, i := range at {
			keys[j] = req.Keys[i]
		}
		for j, it := range m.ReadMissed(ctx, keys) {
			if it.Found {
				resps[at[j]] = protocol.Response{Key: req.Keys[at[j]], Value: it.Value, Flags: it.Flags}
			}
		}
	}
	return nil
}

// each answers a request of several keys as one request per key, each through via, on the
// request's turn.
func (r *reshardServer) each(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	one, done := order.Defer()
	defer done()
	for i, k := range req.Keys {
		sub := *req
		sub.Keys = req.Keys[i : i+1]
		if err := pool.Do(ctx, r.via(k), one, &sub, resps[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

// keyOf is a request's key: its first for a retrieval; nil for one without.
func keyOf(req *protocol.Request) []byte {
	if len(req.Keys) > 0 {
		return req.Keys[0]
	}
	return req.Key
}

func (r *reshardServer) Up() bool               { return r.next.Up() }
func (r *reshardServer) Info() pool.Info        { return r.next.Info() }
func (r *reshardServer) Stats() []protocol.Stat { return r.next.Stats() }

// Close closes nothing: the member's server and the Migrations are the Builder's.
func (r *reshardServer) Close() error { return nil }
