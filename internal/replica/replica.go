// Package replica keeps each key of a pool on several of its members (pools.*.replicas):
// the requests placed on a member go to their key's replicas (Wrap).
package replica

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/moxi-proxy/moxi/internal/bgqueue"
	"github.com/moxi-proxy/moxi/internal/failover"
	"github.com/moxi-proxy/moxi/internal/itemcopy"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
	"github.com/moxi-proxy/moxi/internal/writeguard"
	"golang.org/x/sync/semaphore"
)

// Replication (a pool's replicas: N > 1). Each key lives on the N distinct members that
// follow it on the ring (pool.ReplicaSetOf). A member's server is composed into a replica,
// which sends each request it is given to the key's replicas' own servers:
//
//   - A write goes to every replica that serves (the others are away: remembered in
//     StandIns, they serve no read until the key is deleted on them) and is answered after
//     the write quorum; a replica that does not take it is away for the key from then on.
//   - cas, incr/decr, append/prepend, add, replace and the meta equivalents are decided by
//     the first replica that serves, and the item it then holds is carried to the others
//     with set (or delete), so that replicas never diverge.
//   - A read asks one replica (read_from) and on a miss or an error the next; a hit found
//     after misses is copied to the replicas that missed it with add and its remaining TTL.
//     gets, gats and mg with c read the first replica only: each server numbers its own cas.
//
// Writes of one key are serialised within the process (Options.Writes), from their first
// send to their last answer: concurrent writes then reach every replica in the same order,
// and a read's copy is made only if no write of its key's stripe began since the read did.

// The write quorums and read orders of pools.*.write_quorum and pools.*.read_from.
const (
	QuorumAll      = "all"      // every replica that serves; one that fails is away, not a failure
	QuorumMajority = "majority" // more than half of the replicas that serve
	QuorumOne      = "one"      // the first answer
	ReadFirst      = "first"    // ring order
	ReadRandom     = "random"   // a random serving replica first, then ring order
)

// WriteQuorums are the names write_quorum takes.
func WriteQuorums() []string { return []string{QuorumAll, QuorumMajority, QuorumOne} }

// ReadFroms are the names read_from takes.
func ReadFroms() []string { return []string{ReadFirst, ReadRandom} }

// Options are a replicated pool's rules and what it shares with the process.
type Options struct {
	WriteQuorum string              // one of WriteQuorums(); "" is QuorumAll
	ReadFrom    string              // one of ReadFroms(); "" is ReadFirst
	Writes      *writeguard.Guard   // the process's guard of writes by key; nil: the pool's own
	StandIns    *failover.StandIns  // where away replicas' keys are remembered; nil: nowhere
	Background  *semaphore.Weighted // max_background_bytes of replica writes after their answer; nil: none
	Repaired    func()              // called for each copy a read makes to a replica that missed
	// LocalZone is, in a pool with zones, the index of this proxy's zone: reads ask it
	// first. -1 (or no zones): the listed order.
	LocalZone int
	// ZoneRead, in a pool with zones, is told of each key a read answered: the zone and
	// ZoneLocal, ZoneRemote or ZoneMiss. nil: nothing is counted.
	ZoneRead func(zone, result string)
}

// The results of a pool with zones' reads (moxi_zone_reads_total).
const (
	ZoneLocal  = "local"  // a hit in this proxy's zone
	ZoneRemote = "remote" // a hit in another zone
	ZoneMiss   = "miss"   // a miss in every zone asked
)

// Wrap wraps each member's server of pl (servers[i], what is under this layer) in a
// replica, when pl keeps more than one copy of a key; it returns servers unchanged
// otherwise.
func Wrap(pl *pool.Pool, opts Options, servers []pool.Server) []pool.Server {
	if pl.Replicas() < 2 {
		return servers
	}
	if opts.Writes == nil {
		opts.Writes = new(writeguard.Guard)
	}
	wrapped := make([]pool.Server, len(servers))
	for i := range servers {
		wrapped[i] = &replica{pool: pl, self: i, direct: servers, opts: &opts, zones: len(pl.Zones()) > 0}
	}
	return wrapped
}

// replica is a member's server in a replicated pool: the requests the proxy places on the
// member go to their keys' replicas (see Replication above).
type replica struct {
	pool   *pool.Pool
	self   int           // the member's index
	direct []pool.Server // every member's server under the replica: where requests are sent
	opts   *Options
	zones  bool // the pool has zones: reads ask opts.LocalZone first
}

var _ pool.Server = (*replica)(nil)

