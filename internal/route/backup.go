package route

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/bgqueue"
	"github.com/moxi-proxy/moxi/internal/keyhash"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// Backup pools (a pool's backup: OTHER), as magent has them: every write answered here is
// copied to OTHER in the background (bounded; past the bounds a copy is dropped and
// counted), and a get whose key misses here, or whose server does not answer, asks OTHER;
// a hit there is the answer, and so is any answer there when this server gave none.
//
// The copies are late by design, so the backup may hold a value older than a write
// acknowledged here; a read must not answer it. While a copy of a key is queued or being
// sent, a read of the key does not ask the backup (backupGuard); a key whose copy was
// dropped or failed is never read from there again (its stripe of staleStripes, so the
// memory stays fixed: past many such copies, reads ask the backup less and less). A miss
// is always a correct answer for a cache; an old value never is.

// BackupCounters are the backup pools' counts since start (or "stats reset").
type BackupCounters struct {
	Reads, Hits                        atomic.Uint64 // keys asked of a backup pool, and found
	Writes, WriteErrors, WritesDropped atomic.Uint64 // writes copied to a backup pool
}

// Reset zeroes the counters.
func (c *BackupCounters) Reset() {
	for _, v := range []*atomic.Uint64{&c.Reads, &c.Hits, &c.Writes, &c.WriteErrors, &c.WritesDropped} {
		v.Store(0)
	}
}

// maxMirrors bounds the writes queued or being copied to backup pools, as the background
// budget bounds their bytes; past either a copy is dropped (and counted) rather than
// letting memory grow with a slow backup.
const maxMirrors = 1024

// mirrorWorkers send the copies, each the copies of its keys in the order they were made,
// in waves of up to mirrorBatch keys at once (see bgqueue.Options.Batch).
const (
	mirrorWorkers = 8
	mirrorBatch   = 256
)

// mirrorTimeout bounds one copy, on top of the backup server's own timeout.
const mirrorTimeout = 5 * time.Second

// backup is a member's server of a pool with a backup pool.
type backup struct {
	wrapped
	s  *Shared
	to *pool.Pool
}

var _ pool.Server = (*backup)(nil)

// Start passes reqs on; once they are answered, it copies the writes to the backup pool
// (queued) and, where a read missed or failed, asks the backup on a goroutine of its own.
func (b *backup) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	b.next.Start(ctx, order, reqs, resps, errs, func() {
		reads := false
		for i := range reqs {
			switch req := &reqs[i]; {
			case req.Op.IsRetrieval():
				reads = reads || b.mayAsk(req, answersOf(reqs, resps, i), errs[i])
			case req.Op.ChangesKey():
				b.mirror(req, answersOf(reqs, resps, i), errs[i])
			}
		}
		if !reads {
			done()
			return
		}
		go func() {
			for i := range reqs {
				if req := &reqs[i]; req.Op.IsRetrieval() {
					errs[i] = b.read(ctx, order, req, answersOf(reqs, resps, i), errs[i])
				}
			}
			done()
		}()
	})
}

// answersOf is the answers of reqs[i] among resps, as pool.Server.Start fills them.
func answersOf(reqs []protocol.Request, resps []protocol.Response, i int) []protocol.Response {
	if len(reqs) == 1 {
		return resps
	}
	return resps[i : i+1]
}

// mayAsk reports whether read would ask the backup for some of req's keys.
func (b *backup) mayAsk(req *protocol.Request, resps []protocol.Response, err error) bool {
	for i := range resps {
		if (err != nil || wantsBackup(&resps[i])) && b.s.backupGuard.mayRead(req.Keys[i]) {
			return true
		}
	}
	return false
}

// wantsBackup says whether an answer from this pool should be tried on the backup: a miss,
// or no answer at all.
func wantsBackup(r *protocol.Response) bool {
	return r.Status == protocol.StatusNotFound || r.Status == protocol.StatusTempFailure
}

// read asks the backup pool for req's keys that missed or failed here (every key when err,
// this server's, is not nil), and answers them from there where that is better: a hit, or
// any answer where this server gave none. It returns nil when every key has an answer,
// else err.
func (b *backup) read(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response, err error) error {
	var idx []int
	for i := range resps {
		if err != nil {
			resps[i] = protocol.Response{Key: req.Keys[i], Status: protocol.StatusTempFailure, Msg: err.Error()}
		}
		if wantsBackup(&resps[i]) && b.s.backupGuard.mayRead(req.Keys[i]) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return err
	}
	b.s.Backup.Reads.Add(uint64(len(idx)))
	answers := make([]protocol.Response, len(req.Keys))
	answered := askEach(ctx, order.After(), b.to, req, answers, idx)
	for j, i := range idx {
		a := &answers[i]
		if !answered[j] {
			continue
		}
		if a.Status == protocol.StatusOK || (resps[i].Status == protocol.StatusTempFailure && a.Status != protocol.StatusTempFailure) {
			if a.Status == protocol.StatusOK {
				b.s.Backup.Hits.Add(1)
			}
			resps[i] = *a
			resps[i].Key = req.Keys[i]
		}
	}
	if err != nil {
		for i := range resps {
			if resps[i].Status == protocol.StatusTempFailure {
				return err // the request failed here, and on the backup too
			}
		}
	}
	return nil
}

