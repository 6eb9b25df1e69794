package proxy

import (
	"github.com/moxi-proxy/moxi/internal/hotkeys"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// noteHot counts req's keys in their pools' hot-key sketches (hot_keys), each with the
// bytes it moved: its key and value, or its key and the value answered. pl is every key's
// pool, or nil when they span pools.
func noteHot(t *topology.Topology, pl *pool.Pool, req *protocol.Request, resps []protocol.Response) {
	var one *hotkeys.Sketch
	if pl != nil {
		one = t.HotKeys[pl]
	}
	sketchOf := func(key []byte) *hotkeys.Sketch {
		if one != nil {
			return one
		}
		return t.HotKeys[t.PoolFor(key)]
	}
	if req.Op.IsRetrieval() {
		for i, k := range req.Keys {
			n := len(k)
			if i < len(resps) {
				n += len(resps[i].Value)
			}
			sketchOf(k).Observe(k, n)
		}
		return
	}
	if req.Key == nil {
		return // no key: stats, version, flush_all…
	}
	n := len(req.Key) + len(req.Value)
	if len(resps) > 0 {
		n += len(resps[0].Value)
	}
	sketchOf(req.Key).Observe(req.Key, n)
}