// away records that member i, a replica of key, was written without: it serves no read of
// key until key is deleted on it.
func (r *replica) away(i int, key []byte) {
	m := r.pool.Member(i)
	r.opts.StandIns.Away(m.Base, r.pool.Name(), m.Name, key)
}

// do executes one request on its key's replicas, waiting for them.
func (r *replica) do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	switch {
	case req.Op.IsRetrieval():
		return r.read(ctx, order, req, resps)
	case req.Op == protocol.OpMetaGet:
		return r.metaGet(ctx, order, req, resps)
	case req.Op.ChangesKey():
		return r.write(ctx, order, req, resps)
	}
	return pool.Do(ctx, r.direct[r.self], order, req, resps) // no key: the member's own server
}

// Start starts a lone plain write (the kind a fan-out sends, see fanOut) on every serving
// replica without a goroutine waiting for it: the replicas' answers finish it. Anything
// else — a run (each request may go to other servers), a read, a write whose key's lock is
// taken — is executed one request after the other on a goroutine that waits (do).
func (r *replica) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	if !r.startWrite(ctx, order, reqs, resps, errs, done) {
		pool.StartWaiting(ctx, order, reqs, resps, errs, done, r.do)
	}
}

// startWrite is Start's way without a wait, for a lone plain write whose key's lock is
// free and whose key has a serving replica; false, having done nothing, for anything else.
func (r *replica) startWrite(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) bool {
	if len(reqs) != 1 || !reqs[0].Op.ChangesKey() || decided(&reqs[0]) {
		return false
	}
	p := r.pool
	req := &reqs[0]
	unlock, ok := r.opts.Writes.TryLock(req.Key)
	if !ok {
		return false
	}
	set := p.ReplicaSetOf(req.Key)
	var targets [pool.MaxReplicas]int
	n := 0
	for _, i := range set.Idx[:set.N] {
		if !p.Serving(i) {
			continue
		}
		targets[n] = i
		n++
	}
	if n == 0 {
		unlock()
		return false // answered by write, which remembers the away replicas
	}
	for _, i := range set.Idx[:set.N] {
		if !slices.Contains(targets[:n], i) {
			r.away(i, req.Key)
		}
	}
	f, req := r.newFan(req, targets[:n], unlock)
	f.answer = func(resp protocol.Response, err error) { resps[0], errs[0] = resp, err; done() }
	f.closed = true // the replicas may answer before the request's turn is given on (open)
	// The request's one dispatch is once every send is on its way (or on a goroutine of
	// its own, which the key's lock keeps ahead of the key's next request).
	each, dispatched := order.Defer()
	if f.weight > 0 {
		ctx = context.WithoutCancel(ctx) // a send may outlive the request (see fanOut)
	}
	for j, i := range targets[:n] {
		s := &f.sends[j]
		s.req[0] = *req
		r.direct[i].Start(ctx, each, s.req[:], s.resp[:], s.err[:], func() { f.collect(s) })
	}
	dispatched()
	f.open() // only now may the answer end the request, and its turn with it
	return true
}

// fan is a write sent to several replicas: it is answered once the quorum has taken it, and
// ends its key's lock once every replica has answered.
type fan struct {
	r      *replica
	key    []byte
	n      int
	need   int
	first  int   // the first target: the one whose cas an answer with a cas must carry
	cas    bool  // the answer carries a cas (binary, or meta with c)
	weight int64 // of max_background_bytes, held until every replica answered
	unlock func()
	answer func(protocol.Response, error)
	sends  []fanSend

	mu                     sync.Mutex
	got, acks              int
	best                   protocol.Response // an acknowledgement, the first's if it gave one
	bestIsFirst, firstDone bool
	failure                protocol.Response // a replica's failure answered as a status
	err                    error             // a replica's failure to answer
	answered               bool
	// closed holds the answer back until open: the request, answered, ends, and its turn
	// with it, which the sender still gives on after starting the sends (startWrite).
	closed bool
}

type fanSend struct {
	member int
	req    [1]protocol.Request
	resp   [1]protocol.Response
	err    [1]error
}

