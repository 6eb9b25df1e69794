package route

import (
	"context"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// askEach sends the keys of a retrieval req at idx to the servers of pl that serve them,
// one request per server, in parallel, and puts the answers in out (indexed as req.Keys).
// answered[j] reports whether the server of req.Keys[idx[j]] answered. Each server is
// asked once: a pool asked on another's behalf (a backup, a shadow) is not retried.
func askEach(ctx context.Context, order *turn.Turn, pl *pool.Pool, req *protocol.Request, out []protocol.Response, idx []int) (answered []bool) {
	shares := pool.GroupByMember(pl.Itself, req.Keys, idx)
	parts := make([]pool.Part, len(shares))
	for s, sh := range shares {
		at := make([]int, len(sh.At))
		for n, j := range sh.At {
			at[n] = idx[j]
		}
		parts[s] = pool.KeysPart(sh.Member.Server, req, at, out)
	}
	pool.DoParts(ctx, order, parts)
	answered = make([]bool, len(idx))
	for s, sh := range shares {
		if parts[s].Errs[0] != nil {
			continue
		}
		parts[s].Place(out)
		for _, j := range sh.At {
			answered[j] = true
		}
	}
	return answered
}

// all is the indexes 0 to n-1.
func all(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}
