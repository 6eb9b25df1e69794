package route

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/moxi-proxy/moxi/internal/itemcopy"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// Warm-up (a pool's warm_from: OTHER). A read that misses on the pool is read from OTHER
// (an mg with v f t, so the remaining TTL comes with the value); a hit is copied into the
// pool with add and that TTL, then answered. Every write of the pool also deletes the key
// on OTHER before it is answered.
//
// The interleavings, for one key k, a write W of k through moxi, and a read R of k that
// misses here and reads v1 from OTHER:
//
//   - W acknowledged before R starts: W deleted k on OTHER, so R finds v1 only if v1 was
//     written there later (not through moxi), and R answers either W's value (a hit here)
//     or a miss. R never answers a value older than W.
//   - W acknowledged while R is between its read of OTHER and its add: the add must not
//     land, or it would revert W (W a delete, or W's value since evicted) for every later
//     reader. So every write counts itself in its key's stripe (writeguard.Guard: Begin, End),
//     R notes the stripe's epoch before its first read, and R adds only under the stripe's
//     lock and only when no write of the stripe began or ended since (writeguard.Guard.IfQuiet). A write that
//     begins after R's check waits for R's add to finish, then overwrites or deletes it.
//   - R's own answer when W overlaps R: either value is a correct answer for requests that
//     overlap; when the add was refused, R reads this pool again and answers what it holds.
//   - A reload that switches a route to this pool while writes of the old topology are in
//     flight: those writes count in the same stripes (they are the proxy's, not the
//     topology's), so R's add is refused as above.
//   - OTHER does not take W's delete (down, timeout): W stands here, but OTHER may still
//     hold v1. The key is remembered (warmSkip) and never read from OTHER again; when too
//     many are remembered, W is answered SERVER_ERROR instead (not acknowledged).
//
// A TTL is never extended: memcached reports the remaining TTL in whole seconds, rounded
// down, and the copy expires after that many (an item with under a second left is answered
// but not copied). A gat's copy takes the gat's own expiry, which is what it asks for.

// maxWarmSkip bounds the keys remembered because OTHER did not take their delete.
const maxWarmSkip = 65536

// warmSkip is the keys that must not be read from a warm_from pool. Safe for concurrent use.
type warmSkip struct {
	n    atomic.Int32 // len(keys), read without mu on every warm-up read
	mu   sync.Mutex
	keys map[string]struct{} // guarded by mu
}

// add remembers k; false when the set is full.
func (s *warmSkip) add(k []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = make(map[string]struct{})
	}
	if _, ok := s.keys[string(k)]; ok {
		return true
	}
	if len(s.keys) >= maxWarmSkip {
		return false
	}
	s.keys[string(k)] = struct{}{}
	s.n.Store(int32(len(s.keys)))
	return true
}

func (s *warmSkip) has(k []byte) bool {
	if s.n.Load() == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.keys[string(k)]
	return ok
}

// warmUp is a member's server of a pool with warm_from.
type warmUp struct {
	wrapped
	s    *Shared
	pool string       // this pool's name, for the metric
	self *pool.Member // this member: OTHER may share its server (see dropOld)
	from *pool.Pool   // OTHER
}

var _ pool.Server = (*warmUp)(nil)

// Start passes on what needs no follow-up; a read that may miss here, and a write whose
// old copy goes, run on a goroutine that waits (do), one request after the other.
func (w *warmUp) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	for i := range reqs {
		if op := reqs[i].Op; op.IsRetrieval() || op == protocol.OpMetaGet || op.ChangesKey() {
			pool.StartWaiting(ctx, order, reqs, resps, errs, done, w.do)
			return
		}
	}
	w.next.Start(ctx, order, reqs, resps, errs, done)
}

// do executes one request, with its follow-up.
func (w *warmUp) do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	switch {
	case req.Op.IsRetrieval():
		epochs := make([]uint64, len(req.Keys))
		for i, k := range req.Keys {
			epochs[i] = w.s.Writes.Epoch(k) // before the read: see the interleavings above
		}
		if err := pool.Do(ctx, w.next, order, req, resps); err != nil {
			return err
		}
		w.warmUp(ctx, order.After(), req, resps, epochs)
		return nil
	case req.Op == protocol.OpMetaGet && !req.Meta.Vivify: // an mg with N made the item on its miss: that is its answer
		epoch := w.s.Writes.Epoch(req.Key)
		err := pool.Do(ctx, w.next, order, req, resps)
		if err == nil && resps[0].Meta.Code == protocol.MetaEN && !w.s.warmSkip.has(req.Key) {
			w.warmMeta(ctx, order.After(), req, resps, epoch)
		}
		return err
	case req.Op.ChangesKey():
		err := pool.Do(ctx, w.next, order, req, resps)
		w.dropOld(ctx, order.After(), req.Key, resps, err)
		return err
	}
	return pool.Do(ctx, w.next, order, req, resps)
}