// newFan prepares req's fan over targets. When the quorum lets it answer before every
// replica has, the sends after the answer hold a copy of req (returned), counted against
// max_background_bytes; past that budget the answer waits for every replica.
func (r *replica) newFan(req *protocol.Request, targets []int, unlock func()) (*fan, *protocol.Request) {
	n := len(targets)
	_, c := req.Meta.Flag('c')
	f := &fan{r: r, n: n, need: r.quorum(n), first: targets[0], cas: req.Binary || (req.Op.IsMeta() && c), unlock: unlock}
	if f.need < n {
		f.weight = bgqueue.Weight(req, bgqueue.Memory)
		if r.opts.Background != nil && r.opts.Background.TryAcquire(f.weight) {
			c := bgqueue.CopyRequest(req)
			req = &c
		} else {
			f.need, f.weight = n, 0
		}
	}
	f.key = req.Key
	f.sends = make([]fanSend, n)
	for j, i := range targets {
		f.sends[j].member = i
	}
	return f, req
}

// collect takes one replica's answer.
func (f *fan) collect(s *fanSend) {
	r := f.r
	ok := acked(&s.resp[0], s.err[0])
	if !ok {
		r.away(s.member, f.key)
	}
	f.mu.Lock()
	f.got++
	isFirst := s.member == f.first
	f.firstDone = f.firstDone || isFirst
	switch {
	case ok:
		f.acks++
		// A success wins over a miss (a replica that restarted empty lacks what a delete or
		// touch finds on another); among equals the first's, whose cas an answer carries.
		if was, is := positive(&f.best), positive(&s.resp[0]); f.acks == 1 || (is && !was) || (is == was && isFirst) {
			f.best, f.bestIsFirst = s.resp[0], isFirst
		}
	case s.err[0] != nil:
		f.err = s.err[0]
	default:
		f.failure = s.resp[0]
	}
	answer, resp, err := f.dueLocked()
	last := f.got == f.n
	f.mu.Unlock()
	if answer {
		f.answer(resp, err)
	}
	if last {
		f.unlock()
		if f.weight > 0 {
			r.opts.Background.Release(f.weight)
		}
	}
}

// dueLocked reports whether the write is to be answered now (f.mu held), and with what: once
// the quorum took it with success (the first replica among them when the answer carries a
// cas), or every replica answered, and only once.
func (f *fan) dueLocked() (bool, protocol.Response, error) {
	quorum := f.acks >= f.need && (f.firstDone || !f.cas) && positive(&f.best)
	if f.answered || f.closed || !(quorum || f.got == f.n) {
		return false, protocol.Response{}, nil
	}
	f.answered = true
	resp, err := f.result()
	return true, resp, err
}

// open lets the answer go: at once, when the replicas that it waits for have answered.
func (f *fan) open() {
	f.mu.Lock()
	f.closed = false
	answer, resp, err := f.dueLocked()
	f.mu.Unlock()
	if answer {
		f.answer(resp, err)
	}
}

// quorum is the acknowledgements a write to n serving replicas waits for.
func (r *replica) quorum(n int) int {
	switch r.opts.WriteQuorum {
	case QuorumMajority:
		return n/2 + 1
	case QuorumOne:
		return 1
	}
	return n
}

// result is the write's answer once the quorum took it, or every replica answered (f.mu
// held): the quorum's, or the failure of a replica when none took it.
func (f *fan) result() (protocol.Response, error) {
	switch {
	case f.acks >= f.need || (f.r.opts.WriteQuorum == QuorumAll && f.acks > 0):
		// all: a replica that failed is away for the key, so every other has taken it.
		return f.best, nil
	case f.acks > 0:
		return protocol.Response{Status: protocol.StatusTempFailure, Msg: "the write quorum was not reached"}, nil
	case f.err != nil:
		return protocol.Response{}, f.err // as a server that did not answer
	}
	return f.failure, nil
}

func (r *replica) Up() bool { return r.direct[r.self].Up() }

func (r *replica) Info() pool.Info { return r.direct[r.self].Info() }

// Stats are the member's server's and "away": 1 while it is up but owes keys, and serves
// no read until they are deleted on it (the contract's states stay up, dead, migrating).
func (r *replica) Stats() []protocol.Stat {
	away := "0"
	if r.Up() && r.opts.StandIns.Owes(r.pool.Member(r.self).Base) {
		away = "1"
	}
	return append(r.direct[r.self].Stats(), protocol.Stat{Name: "away", Value: away})
}

// Close does nothing: whoever made the server (the topology's builder) closes it.
func (r *replica) Close() error { return nil }

// errNoReplica fails a request none of whose key's replicas serves.
var errNoReplica = errors.New("no replica of the key is serving")

// acked reports whether a replica took a write: it answered, and not with a failure of its own.
func acked(resp *protocol.Response, err error) bool {
	return err == nil && resp.Status != protocol.StatusTempFailure && resp.Status != protocol.StatusNoMemory
}

