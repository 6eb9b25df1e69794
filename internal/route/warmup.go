package route

import (
	"bytes"
	"context"
	"encoding/base64"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

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
//     reader. So every write counts itself in its key's stripe (Writes: Begin, End),
//     R notes the stripe's epoch before its first read, and R adds only under the stripe's
//     lock and only when no write of the stripe began or ended since (Writes.ifQuiet). A write that
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

// oldItem is what OTHER holds of a key.
type oldItem struct {
	found bool
	value []byte
	flags uint32
	ttl   int64 // remaining seconds; -1: no expiry
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

func (w *warmUp) Do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	switch {
	case req.Op.IsRetrieval():
		epochs := make([]uint64, len(req.Keys))
		for i, k := range req.Keys {
			epochs[i] = w.s.Writes.epoch(k) // before the read: see the interleavings above
		}
		if err := w.inner.Do(ctx, order, req, resps); err != nil {
			return err
		}
		w.warmUp(ctx, order.After(), req, resps, epochs)
		return nil
	case req.Op == protocol.OpMetaGet && !req.Meta.Vivify: // an mg with N made the item on its miss: that is its answer
		epoch := w.s.Writes.epoch(req.Key)
		err := w.inner.Do(ctx, order, req, resps)
		if err == nil && resps[0].Meta.Code == protocol.MetaEN && !w.s.warmSkip.has(req.Key) {
			w.warmMeta(ctx, order.After(), req, resps, epoch)
		}
		return err
	case req.Op.ChangesKey():
		err := w.inner.Do(ctx, order, req, resps)
		w.dropOld(ctx, order.After(), req.Key, resps, err)
		return err
	}
	return w.inner.Do(ctx, order, req, resps)
}

// DoBatch runs the batch one request at a time: each may need its follow-up before the
// next is sent.
func (w *warmUp) DoBatch(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
	pool.DoEach(ctx, order, w, reqs, resps, errs)
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
		w.s.warmRead(w.pool, it.found)
		if !it.found {
			continue
		}
		exptime, ok := copyExptime(it.ttl)
		if req.Op == protocol.OpGat || req.Op == protocol.OpGats {
			exptime, ok = req.Exptime, true
		}
		answer := func(stored bool, err error) {
			if err != nil || (stored && !wantCas) || !ok {
				// Stored: this pool holds it now. Not copied (an error here, or under a
				// second left): OTHER's value is still no older than any acknowledged
				// write, see above; its cas means nothing here.
				out[i] = protocol.Response{Key: req.Keys[i], Value: it.value, Flags: it.flags}
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
	err := w.inner.Do(ctx, order, &sub, answers)
	for n, i := range again {
		if err == nil && answers[n].Status == protocol.StatusOK {
			out[i] = answers[n]
			continue
		}
		// Not copied (a write of the stripe overlapped) and gone again here: OTHER's value
		// is still a correct answer for this read, see above.
		it := &items[at[i]]
		out[i] = protocol.Response{Key: req.Keys[i], Value: it.value, Flags: it.flags}
	}
}

// copyExptime is the expiry for a copy of an item with ttl seconds left, and false when it
// must not be copied (under a second left). memcached reads values over 30 days as absolute
// times.
func copyExptime(ttl int64) (int64, bool) {
	switch {
	case ttl < 0:
		return 0, true
	case ttl == 0:
		return 0, false
	case ttl > 30*24*3600:
		return time.Now().Unix() + ttl, true
	}
	return ttl, true
}

// copyIn adds it as k here, unless a write of k's stripe began or ended since epoch (see
// the interleavings above). stored reports an add that stored; a refused copy or an add
// that found the key reports false and no error.
func (w *warmUp) copyIn(ctx context.Context, order *turn.Turn, k []byte, it *oldItem, exptime int64, epoch uint64) (stored bool, err error) {
	w.s.Writes.ifQuiet(k, epoch, func() {
		add := protocol.Request{Op: protocol.OpAdd, Key: k, Value: it.value, Flags: it.flags, Exptime: exptime}
		var resp [1]protocol.Response
		if err = w.inner.Do(ctx, order, &add, resp[:]); err == nil {
			stored = resp[0].Status == protocol.StatusOK
		}
	})
	return stored, err
}

// readOld reads keys[i], for i in idx, from OTHER: one batch of mg requests per server,
// the servers in parallel. A server that does not answer reads as a miss: the miss here
// stands, which is a correct answer.
func (w *warmUp) readOld(ctx context.Context, order *turn.Turn, keys [][]byte, idx []int) []oldItem {
	items := make([]oldItem, len(idx))
	var wg sync.WaitGroup
	for _, b := range byMember(w.from, keys, idx) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]protocol.Request, len(b.at))
			resps := make([]protocol.Response, len(b.at))
			errs := make([]error, len(b.at))
			for n, j := range b.at {
				reqs[n] = oldGet(keys[idx[j]])
			}
			b.m.Server.DoBatch(ctx, order, reqs, resps, errs)
			for n, j := range b.at {
				if errs[n] == nil {
					items[j] = parseOld(&resps[n])
				}
			}
		}()
	}
	wg.Wait()
	return items
}

