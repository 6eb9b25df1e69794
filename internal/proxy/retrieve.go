package proxy

import (
	"context"
	"sync"

	"moxi/internal/pool"
	"moxi/internal/protocol"
)

// retrieve answers a get, gets, gat or gats: the keys are split by the server that serves
// them, each server's share sent as one request, in parallel, and the answers put back in
// the client's key order. Keys that miss or fail are then tried on their pool's backup.
func (p *Proxy) retrieve(ctx context.Context, t *Topology, req *protocol.Request, resps []protocol.Response) []protocol.Response {
	base := len(resps)
	for range req.Keys {
		resps = append(resps, protocol.Response{})
	}
	out := resps[base:]
	if len(req.Keys) == 1 {
		pl := t.PoolFor(req.Keys[0])
		p.do(ctx, pl, req.Keys[0], req, out)
		if b := t.Backups[pl]; b != nil && wantsBackup(&out[0]) {
			p.readBackup(ctx, t, req, out)
		}
		return resps
	}
	p.fanOut(ctx, t.PoolFor, req, out, nil)
	if len(t.Backups) > 0 {
		p.readBackup(ctx, t, req, out)
	}
	return resps
}

// share is the keys of one request that one member serves: indexes into the request.
type share struct {
	pool   *pool.Pool
	member *pool.Member
	idx    []int
}

// fanOut fetches req.Keys[i] for every i in idx (all keys when idx is nil) into out[i],
// placing each key with poolFor. A share whose server did not answer is tried again, up to
// its pool's retries, after placing its keys anew (failover may have moved them).
func (p *Proxy) fanOut(ctx context.Context, poolFor func([]byte) *pool.Pool, req *protocol.Request, out []protocol.Response, idx []int) {
	if idx == nil {
		idx = make([]int, len(req.Keys))
		for i := range idx {
			idx[i] = i
		}
	}
	for attempt := 0; len(idx) > 0; attempt++ {
		shares := split(poolFor, req.Keys, idx)
		errs := make([]error, len(shares))
		var wg sync.WaitGroup
		for s := range shares {
			run := func() { errs[s] = p.fetchShare(ctx, req, &shares[s], out) }
			if s == len(shares)-1 {
				run() // the last share on this goroutine
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); run() }()
		}
		wg.Wait()
		idx = idx[:0:0]
		for s, err := range errs {
			if err == nil {
				continue
			}
			sh := &shares[s]
			if attempt < sh.pool.Retries() && ctx.Err() == nil {
				idx = append(idx, sh.idx...)
				continue
			}
			failed := protocol.Response{Status: protocol.StatusTempFailure, Msg: "backend " + sh.member.Name + ": " + err.Error()}
			for _, i := range sh.idx {
				out[i] = failed
				out[i].Key = req.Keys[i]
			}
		}
	}
}

// split groups the keys at idx by the member that serves them. A request has few distinct
// members, so a linear scan beats a map.
func split(poolFor func([]byte) *pool.Pool, keys [][]byte, idx []int) []share {
	var shares []share
	for _, i := range idx {
		pl := poolFor(keys[i])
		m := pl.Member(pl.Locate(keys[i]))
		s := 0
		for s < len(shares) && shares[s].member != m {
			s++
		}
		if s == len(shares) {
			shares = append(shares, share{pool: pl, member: m})
		}
		shares[s].idx = append(shares[s].idx, i)
	}
	return shares
}

// fetchShare sends one member its share of req's keys and places the answers in out.
func (p *Proxy) fetchShare(ctx context.Context, req *protocol.Request, sh *share, out []protocol.Response) error {
	if len(sh.idx) == len(req.Keys) && sh.idx[0] == 0 && sh.idx[len(sh.idx)-1] == len(req.Keys)-1 {
		return sh.member.Server.Do(ctx, req, out) // one server has every key, in order
	}
	sub := *req
	sub.Keys = make([][]byte, len(sh.idx))
	for j, i := range sh.idx {
		sub.Keys[j] = req.Keys[i]
	}
	answers := make([]protocol.Response, len(sh.idx))
	if err := sh.member.Server.Do(ctx, &sub, answers); err != nil {
		return err
	}
	for j, i := range sh.idx {
		out[i] = answers[j]
	}
	return nil
}