// statusOf is resp's status, a meta answer's by its code.
func statusOf(resp *protocol.Response) protocol.Status {
	if resp.Meta.Code != protocol.MetaNone {
		return resp.Meta.Code.Status()
	}
	return resp.Status
}

// positive reports whether resp is a success (not a miss, nor a store refused).
func positive(resp *protocol.Response) bool { return statusOf(resp) == protocol.StatusOK }

// succeeded reports whether a decided write changed the item (its result is to be carried).
func succeeded(req *protocol.Request, resp *protocol.Response) bool {
	if req.Op.IsMeta() {
		return resp.Meta.Code == protocol.MetaHD || resp.Meta.Code == protocol.MetaVA
	}
	return resp.Status == protocol.StatusOK
}

// decided reports whether req's outcome depends on the item it finds, so that the first
// serving replica decides it and its result is carried to the others.
func decided(req *protocol.Request) bool {
	switch req.Op {
	case protocol.OpAdd, protocol.OpReplace, protocol.OpAppend, protocol.OpPrepend, protocol.OpCas,
		protocol.OpIncr, protocol.OpDecr, protocol.OpMetaArithmetic:
		return true
	case protocol.OpSet, protocol.OpDelete:
		return req.Cas != 0 // a binary compare
	case protocol.OpMetaSet:
		return req.Meta.HasCas || req.Meta.Invalidate || (req.Meta.Mode != 0 && req.Meta.Mode != 'S' && req.Meta.Mode != 's')
	case protocol.OpMetaDelete:
		_, x := req.Meta.Flag('x')
		return req.Meta.HasCas || req.Meta.Invalidate || x
	}
	return false
}

// write sends a write to key's replicas (see Replication above).
func (r *replica) write(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	p := r.pool
	unlock := r.opts.Writes.Lock(req.Key)
	set := p.ReplicaSetOf(req.Key)
	var targets [pool.MaxReplicas]int
	n := 0
	for _, i := range set.Idx[:set.N] {
		if p.Serving(i) {
			targets[n] = i
			n++
		} else {
			// Before the write is sent anywhere: from then on the replica owes the key.
			r.away(i, req.Key)
		}
	}
	if n == 0 {
		unlock()
		order.Dispatched()
		return errNoReplica
	}
	if decided(req) {
		defer unlock()
		return r.decide(ctx, order, req, resps, targets[:n])
	}
	return r.fanOut(ctx, order, req, resps, targets[:n], unlock)
}

// fanOut sends req to every target at once and answers after the pool's write quorum; the
// rest finish in the background (see newFan), and end the write's lock (unlock) when they
// are done.
func (r *replica) fanOut(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response, targets []int, unlock func()) error {
	f, req := r.newFan(req, targets, unlock)
	if f.weight > 0 {
		// The answer leaves sends running after the client's request is gone: a context
		// that outlives it (each send ends within its server's timeout).
		ctx = context.WithoutCancel(ctx)
	}
	// The sends' turn, given on at the answer: the key's lock keeps the key's next request
	// behind the sends still running.
	send, sent := order.Defer()
	type result struct {
		resp protocol.Response
		err  error
	}
	answered := make(chan result, 1)
	f.answer = func(resp protocol.Response, err error) { answered <- result{resp, err} }
	for j, i := range targets {
		s := &f.sends[j]
		s.req[0] = *req
		go func() {
			s.err[0] = pool.Do(ctx, r.direct[i], send, &s.req[0], s.resp[:])
			f.collect(s)
		}()
	}
	res := <-answered
	sent()
	resps[0] = res.resp
	return res.err
}

