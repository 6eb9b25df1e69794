package proxy

import (
	"context"
	"time"

	"github.com/moxi-proxy/moxi/internal/bgqueue"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// maxMirrors bounds the writes queued or being copied to backup pools, as the proxy's
// background budget bounds their bytes; past either a copy is dropped (and counted) rather
// than letting memory grow with a slow backup.
const maxMirrors = 1024

// mirrorWorkers send the copies, each the copies of its keys in the order they were made,
// in waves of up to mirrorBatch keys at once (see bgqueue.Options.Batch).
const (
	mirrorWorkers = 8
	mirrorBatch   = 256
)

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

// newMirrors is the queue of writes to copy to backup pools; its bytes count against the
// proxy's background budget.
func (p *Proxy) newMirrors() *bgqueue.Queue[*pool.Pool] {
	return bgqueue.New(bgqueue.Options{
		Workers:  mirrorWorkers,
		MaxItems: maxMirrors,
		MaxBytes: int64(p.opts.MaxBackgroundBytes),
		Bytes:    p.background,
		Measure:  bgqueue.Memory,
		Batch:    mirrorBatch,
	}, p.sendMirror)
}

// mirror queues a copy of a write for the backup pool b. A cas that succeeded is copied as
// a set, and no write is copied with its cas: the backup's cas values differ. A cas that
// failed changed nothing and is not copied.
func (p *Proxy) mirror(b *pool.Pool, req *protocol.Request, primary *protocol.Response) {
	w := *req
	if w.Op == protocol.OpCas {
		if primary.Status != protocol.StatusOK {
			return
		}
		w.Op = protocol.OpSet
	}
	w.Cas = 0
	if !p.mirrors.TryEnqueue(&w, b) {
		p.stats.mirrorsDropped.Add(1)
	}
}

// sendMirror sends a queued copy of a write to its backup pool.
func (p *Proxy) sendMirror(ctx context.Context, req *protocol.Request, b *pool.Pool) {
	ctx, cancel := context.WithTimeout(ctx, mirrorTimeout)
	defer cancel()
	var resp [1]protocol.Response
	if err := b.Member(b.Locate(req.Key)).Server.Do(ctx, req, resp[:]); err != nil {
		p.stats.mirrorErrors.Add(1)
		return
	}
	p.stats.mirrors.Add(1)
}
