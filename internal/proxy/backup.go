package proxy

import (
	"context"
	"time"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// maxMirrors bounds the writes being copied to backup pools at once, as the proxy's
// background budget bounds their bytes; past either a copy is dropped (and counted) rather
// than letting memory grow with a slow backup.
const maxMirrors = 1024

// mirrorTimeout bounds one copy, on top of the backup server's own timeout.
const mirrorTimeout = 5 * time.Second

// wantsBackup says whether an answer from the primary pool should be tried on the backup:
// a miss, or no answer at all.
func wantsBackup(r *protocol.Response) bool {
	return r.Status == protocol.StatusNotFound || r.Status == protocol.StatusTempFailure
}

// readBackup asks each key's backup pool for the keys (among those at among; nil: all) that
// missed or failed on their own pool, as magent does. A backup hit replaces the answer; so does any answer from the
// backup when the primary gave none.
func (p *Proxy) readBackup(ctx context.Context, t *topology.Topology, req *protocol.Request, out []protocol.Response, among []int) {
	var idx []int
	consider := func(i int) {
		if wantsBackup(&out[i]) && t.Backups[t.PoolFor(req.Keys[i])] != nil {
			idx = append(idx, i)
		}
	}
	if among == nil {
		for i := range out {
			consider(i)
		}
	} else {
		for _, i := range among {
			consider(i)
		}
	}
	if len(idx) == 0 {
		return
	}
	p.stats.backupReads.Add(uint64(len(idx)))
	answers := make([]protocol.Response, len(out))
	p.fanOut(ctx, func(k []byte) *pool.Pool { return t.Backups[t.PoolFor(k)] }, req, answers, idx)
	for _, i := range idx {
		a := &answers[i]
		if a.Status == protocol.StatusOK || (out[i].Status == protocol.StatusTempFailure && a.Status != protocol.StatusTempFailure) {
			if a.Status == protocol.StatusOK {
				p.stats.backupHits.Add(1)
			}
			out[i] = *a
		}
	}
}

// mirror copies a write to the backup pool in the background. The request is copied first:
// its bytes belong to the client connection. A cas that succeeded is copied as a set (the
// backup's cas values differ); one that failed changed nothing and is not copied.
func (p *Proxy) mirror(b *pool.Pool, req *protocol.Request, primary *protocol.Response) {
	op := req.Op
	if op == protocol.OpCas {
		if primary.Status != protocol.StatusOK {
			return
		}
		op = protocol.OpSet
	}
	w := requestBytes(req)
	if !p.background.TryAcquire(w) {
		p.stats.mirrorsDropped.Add(1)
		return
	}
	select {
	case p.mirrors <- struct{}{}:
	default:
		p.background.Release(w)
		p.stats.mirrorsDropped.Add(1)
		return
	}
	cp := protocol.Request{
		Op:      op,
		Key:     append([]byte(nil), req.Key...),
		Value:   append([]byte(nil), req.Value...),
		Flags:   req.Flags,
		Exptime: req.Exptime,
		Delta:   req.Delta,
		Initial: req.Initial,
		Create:  req.Create,
	}
	p.mirroring.Add(1)
	go func() {
		defer func() { <-p.mirrors; p.background.Release(w); p.mirroring.Done() }()
		ctx, cancel := context.WithTimeout(context.Background(), mirrorTimeout)
		defer cancel()
		var resp [1]protocol.Response
		m := b.Member(b.Locate(cp.Key))
		if err := m.Server.Do(ctx, &cp, resp[:]); err != nil {
			p.stats.mirrorErrors.Add(1)
			return
		}
		p.stats.mirrors.Add(1)
	}()
}

// Wait waits until the writes being copied to backup pools are done, or ctx ends.
func (p *Proxy) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { p.mirroring.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