// decide has the first target decide req (onDecider), and carries the item it then holds to
// the others: with set, or for an add with add, which tells whether another held the key.
func (r *replica) decide(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response, targets []int) error {
	each, done := order.Defer()
	defer done()
	first := targets[0]
	if err := r.onDecider(ctx, each, req, resps, targets); err != nil {
		// It may have landed there: the others keep their item, but the first owes the key.
		r.away(first, req.Key)
		return err
	}
	if !succeeded(req, &resps[0]) || len(targets) == 1 {
		return nil
	}
	get := itemcopy.Get(req.Key)
	var got [1]protocol.Response
	carry := protocol.Request{Op: protocol.OpDelete, Key: req.Key}
	if err := pool.Do(ctx, r.direct[first], each, &get, got[:]); err != nil {
		// What the first holds now is unknown, and it is failing: the write is not
		// acknowledged, so the others' item stays right, and the first owes the key.
		r.away(first, req.Key)
		resps[0] = protocol.Response{Status: protocol.StatusTempFailure, Msg: "the replica that decided the write did not answer after it"}
		return nil
	}
	carryOp := protocol.OpSet
	if adds(req) {
		carryOp = protocol.OpAdd
	}
	if it := itemcopy.Parse(&got[0]); it.Found {
		if exptime, ok := itemcopy.Exptime(it.TTL); ok {
			carry = itemcopy.Store(carryOp, req.Key, &it, exptime)
		}
	}
	held := make([]bool, len(targets)) // an add's carry found the key there
	var wg sync.WaitGroup
	for j, i := range targets[1:] {
		wg.Go(func() {
			var one [1]protocol.Response
			err := pool.Do(ctx, r.direct[i], each, &carry, one[:])
			switch {
			case !acked(&one[0], err):
				r.away(i, req.Key)
			case carry.Op == protocol.OpAdd && one[0].Status == protocol.StatusNotStored:
				held[j+1] = true
			}
		})
	}
	wg.Wait()
	if from := slices.Index(held, true); from > 0 {
		// The first lacked a key another replica holds (it restarted empty): the add was
		// not the client's to win. The held item goes to every replica, and the add, sent
		// again, answers as it would have.
		r.restoreHeld(ctx, each, req.Key, targets, targets[from])
		return pool.Do(ctx, r.direct[first], each, req, resps)
	}
	return nil
}

// onDecider sends req to the replica that decides it (targets[0]). When the answer says that
// replica lacks the key while another target holds it (a restart emptied it, or a flush), the
// item is copied to it with add and its remaining TTL, and req sent again: decided on the
// value the replicas hold. A req that would create a missing key (binary incr with an
// initial value, ma with N) is first sent without creating, so that it cannot create over a
// value another replica holds.
func (r *replica) onDecider(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response, targets []int) error {
	decider := r.direct[targets[0]]
	if len(targets) == 1 {
		return pool.Do(ctx, decider, order, req, resps)
	}
	try := req
	plain, creates := withoutCreate(req)
	if creates {
		try = &plain
	}
	if err := pool.Do(ctx, decider, order, try, resps); err != nil {
		return err
	}
	if !lacks(req, &resps[0]) {
		return nil
	}
	later := order.After() // the request's own dispatch was the first send
	if !req.Op.ChangesKey() {
		// A read (mg): its copy under the key's write lock, as a write's (write holds it),
		// so that no write or delete of the key lands between the read of the copy and it.
		unlock := r.opts.Writes.Lock(req.Key)
		defer unlock()
	}
	held, err := r.fill(ctx, later, req.Key, targets[0], targets[1:])
	switch {
	case err != nil && (creates || req.Op.ChangesKey()):
		// Another replica may hold the key: neither "not found" nor a new item (created, or
		// decided on nothing) is the answer the replicas' value would give. A plain read's
		// miss stands, as a cache may forget.
		return err
	case !held && !creates:
		return nil // no other replica holds it either: the answer stands
	}
	return pool.Do(ctx, decider, later, req, resps)
}

// fill copies key to replica to from the first of others that holds it, with add and its
// remaining TTL; it reports whether to may now hold the key (the add stored it, or found
// it stored meanwhile). An error says it could not tell: a replica asked did not answer
// before one was found holding the key, or the add to to failed.
func (r *replica) fill(ctx context.Context, order *turn.Turn, key []byte, to int, others []int) (bool, error) {
	var unknown error
	for _, from := range others {
		it, err := r.fetch(ctx, order, key, from)
		if err != nil {
			unknown = err
			continue
		}
		if !it.Found {
			continue
		}
		exptime, ok := itemcopy.Exptime(it.TTL)
		if !ok {
			return false, nil // about to expire: as if it had
		}
		add := itemcopy.Store(protocol.OpAdd, key, &it, exptime)
		var one [1]protocol.Response
		if err := pool.Do(ctx, r.direct[to], order, &add, one[:]); err != nil {
			return false, err
		}
		switch one[0].Status {
		case protocol.StatusOK, protocol.StatusNotStored:
			return true, nil
		}
		return false, errCopyRefused
	}
	return false, unknown
}

// errCopyRefused fails a decided write whose decider refused the copy of the key another
// replica holds (out of memory, say): deciding it on nothing could lose that value.
var errCopyRefused = errors.New("the replica that decides the key refused its copy from another replica")

