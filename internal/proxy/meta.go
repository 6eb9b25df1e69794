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
// An mg that misses on a pool with warm_from is read from there (warmMeta), and every meta
// write also deletes its key there, as every write does.
//
// Not done for meta commands: the hot cache and dedup (an mg asks the server each time,
// its flags may change the item), fire-and-forget, and copies to a backup pool.
func (p *Proxy) meta(ctx context.Context, t *topology.Topology, req *protocol.Request, one []protocol.Response) {
	if req.Op == protocol.OpMetaNoop {
		one[0] = protocol.Response{Meta: protocol.MetaAnswer{Code: protocol.MetaMN}}
		return
	}
	key, pl := req.Key, t.PoolFor(req.Key)
	if changesKey(req.Op) {
		p.writes.begin(key)
		defer p.writes.end(key)
		p.settle(t, key)
		defer p.settle(t, key)
		p.do(ctx, pl, key, req, one)
		p.dropOld(ctx, t, pl, key, &one[0])
		return
	}
	// An mg with N made the item on its miss: that is its answer.
	if req.Op != protocol.OpMetaGet || req.Meta.Vivify || t.WarmFrom[pl] == nil {
		p.do(ctx, pl, key, req, one)
		return
	}
	epoch := p.writes.epoch(key) // before the read: see warmup.go
	p.do(ctx, pl, key, req, one)
	if one[0].Meta.Code == protocol.MetaEN && !p.warmSkip.has(key) {
		p.warmMeta(ctx, t, pl, req, one, epoch)
	}
}

// changesKey reports whether op writes its key: the write commands, and the meta commands
// but mg. (An mg with N or T changes the item too, but never to a value older than the
// one it holds.)
func changesKey(op protocol.Op) bool {
	return op.IsWrite() || op == protocol.OpMetaSet || op == protocol.OpMetaDelete || op == protocol.OpMetaArithmetic
}
