package proxy

import (
	"context"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// meta answers a meta command. mn is answered here (the answers before it are written in
// order by the frontend); mg, ms, md and ma go to the server of their key — the decoded
// key, for a base64 key — which answers them itself (a backend sends them as sent, see
// backend's meta.go; an embedded store executes them). A meta command that changes its key
// is a write: it ends the hot cache entry and the shared fetches of the key, and lands on a
// stand-in only remembered, as every write does.
//
// Not done for meta commands: the hot cache and dedup (an mg asks the server each time,
// its flags may change the item), fire-and-forget, and copies to a backup pool.
func (p *Proxy) meta(ctx context.Context, t *topology.Topology, req *protocol.Request, one []protocol.Response) {
	if req.Op == protocol.OpMetaNoop {
		one[0] = protocol.Response{Meta: protocol.MetaAnswer{Code: protocol.MetaMN}}
		return
	}
	key := req.Key
	if changesKey(req.Op) {
		p.writes.begin(key)
		defer p.writes.end(key)
		p.settle(t, key)
		defer p.settle(t, key)
	}
	p.do(ctx, t.PoolFor(key), key, req, one)
}

// changesKey reports whether op writes its key: the write commands, and the meta commands
// but mg. (An mg with N or T changes the item too, but never to a value older than the
// one it holds.)
func changesKey(op protocol.Op) bool {
	return op.IsWrite() || op == protocol.OpMetaSet || op == protocol.OpMetaDelete || op == protocol.OpMetaArithmetic
}