// restoreHeld sets key on every target but from to the item from holds, with its remaining
// TTL: an add decided on a replica that lacked the key stored a value the others must not
// keep.
func (r *replica) restoreHeld(ctx context.Context, order *turn.Turn, key []byte, targets []int, from int) {
	it, err := r.fetch(ctx, order, key, from)
	store := itemcopy.Delete(key)
	if exptime, live := itemcopy.Exptime(it.TTL); err == nil && it.Found && live {
		store = itemcopy.Store(protocol.OpSet, key, &it, exptime)
	}
	for _, i := range targets {
		if i == from {
			continue
		}
		var one [1]protocol.Response
		if err := pool.Do(ctx, r.direct[i], order, &store, one[:]); !acked(&one[0], err) {
			r.away(i, key)
		}
	}
}

// fetch reads what replica from holds of key, for a copy: an error when it did not answer.
func (r *replica) fetch(ctx context.Context, order *turn.Turn, key []byte, from int) (itemcopy.Item, error) {
	get := itemcopy.Get(key)
	var got [1]protocol.Response
	if err := pool.Do(ctx, r.direct[from], order, &get, got[:]); err != nil {
		return itemcopy.Item{}, err
	}
	if statusOf(&got[0]) == protocol.StatusNotFound || got[0].Meta.Code == protocol.MetaVA {
		return itemcopy.Parse(&got[0]), nil
	}
	return itemcopy.Item{}, fmt.Errorf("%s: the copy's read answered an error: %s", r.pool.Member(from).Name, got[0].Msg)
}

// adds reports whether req stores only when the key is missing (add, ms with mode E).
func adds(req *protocol.Request) bool {
	return req.Op == protocol.OpAdd || (req.Op == protocol.OpMetaSet && (req.Meta.Mode == 'E' || req.Meta.Mode == 'e'))
}

// lacks reports whether resp, a replica's answer to req, says the replica does not hold
// req's key: a miss, or a store that needs the key (append, prepend, replace) not stored.
func lacks(req *protocol.Request, resp *protocol.Response) bool {
	switch statusOf(resp) {
	case protocol.StatusNotFound:
		return true
	case protocol.StatusNotStored:
		return !adds(req)
	}
	return false
}

// withoutCreate is req without what makes it create a missing key (binary incr/decr's
// Create, ma's and mg's N), and whether it had it.
func withoutCreate(req *protocol.Request) (protocol.Request, bool) {
	switch {
	case req.Create:
		plain := *req
		plain.Create = false
		return plain, true
	case req.Meta.Vivify:
		plain := *req
		plain.Meta.Vivify = false
		plain.Meta.Flags = slices.DeleteFunc(slices.Clone(req.Meta.Flags), func(f protocol.MetaFlag) bool { return f.Letter == 'N' })
		return plain, true
	}
	return protocol.Request{}, false
}

// serving is the replicas of key that serve, in ring order: the first decides.
func (r *replica) serving(key []byte) pool.ReplicaSet {
	p := r.pool
	all := p.ReplicaSetOf(key)
	var s pool.ReplicaSet
	for _, i := range all.Idx[:all.N] {
		if p.Serving(i) {
			s.Idx[s.N] = i
			s.N++
		}
	}
	return s
}

// readOrder is the replicas of key a read asks, in the order it asks them: the serving
// ones, the first of them at random with read_from random unless firstOnly; with firstOnly
// only the first.
func (r *replica) readOrder(key []byte, firstOnly bool) pool.ReplicaSet {
	s := r.serving(key)
	switch {
	case firstOnly:
		s.N = min(s.N, 1)
	case s.N < 2:
	case r.zones:
		// This proxy's zone first, the others in listed order.
		for j, i := range s.Idx[:s.N] {
			if r.pool.ZoneOf(i) == r.opts.LocalZone {
				copy(s.Idx[1:j+1], s.Idx[:j])
				s.Idx[0] = i
				break
			}
		}
	case r.opts.ReadFrom == ReadRandom:
		j := rand.IntN(s.N)
		s.Idx[0], s.Idx[j] = s.Idx[j], s.Idx[0]
	}
	return s
}

// zoneRead counts a key a read of a pool with zones answered: a hit from member i, or a
// miss (i < 0).
func (r *replica) zoneRead(i int) {
	if !r.zones || r.opts.ZoneRead == nil {
		return
	}
	zones := r.pool.Zones()
	local := max(r.opts.LocalZone, 0)
	switch z := local; {
	case i < 0:
		r.opts.ZoneRead(zones[z], ZoneMiss)
	case r.pool.ZoneOf(i) == local:
		r.opts.ZoneRead(zones[z], ZoneLocal)
	default:
		r.opts.ZoneRead(zones[r.pool.ZoneOf(i)], ZoneRemote)
	}
}

