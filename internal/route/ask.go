package route

import (
	"context"
	"sync"

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
	answered = make([]bool, len(idx))
	var wg sync.WaitGroup
	for _, sh := range shares {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := *req
			sub.Keys = make([][]byte, len(sh.At))
			for n, j := range sh.At {
				sub.Keys[n] = req.Keys[idx[j]]
			}
			answers := make([]protocol.Response, len(sub.Keys))
			if err := pool.Do(ctx, sh.Member.Server, order, &sub, answers); err != nil {
				return
			}
			for n, j := range sh.At {
				out[idx[j]], answered[j] = answers[n], true
			}
		}()
	}
	wg.Wait()
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
