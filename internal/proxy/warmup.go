package proxy

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
	"github.com/moxi-proxy/moxi/internal/topology"
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
//     reader. So every write counts itself in its key's stripe (writeStripes: begin, end),
//     R notes the stripe's epoch before its first read, and R adds only under the stripe's
//     lock and only when no write of the stripe began or ended since (ifQuiet). A write that
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

// warmEpochs notes, for each key of req at among (nil: all) whose pool warms up, its
// stripe's epoch before the read (see the interleavings above); nil when none warms up.
func (p *Proxy) warmEpochs(t *topology.Topology, req *protocol.Request, among []int) []uint64 {
	var epochs []uint64
	forEach(among, len(req.Keys), func(i int) {
		if t.WarmFrom[t.PoolFor(req.Keys[i])] == nil {
			return
		}
		if epochs == nil {
			epochs = make([]uint64, len(req.Keys))
		}
		epochs[i] = p.writes.epoch(req.Keys[i])
	})
	return epochs
}

// forEach calls fn for each index in among, or for 0 to n-1 when among is nil.
func forEach(among []int, n int, fn func(i int)) {
	if among == nil {
		for i := range n {
			fn(i)
		}
		return
	}
	for _, i := range among {
		fn(i)
	}
}

// warmUp reads the keys (at among; nil: all) that missed on a pool with warm_from from that
// pool, copies the hits over and answers them. epochs is warmEpochs' note.
func (p *Proxy) warmUp(ctx context.Context, t *topology.Topology, req *protocol.Request, out []protocol.Response, among []int, epochs []uint64) {
	if epochs == nil {
		return
	}
	var idx []int
	forEach(among, len(out), func(i int) {
		k := req.Keys[i]
		if out[i].Status == protocol.StatusNotFound && t.WarmFrom[t.PoolFor(k)] != nil && !p.warmSkip.has(k) {
			idx = append(idx, i)
		}
	})
	if len(idx) == 0 {
		return
	}
	items := p.readOld(ctx, t, req.Keys, idx)
	// What the copy stored is answered as is, unless the answer shows a cas (gets, gats,
	// any binary get): that must be this pool's, so the key is read here again.
	wantCas := req.Binary || req.Op == protocol.OpGets || req.Op == protocol.OpGats
	var again []int
	at := make(map[int]int, len(idx)) // out's index -> items'
	var mu sync.Mutex                 // again
	var wg sync.WaitGroup
	for j, i := range idx {
		it := &items[j]
		pl := t.PoolFor(req.Keys[i])
		p.metrics.warmRead(pl.Name(), it.found)
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
			answer(p.copyIn(ctx, pl, req.Keys[i], it, exptime, epochs[i]))
		}()
	}
	wg.Wait()
	if len(again) == 0 {
		return
	}
	p.fanOut(ctx, t.PoolFor, req, out, again)
	for _, i := range again {
		if out[i].Status != protocol.StatusOK {
			// Not copied (a write of the stripe overlapped) and gone again here: OTHER's
			// value is still a correct answer for this read, see above.
			it := &items[at[i]]
			out[i] = protocol.Response{Key: req.Keys[i], Value: it.value, Flags: it.flags}
		}
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

// copyIn adds it as k to pl, unless a write of k's stripe began or ended since epoch (see
// the interleavings above). stored reports an add that stored; a refused copy or an add
// that found the key reports false and no error.
func (p *Proxy) copyIn(ctx context.Context, pl *pool.Pool, k []byte, it *oldItem, exptime int64, epoch uint64) (stored bool, err error) {
	p.writes.ifQuiet(k, epoch, func() {
		add := protocol.Request{Op: protocol.OpAdd, Key: k, Value: it.value, Flags: it.flags, Exptime: exptime}
		var resp [1]protocol.Response
		m := pl.Member(pl.Locate(k))
		if err = m.Server.Do(ctx, &add, resp[:]); err == nil {
			stored = resp[0].Status == protocol.StatusOK
		}
	})
	return stored, err
}

// readOld reads keys[i], for i in idx, from their pool's warm_from pool: one batch of mg
// requests per server, the servers in parallel. A server that does not answer reads as a
// miss: the miss here stands, which is a correct answer.
func (p *Proxy) readOld(ctx context.Context, t *topology.Topology, keys [][]byte, idx []int) []oldItem {
	items := make([]oldItem, len(idx))
	type batch struct {
		m  *pool.Member
		at []int // into idx
	}
	var batches []batch
	for j, i := range idx {
		o := t.WarmFrom[t.PoolFor(keys[i])]
		m := o.Member(o.Locate(keys[i]))
		b := 0
		for b < len(batches) && batches[b].m != m {
			b++
		}
		if b == len(batches) {
			batches = append(batches, batch{m: m})
		}
		batches[b].at = append(batches[b].at, j)
	}
	var wg sync.WaitGroup
	for _, b := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]protocol.Request, len(b.at))
			resps := make([]protocol.Response, len(b.at))
			errs := make([]error, len(b.at))
			for n, j := range b.at {
				reqs[n] = oldGet(keys[idx[j]])
			}
			b.m.Server.DoBatch(ctx, reqs, resps, errs)
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

// warmMeta follows up an mg that missed on pl, which warms up from other: a hit there is
// copied here, and the mg is sent here again, so that its answer is memcached's own.
func (p *Proxy) warmMeta(ctx context.Context, t *topology.Topology, pl *pool.Pool, req *protocol.Request, one []protocol.Response, epoch uint64) {
	keys := [][]byte{req.Key}
	it := p.readOld(ctx, t, keys, []int{0})[0]
	p.metrics.warmRead(pl.Name(), it.found)
	if !it.found {
		return
	}
	if exptime, ok := copyExptime(it.ttl); ok {
		if _, err := p.copyIn(ctx, pl, req.Key, &it, exptime, epoch); err != nil {
			return // the miss stands
		}
	}
	p.do(ctx, pl, req.Key, req, one)
}

// dropOld deletes key on the pool pl warms up from, after a write of key to pl, so that it
// never serves a value older than the write. When it cannot, the key is never read from
// there again; when too many keys are remembered already, resp becomes a SERVER_ERROR.
func (p *Proxy) dropOld(ctx context.Context, t *topology.Topology, pl *pool.Pool, key []byte, resp *protocol.Response) {
	o := t.WarmFrom[pl]
	if o == nil {
		return
	}
	del := protocol.Request{Op: protocol.OpDelete, Key: key}
	var r [1]protocol.Response
	m := o.Member(o.Locate(key))
	err := m.Server.Do(ctx, &del, r[:])
	if err == nil && (r[0].Status == protocol.StatusOK || r[0].Status == protocol.StatusNotFound) {
		return
	}
	if !p.warmSkip.add(key) {
		*resp = protocol.Response{Status: protocol.StatusTempFailure, Msg: "warm_from pool " + o.Name() + " did not take the delete"}
	}
}
