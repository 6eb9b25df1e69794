// Package memstore is an in-process memcached shard: a bounded LRU map from keys to items
// that answers protocol requests with memcached 1.6's semantics.
package memstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

var _ pool.Server = (*Store)(nil)

// DefaultMaxBytes is the memory bound of a Store whose Options.MaxBytes is 0, memcached's
// default of 64 MiB.
const DefaultMaxBytes = 64 << 20

// version is what the version command answers: the store is not a memcached, so it does not
// claim a memcached version number.
const version = "moxi-embedded"

// Options configure a Store. The zero value is a 64 MiB store on the wall clock.
type Options struct {
	// MaxBytes bounds the memory the store accounts for (key + value + a fixed per-item
	// overhead); past it the least recently used items are evicted. 0 means DefaultMaxBytes.
	// cache_memlimit may lower the bound but never raise it above MaxBytes.
	MaxBytes int64

	// Now is the clock used for expiry and delayed flushes; nil means time.Now. Tests inject
	// a clock so that expiry is exercised without waiting.
	Now func() time.Time
}

// Store is one in-process memcached shard. It implements the pool's Server interface, so the
// proxy routes to it exactly as to a remote memcached.
//
// A Store is safe for concurrent use; one mutex serialises its requests, so parallelism
// comes from running several shards. It copies every key and value it keeps. The Value
// bytes it returns in a Response are its own item bytes and are never modified afterwards
// (every modification builds a new slice), so callers may keep them without copying.
type Store struct {
	now      func() time.Time                                                                // read-only after New
	maxBytes int64                                                                           // guarded by mu (cache_memlimit changes it)
	bound    int64                                                                           // read-only after New; the configured maxBytes, which cache_memlimit never exceeds
	version  []byte                                                                          // read-only after New; handed out in responses, never modified
	requests atomic.Uint64                                                                   // requests executed, for the admin views
	doFunc   func(context.Context, *turn.Turn, *protocol.Request, []protocol.Response) error // do, made once

	mu      sync.Mutex
	items   map[string]*item // guarded by mu
	lru     item             // guarded by mu; sentinel of the LRU list, lru.next is the most recent
	bytes   int64            // guarded by mu; sum of itemSize over items
	casSeq  uint64           // guarded by mu; the last cas unique handed out
	flushAt int64            // guarded by mu; unix second of a pending delayed flush, 0 = none
	stats   counters         // guarded by mu
}

// New returns an empty Store configured by opts.
func New(opts Options) *Store {
	s := &Store{
		now:      opts.Now,
		maxBytes: opts.MaxBytes,
		version:  []byte(version),
		items:    make(map[string]*item),
	}
	s.doFunc = s.do
	if s.now == nil {
		s.now = time.Now
	}
	if s.maxBytes <= 0 {
		s.maxBytes = DefaultMaxBytes
	}
	s.bound = s.maxBytes
	s.lru.next, s.lru.prev = &s.lru, &s.lru
	return s
}

// Start executes reqs at once, one after the other, and calls done before it returns: an
// in-process store has no answer to wait for. Every outcome is a Status and every error
// nil, as a store always answers. Response.Key aliases the request's key bytes.
func (s *Store) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	pool.DoEach(ctx, order, reqs, resps, errs, s.doFunc)
	done()
}

// do executes req: resps[i] answers req.Keys[i] for a retrieval, resps[0] any other command.
func (s *Store) do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	s.requests.Add(1)
	s.mu.Lock()
	defer order.Dispatched() // executed in full: the connection's next request may start
	defer s.mu.Unlock()
	now := s.now().Unix()
	s.applyDueFlush(now)

	if req.Op.IsRetrieval() {
		s.retrieve(req, resps, now)
		return nil
	}
	r := &resps[0]
	*r = protocol.Response{}
	switch req.Op {
	case protocol.OpSet:
		s.handleSet(req, r, now)
	case protocol.OpAdd:
		s.handleAdd(req, r, now)
	case protocol.OpReplace:
		s.handleReplace(req, r, now)
	case protocol.OpAppend, protocol.OpPrepend:
		s.handleConcat(req, r, now)
	case protocol.OpCas:
		s.handleCas(req, r, now)
	case protocol.OpDelete:
		s.handleDelete(req, r, now)
	case protocol.OpIncr, protocol.OpDecr:
		s.handleDelta(req, r, now)
	case protocol.OpTouch:
		s.handleTouch(req, r, now)
	case protocol.OpFlushAll:
		s.handleFlush(req, now)
	case protocol.OpCacheMemlimit:
		// As memcached: a new limit, down to which the least recently used items go now.
		// A client may lower it but not raise it past the configured bound (embedded_memory_mb):
		// above it the answer is still memcached's OK, the limit the bound.
		s.maxBytes = min(int64(req.Delta)<<20, s.bound)
		s.makeRoom(0, now)
	case protocol.OpVersion:
		r.Value = s.version
	case protocol.OpStats:
		// Any stats argument gets the general stats: a shard has no slabs or settings to show.
		r.Stats = s.statsLocked()
	case protocol.OpMetaNoop, protocol.OpMetaGet, protocol.OpMetaSet, protocol.OpMetaDelete, protocol.OpMetaArithmetic, protocol.OpMetaDebug:
		s.handleMeta(req, r, now)
	case protocol.OpVerbosity, protocol.OpNoop, protocol.OpQuit:
		// Nothing to do: the answer is OK, and quitting is the connection's business.
	default:
		r.Status = protocol.StatusUnknownCommand
	}
	return nil
}

// Up is always true: an in-process store cannot be unreachable.
func (s *Store) Up() bool { return true }

// Info reports the store up, with the requests it was handed.
func (s *Store) Info() pool.Info {
	return pool.Info{State: pool.StateUp, Counters: pool.Counters{Requests: s.requests.Load()}}
}

// Close does nothing: the store holds no connections or goroutines, and its memory goes
// with its last reference.
func (s *Store) Close() error { return nil }

// expiryAt converts a request's exptime to the unix second at which the item expires, with
// memcached's rules: 0 never expires (0), up to 30 days is relative to now, more is an
// absolute unix time, and a negative one has already expired.
func expiryAt(exptime, now int64) int64 {
	const maxDelta = 60 * 60 * 24 * 30 // memcached's REALTIME_MAXDELTA
	switch {
	case exptime == 0:
		return 0
	case exptime < 0:
		return now
	case exptime > maxDelta:
		return exptime
	default:
		return now + exptime
	}
}

// handleFlush invalidates every item now, or schedules that for req.Exptime seconds (or the
// absolute time) ahead. As in memcached, a new flush_all replaces a pending delayed one, and
// items stored after the flush time stay.
func (s *Store) handleFlush(req *protocol.Request, now int64) {
	s.stats.cmdFlush++
	s.flushAt = 0
	if req.Exptime > 0 {
		if at := expiryAt(req.Exptime, now); at > now {
			s.flushAt = at
			return
		}
	}
	s.clear()
}

// applyDueFlush carries out a pending delayed flush whose time has come. Because it runs at
// the start of every request under mu, every item present when it fires was stored before
// the flush time, so clearing everything is exactly "items stored before it become
// invisible".
func (s *Store) applyDueFlush(now int64) {
	if s.flushAt != 0 && now >= s.flushAt {
		s.flushAt = 0
		s.clear()
	}
}