// mirror queues a copy of a write (meta writes included) for the backup pool, whatever
// this server answered (a write that got no answer here may have landed). A cas that
// succeeded is copied as a set, and no write is copied with its cas: the backup's cas
// values differ. A cas that failed changed nothing and is not copied.
func (b *backup) mirror(req *protocol.Request, resps []protocol.Response, err error) {
	w := *req
	succeeded := err == nil && (resps[0].Status == protocol.StatusOK && resps[0].Meta.Code == protocol.MetaNone ||
		resps[0].Meta.Code == protocol.MetaHD || resps[0].Meta.Code == protocol.MetaVA)
	switch {
	case w.Op == protocol.OpCas:
		if !succeeded {
			return
		}
		w.Op = protocol.OpSet
	case w.Op.IsMeta() && w.Meta.HasCas:
		if !succeeded {
			return
		}
		w.Meta.Flags, w.Meta.HasCas, w.Meta.Cas = withoutFlag(w.Meta.Flags, 'C'), false, 0
	}
	w.Cas = 0
	guard := &b.s.backupGuard
	guard.copying.Of(w.Key).Add(1) // before the copy can be sent, and before the answer
	if !b.s.mirrors.TryEnqueue(&w, b.to) {
		guard.copying.Of(w.Key).Add(-1)
		guard.markStale(w.Key)
		b.s.Backup.WritesDropped.Add(1)
	}
}

// withoutFlag is flags without letter, in a new slice.
func withoutFlag(flags []protocol.MetaFlag, letter byte) []protocol.MetaFlag {
	out := make([]protocol.MetaFlag, 0, len(flags))
	for _, f := range flags {
		if f.Letter != letter {
			out = append(out, f)
		}
	}
	return out
}

// staleStripes is how finely backupGuard remembers the keys whose copy was lost: 8 KiB.
const staleStripes = 1 << 16

// backupGuard says which keys a read must not ask a backup pool for (see above).
type backupGuard struct {
	copying keyhash.Stripes[atomic.Int32]    // copies queued or being sent, by stripe of their key
	stale   [staleStripes / 64]atomic.Uint64 // a bit per stripe whose copy was lost
}

func (g *backupGuard) markStale(key []byte) {
	i := keyhash.Stripe(key, staleStripes)
	g.stale[i/64].Or(1 << (i % 64))
}

// mayRead reports whether the backup holds no value of key older than one acknowledged here.
func (g *backupGuard) mayRead(key []byte) bool {
	if g.copying.Of(key).Load() != 0 {
		return false
	}
	i := keyhash.Stripe(key, staleStripes)
	return g.stale[i/64].Load()&(1<<(i%64)) == 0
}

// landed reports whether a copy's answer shows the backup holding no value of the key
// older than the write: it stored or deleted, or found nothing. (A NOT_STORED may be an add
// that found an old value, an EXISTS a meta cas that did.)
func landed(r *protocol.Response) bool {
	if c := r.Meta.Code; c != protocol.MetaNone {
		return c == protocol.MetaHD || c == protocol.MetaVA || c == protocol.MetaNF
	}
	return r.Status == protocol.StatusOK || r.Status == protocol.StatusNotFound
}

// newMirrors is the queue of writes to copy to backup pools; its bytes count against the
// background budget.
func (s *Shared) newMirrors(maxBytes int) *bgqueue.Queue[*pool.Pool] {
	return bgqueue.New(bgqueue.Options{
		Workers:  mirrorWorkers,
		MaxItems: maxMirrors,
		MaxBytes: int64(maxBytes),
		Bytes:    s.background,
		Measure:  bgqueue.Memory,
		Batch:    mirrorBatch,
	}, s.sendMirror)
}

// sendMirror sends a queued copy of a write to its backup pool.
func (s *Shared) sendMirror(ctx context.Context, req *protocol.Request, to *pool.Pool) {
	ctx, cancel := context.WithTimeout(ctx, mirrorTimeout)
	defer cancel()
	var resp [1]protocol.Response
	err := pool.Do(ctx, to.Member(to.Locate(req.Key)).Server, nil, req, resp[:]) // in the background: no client's order
	if err != nil || !landed(&resp[0]) {
		s.backupGuard.markStale(req.Key) // it may hold the key's value from before the write
	}
	if err != nil {
		s.Backup.WriteErrors.Add(1)
	} else {
		s.Backup.Writes.Add(1)
	}
	s.backupGuard.copying.Of(req.Key).Add(-1)
}
