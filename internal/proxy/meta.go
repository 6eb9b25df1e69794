package proxy

import (
	"context"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// meta answers a meta command. mn is answered here (the answers before it are written in
// order by the frontend); mg, ms, md and ma go to the server of their key — the decoded
// key, for a base64 key — which answers them itself (a backend sends them as sent, see
// backend's meta.go; an embedded store executes them). A meta command that changes its key
// is a write: it ends the hot cache entry and the shared fetches of the key, and lands on a
// stand-in only remembered, as every write does.
//
// A pool's features apply as its servers compose them (package route): an mg that misses
// on a pool with warm_from is read from there, and every meta write also deletes its key
// there, as every write does.
//
// Not done for meta commands: the hot cache and dedup (an mg asks the server each time,
// its flags may change the item), fire-and-forget, and reads from a backup pool.
func (p *Proxy) meta(ctx context.Context, order *turn.Turn, t *topology.Topology, req *protocol.Request, one []protocol.Response) {
	if req.Op == protocol.OpMetaNoop {
		one[0] = protocol.Response{Meta: protocol.MetaAnswer{Code: protocol.MetaMN}}
		return
	}
	key, pl := req.Key, t.PoolFor(req.Key)
	if req.Op.ChangesKey() {
		p.beginWrite(t, key)
		defer p.endWrite(t, key)
	}
	p.do(ctx, order, pl, key, req, one)
}