// warmUp reads the keys that missed here from OTHER, copies the hits over and answers
// them. epochs[i] is the stripe's epoch of req.Keys[i] before the read here.
func (w *warmUp) warmUp(ctx context.Context, order *turn.Turn, req *protocol.Request, out []protocol.Response, epochs []uint64) {
	var idx []int
	for i, k := range req.Keys {
		if out[i].Status == protocol.StatusNotFound && !w.s.warmSkip.has(k) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return
	}
	items := w.readOld(ctx, order, req.Keys, idx)
	// What the copy stored is answered as is, unless the answer shows a cas (gets, gats,
	// any binary get): that must be this pool's, so the key is read here again.
	wantCas := req.Binary || req.Op == protocol.OpGets || req.Op == protocol.OpGats
	var again []int
	at := make(map[int]int, len(idx)) // out's index -> items'
	var mu sync.Mutex                 // again
	var wg sync.WaitGroup
	for j, i := range idx {
		it := &items[j]
		w.s.warmRead(w.pool, it.Found)
		if !it.Found {
			continue
		}
		exptime, ok := itemcopy.Exptime(it.TTL)
		if req.Op == protocol.OpGat || req.Op == protocol.OpGats {
			exptime, ok = req.Exptime, true
		}
		answer := func(stored bool, err error) {
			if err != nil || (stored && !wantCas) || !ok {
				// Stored: this pool holds it now. Not copied (an error here, or under a
				// second left): OTHER's value is still no older than any acknowledged
				// write, see above; its cas means nothing here.
				out[i] = protocol.Response{Key: req.Keys[i], Value: it.Value, Flags: it.Flags}
				return
			}
			mu.Lock()
			again, at[i] = append(again, i), j
			mu.Unlock()
		}
		if !ok {
			answer(false, nil)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			answer(w.copyIn(ctx, order, req.Keys[i], it, exptime, epochs[i]))
		}()
	}
	wg.Wait()
	if len(again) == 0 {
		return
	}
	sub := *req
	sub.Keys = make([][]byte, len(again))
	for n, i := range again {
		sub.Keys[n] = req.Keys[i]
	}
	answers := make([]protocol.Response, len(again))
	err := pool.Do(ctx, w.next, order, &sub, answers)
	for n, i := range again {
		if err == nil && answers[n].Status == protocol.StatusOK {
			out[i] = answers[n]
			continue
		}
		// Not copied (a write of the stripe overlapped) and gone again here: OTHER's value
		// is still a correct answer for this read, see above.
		it := &items[at[i]]
		out[i] = protocol.Response{Key: req.Keys[i], Value: it.Value, Flags: it.Flags}
	}
}

// copyIn adds it as k here, unless a write of k's stripe began or ended since epoch (see
// the interleavings above). stored reports an add that stored; a refused copy or an add
// that found the key reports false and no error.
func (w *warmUp) copyIn(ctx context.Context, order *turn.Turn, k []byte, it *itemcopy.Item, exptime int64, epoch uint64) (stored bool, err error) {
	w.s.Writes.IfQuiet(k, epoch, func() {
		add := itemcopy.Store(protocol.OpAdd, k, it, exptime)
		var resp [1]protocol.Response
		if err = pool.Do(ctx, w.next, order, &add, resp[:]); err == nil {
			stored = resp[0].Status == protocol.StatusOK
		}
	})
	return stored, err
}

// readOld reads keys[i], for i in idx, from OTHER: one batch of mg requests per server,
// the servers in parallel. A server that does not answer reads as a miss: the miss here
// stands, which is a correct answer.
func (w *warmUp) readOld(ctx context.Context, order *turn.Turn, keys [][]byte, idx []int) []itemcopy.Item {
	items := make([]itemcopy.Item, len(idx))
	var wg sync.WaitGroup
	for _, b := range pool.GroupByMember(w.from.Itself, keys, idx) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]protocol.Request, len(b.At))
			resps := make([]protocol.Response, len(b.At))
			errs := make([]error, len(b.At))
			for n, j := range b.At {
				reqs[n] = itemcopy.Get(keys[idx[j]])
			}
			pool.DoBatch(ctx, b.Member.Server, order, reqs, resps, errs)
			for n, j := range b.At {
				if errs[n] == nil {
					items[j] = itemcopy.Parse(&resps[n])
				}
			}
		}()
	}
	wg.Wait()
	return items
}

// warmMeta follows up an mg that missed here: a hit on OTHER is copied here, and the mg is
// sent here again, so that its answer is memcached's own.
func (w *warmUp) warmMeta(ctx context.Context, order *turn.Turn, req *protocol.Request, one []protocol.Response, epoch uint64) {
	it := w.readOld(ctx, order, [][]byte{req.Key}, []int{0})[0]
	w.s.warmRead(w.pool, it.Found)
	if !it.Found {
		return
	}
	if exptime, ok := itemcopy.Exptime(it.TTL); ok {
		if _, err := w.copyIn(ctx, order, req.Key, &it, exptime, epoch); err != nil {
			return // the miss stands
		}
	}
	var again [1]protocol.Response
	if pool.Do(ctx, w.next, order, req, again[:]) == nil {
		one[0] = again[0]
	}
}

// dropOld deletes key on OTHER after a write of key here (answered one, or err: it may have
// landed all the same), so that OTHER never serves a value older than the write. When it
// cannot, the key is never read from there again; when too many keys are remembered
// already, the write's answer becomes a SERVER_ERROR.
func (w *warmUp) dropOld(ctx context.Context, order *turn.Turn, key []byte, one []protocol.Response, err error) {
	m := w.from.Member(w.from.Locate(key))
	if pool.SameServer(m, w.self) {
		// OTHER keeps key on this very server (the pools share it): the write is its
		// value there, and a delete would undo it.
		return
	}
	del := protocol.Request{Op: protocol.OpDelete, Key: key}
	var r [1]protocol.Response
	derr := pool.Do(ctx, m.Server, order, &del, r[:])
	if derr == nil && (r[0].Status == protocol.StatusOK || r[0].Status == protocol.StatusNotFound) {
		return
	}
	if !w.s.warmSkip.add(key) && err == nil {
		one[0] = protocol.Response{Status: protocol.StatusTempFailure, Msg: "warm_from pool " + w.from.Name() + " did not take the delete"}
	}
}

// warmRead counts a key read from pool's warm_from pool.
func (s *Shared) warmRead(pool string, hit bool) {
	result := "miss"
	if hit {
		result = "hit"
	}
	s.warmReads.WithLabelValues(pool, result).Inc()
}