// oldGet is "mg <key> v f t": the value, its client flags and its remaining TTL. A key that
// is no text token (a binary client's) goes base64 with b.
func oldGet(k []byte) protocol.Request {
	req := protocol.Request{Op: protocol.OpMetaGet, Key: k}
	req.Meta.KeyToken = k
	if !textToken(k) {
		req.Meta.KeyToken = base64.StdEncoding.AppendEncode(nil, k)
		req.Meta.Base64 = true
		req.Meta.Flags = append(req.Meta.Flags, protocol.MetaFlag{Letter: 'b'})
	}
	req.Meta.ReturnValue = true
	req.Meta.Flags = append(req.Meta.Flags, protocol.MetaFlag{Letter: 'v'}, protocol.MetaFlag{Letter: 'f'}, protocol.MetaFlag{Letter: 't'})
	return req
}

func textToken(k []byte) bool {
	if len(k) == 0 || len(k) > protocol.MaxKeyLength {
		return false
	}
	for _, c := range k {
		if c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// parseOld reads the answer to oldGet: VA with " f<flags> t<ttl>", or a miss.
func parseOld(r *protocol.Response) oldItem {
	if r.Meta.Code != protocol.MetaVA {
		return oldItem{}
	}
	it := oldItem{found: true, value: r.Value, ttl: -1}
	for _, tok := range bytes.Fields(r.Meta.Flags) {
		if len(tok) < 2 {
			continue
		}
		switch tok[0] {
		case 'f':
			if f, err := strconv.ParseUint(string(tok[1:]), 10, 32); err == nil {
				it.flags = uint32(f)
			}
		case 't':
			if n, err := strconv.ParseInt(string(tok[1:]), 10, 64); err == nil {
				it.ttl = n
			}
		}
	}
	return it
}

// warmMeta follows up an mg that missed here: a hit on OTHER is copied here, and the mg is
// sent here again, so that its answer is memcached's own.
func (w *warmUp) warmMeta(ctx context.Context, order *turn.Turn, req *protocol.Request, one []protocol.Response, epoch uint64) {
	it := w.readOld(ctx, order, [][]byte{req.Key}, []int{0})[0]
	w.s.warmRead(w.pool, it.found)
	if !it.found {
		return
	}
	if exptime, ok := copyExptime(it.ttl); ok {
		if _, err := w.copyIn(ctx, order, req.Key, &it, exptime, epoch); err != nil {
			return // the miss stands
		}
	}
	var again [1]protocol.Response
	if w.inner.Do(ctx, order, req, again[:]) == nil {
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
	derr := m.Server.Do(ctx, order, &del, r[:])
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
