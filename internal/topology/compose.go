package topology

import (
	"slices"
	"time"

	"github.com/moxi-proxy/moxi/internal/failover"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/replica"
	"github.com/moxi-proxy/moxi/internal/route"
)

// Stack is what a pool's members are composed of around their servers. Compose is the one
// place that composes it, each layer holding the one under it (its next), innermost first:
//
//  1. the member's server: a memcached (package backend), an embedded shard (memstore) or a
//     placeholder; the pool is built over these;
//  2. Migration: while the member's server moves from migrate_from (package migrate);
//  3. Reshard: while keys move to the member from the servers that held them before a
//     change of the pool's servers (reshardServer);
//  4. failover: with replicas a replica (package replica), else with failover a stand-in
//     (package failover);
//  5. warm-up from warm_from, 6. backup, 7. shadow (package route).
//
// So a read that misses is read from the warm_from pool before the backup pool is asked,
// and a request is shadowed once its answer is final. Member.Base is the server after
// layer 2: its identity, which outlives reloads (StandIns remembers keys by it).
// Member.Server is the top, where the proxy sends requests; a layer that places a request
// anew (a stand-in, a replica) sends it to a member's layer under its own, never to
// another member's top, so no request passes a layer twice.
type Stack struct {
	Migration func(member int, next pool.Server) pool.Server // nil: none
	Reshard   func(member int, next pool.Server) pool.Server // nil: none

	StandIns    *failover.StandIns // the process's memory of stand-in writes and away replicas
	FailoverTTL time.Duration      // caps a stand-in write's expiry (failover.Exptime)
	Replica     replica.Options    // with replicas; its StandIns is StandIns

	route.Features
}

// Compose composes pl's members' stacks (see Stack), before pl is in service. The pools
// that st's features name may be composed before or after pl: their layers ask those
// pools' members' servers when they need them. It returns each member's server under its
// failover layer (layer 3, or the one under it when there is none): where a layer that
// places a request anew sends it.
func Compose(pl *pool.Pool, shared *route.Shared, st Stack) []pool.Server {
	servers := make([]pool.Server, pl.Len())
	for i := range servers {
		m := pl.Member(i)
		s := m.Server
		if st.Migration != nil {
			s = st.Migration(i, s)
		}
		m.Base = s
		if st.Reshard != nil {
			s = st.Reshard(i, s)
		}
		servers[i] = s
	}
	placed := slices.Clone(servers)
	st.Replica.StandIns = st.StandIns
	servers = replica.Wrap(pl, st.Replica, servers)
	servers = failover.Wrap(pl, st.StandIns, st.FailoverTTL, servers)
	for i, s := range servers {
		s = shared.WithWarmUp(pl, i, st.WarmFrom, s)
		s = shared.WithBackup(st.Backup, s)
		s = shared.WithShadow(pl, st.Shadow, st.ShadowFraction, s)
		pl.Member(i).Server = s
	}
	return placed
}