// read answers a retrieval of one or more keys: one batch per server per round, the keys
// that missed or failed asked of their next replica in the next round.
func (r *replica) read(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	firstOnly := req.Op == protocol.OpGets || req.Op == protocol.OpGats
	n := len(req.Keys)
	orders := make([]pool.ReplicaSet, n)
	tried := make([]int, n)      // replicas of orders[k] asked so far
	missed := make([][]int, n)   // replicas that answered a miss, for the copy
	epochs := make([]uint64, n)  // the key's stripe's epoch before its first read
	answered := make([]bool, n)  // some replica answered (a hit, or a miss)
	pending := make([]int, 0, n) // keys to ask in this round
	var lastErr error
	for k, key := range req.Keys {
		if firstOnly {
			orders[k] = r.serving(key) // the first's answer stands; the others fill it (rereadFirst)
		} else {
			orders[k] = r.readOrder(key, false)
		}
		epochs[k] = r.opts.Writes.Settled(key)
		if orders[k].N == 0 {
			lastErr = errNoReplica
			continue
		}
		pending = append(pending, k)
	}
	if len(pending) == 0 {
		order.Dispatched()
		return errNoReplica
	}
	// The first round is the request's dispatch: its own when it asks one server, else
	// one for all of them once they have answered. Later rounds go after it.
	turnOf, roundDone := order, func() {}
	for round := 0; len(pending) > 0; round++ {
		groups := make(map[int][]int) // server → keys
		for _, k := range pending {
			s := orders[k].Idx[tried[k]]
			groups[s] = append(groups[s], k)
		}
		switch {
		case round == 0 && len(groups) > 1:
			turnOf, roundDone = order.Defer()
		case round > 0 && turnOf == order:
			turnOf = order.After()
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		var next []int
		for s, ks := range groups {
			ask := func() {
				sub := *req
				sub.Keys = make([][]byte, len(ks))
				for j, k := range ks {
					sub.Keys[j] = req.Keys[k]
				}
				out := make([]protocol.Response, len(ks))
				err := pool.Do(ctx, r.direct[s], turnOf, &sub, out)
				mu.Lock()
				defer mu.Unlock()
				for j, k := range ks {
					tried[k]++
					switch {
					case err != nil || out[j].Status == protocol.StatusTempFailure:
						if err != nil {
							lastErr = err
						} else if !answered[k] {
							resps[k] = out[j]
						}
					case out[j].Status == protocol.StatusOK:
						resps[k], answered[k] = out[j], true
						continue
					default:
						resps[k], answered[k] = out[j], true
						missed[k] = append(missed[k], s)
					}
					if tried[k] < orders[k].N {
						next = append(next, k)
					}
				}
			}
			if len(groups) == 1 {
				ask() // the usual case: no goroutine
			} else {
				wg.Go(ask)
			}
		}
		wg.Wait()
		roundDone()
		roundDone = func() {}
		pending = next
	}
	var repairs []int
	some := false
	for k := range n {
		some = some || answered[k] || resps[k].Status == protocol.StatusTempFailure
		if answered[k] && resps[k].Status == protocol.StatusOK && len(missed[k]) > 0 {
			repairs = append(repairs, k)
		}
	}
	if !some && lastErr != nil {
		return lastErr // no replica of any key answered: as a server that did not
	}
	for k := range n {
		if !answered[k] && resps[k].Status != protocol.StatusTempFailure {
			resps[k] = protocol.Response{Status: protocol.StatusTempFailure, Msg: "no replica of the key answered", Key: req.Keys[k]}
		}
	}
	if r.zones {
		for k := range n {
			switch {
			case answered[k] && resps[k].Status == protocol.StatusOK:
				r.zoneRead(orders[k].Idx[tried[k]-1])
			case answered[k]:
				r.zoneRead(-1)
			}
		}
	}
	for _, k := range repairs {
		gatExptime := int64(-1)
		if req.Op == protocol.OpGat || req.Op == protocol.OpGats {
			gatExptime = req.Exptime
		}
		r.repair(ctx, turnOf, req.Keys[k], orders[k].Idx[tried[k]-1], missed[k], epochs[k], gatExptime)
	}
	if firstOnly {
		if turnOf == order {
			turnOf = order.After()
		}
		r.rereadFirst(ctx, turnOf, req, resps, orders, tried, missed)
	}
	return nil
}

// rereadFirst answers again from their first replica the keys of a gets or gats that another
// replica answered: each server numbers its own cas, and the first's decides a cas write. A
// key the first missed was copied to it (repair) and is read there again; a key the first
// did not answer fails.
func (r *replica) rereadFirst(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response, orders []pool.ReplicaSet, tried []int, missed [][]int) {
	again := make(map[int][]int) // first replica → keys
	for k := range req.Keys {
		if tried[k] <= 1 || resps[k].Status != protocol.StatusOK {
			continue // answered by the first, or a miss everywhere
		}
		first := orders[k].Idx[0]
		if !slices.Contains(missed[k], first) {
			resps[k] = protocol.Response{Status: protocol.StatusTempFailure, Msg: "the replica that numbers the key's cas did not answer", Key: req.Keys[k]}
			continue
		}
		// The repair may not have been made (a write of the stripe began meanwhile): the
		// copy is made here under the key's write lock, which the write in flight ends.
		unlock := r.opts.Writes.Lock(req.Keys[k])
		_, _ = r.fill(ctx, order, req.Keys[k], first, orders[k].Idx[1:orders[k].N]) // the get again tells
		unlock()
		again[first] = append(again[first], k)
	}
	for first, ks := range again {
		sub := *req
		sub.Keys = make([][]byte, len(ks))
		for j, k := range ks {
			sub.Keys[j] = req.Keys[k]
		}
		out := make([]protocol.Response, len(ks))
		err := pool.Do(ctx, r.direct[first], order, &sub, out)
		for j, k := range ks {
			if err != nil {
				out[j] = protocol.Response{Status: protocol.StatusTempFailure, Msg: "the replica that numbers the key's cas did not answer", Key: req.Keys[k]}
			}
			resps[k] = out[j]
		}
	}
}

// metaGet answers an mg: from the first serving replica, and after a miss from the next,
// unless its flags ask for what only one server can answer (c) or change the item (N T E R).
func (r *replica) metaGet(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	m := &req.Meta
	_, cas := m.Flag('c')
	_, e := m.Flag('E')
	firstOnly := cas || e || m.Vivify || m.HasTTL || m.Recache
	if firstOnly {
		set := r.serving(req.Key)
		if set.N == 0 {
			order.Dispatched()
			return errNoReplica
		}
		return r.onDecider(ctx, order, req, resps, set.Idx[:set.N])
	}
	orderOf := r.readOrder(req.Key, false)
	if orderOf.N == 0 {
		order.Dispatched()
		return errNoReplica
	}
	epoch := r.opts.Writes.Settled(req.Key)
	turnOf := order
	var missed []int
	var err error
	for j, s := range orderOf.Idx[:orderOf.N] {
		if j == 1 {
			turnOf = order.After()
		}
		var one [1]protocol.Response
		if err = pool.Do(ctx, r.direct[s], turnOf, req, one[:]); err != nil {
			continue
		}
		resps[0] = one[0]
		switch one[0].Meta.Code {
		case protocol.MetaEN:
			missed = append(missed, s)
			continue
		case protocol.MetaVA, protocol.MetaHD:
			r.zoneRead(s)
			if len(missed) > 0 {
				r.repair(ctx, turnOf, req.Key, s, missed, epoch, -1)
			}
		}
		return nil
	}
	if len(missed) > 0 {
		r.zoneRead(-1)
		return nil // the last miss stands
	}
	return err
}

// repair copies key from replica from to the replicas that missed it, with add and its
// remaining TTL (or exptime, a gat's, when ≥ 0), unless a write of its stripe began since
// epoch, before the read; replicated writes of the key wait for the adds.
func (r *replica) repair(ctx context.Context, order *turn.Turn, key []byte, from int, missed []int, epoch uint64, exptime int64) {
	it, err := r.fetch(ctx, order, key, from)
	if err != nil || !it.Found {
		return
	}
	if exptime < 0 {
		var live bool
		if exptime, live = itemcopy.Exptime(it.TTL); !live {
			return
		}
	}
	add := itemcopy.Store(protocol.OpAdd, key, &it, exptime)
	// Not IfQuiet: its lock, held across the adds, is one a server's reader takes to end
	// another write of the stripe, which the adds' answers would then wait behind.
	quiet, release := r.opts.Writes.HoldQuiet([][]byte{key}, []uint64{epoch})
	defer release()
	if !quiet[0] {
		return
	}
	for _, i := range missed {
		var one [1]protocol.Response
		if err := pool.Do(ctx, r.direct[i], order, &add, one[:]); err == nil && one[0].Status == protocol.StatusOK {
			if r.opts.Repaired != nil {
				r.opts.Repaired()
			}
		}
	}
}
