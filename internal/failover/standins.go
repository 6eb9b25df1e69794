// Package failover is what a pool does while a server fails: its keys written to stand-ins
// (Wrap) and what each server owes before it serves again (StandIns).
package failover

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// StandIns remembers the keys written to a stand-in while their server was not serving, so
// that before the server serves again those keys are deleted on the stand-in and on the
// server itself (docs/operating.md, failover). Without that, a server that was only unreachable (its
// data kept) would answer values older than the ones written meanwhile, and one that came
// back and died again would hand its keys back to a stand-in holding older values.
//
// A server that owes such a cleanup does not serve its keys: its pools place them as if it
// were dead until the cleanup is done. The cleanup starts once the server is up again
// (watch, a goroutine of StandIns's own, looks at the servers that owe one; a placement
// only asks), and runs in rounds: it takes the keys remembered so far, waits for the
// stand-in writes that made them to be answered, deletes them, and ends when a round finds
// no new key (under the same lock as a write's remembering, so none slips in between).
//
// At most max keys are remembered; past that a stand-in write is not remembered (counted in
// Forgotten) and only the pool's failover_ttl, the cap on stand-in writes' expiry, bounds
// how long its older copies can be served. One StandIns serves every pool of every topology
// a process builds, so that what it remembers outlives reloads. Close ends its goroutines.
type StandIns struct {
	max    int
	logger *slog.Logger
	// Flushed, when set before the first use, is told of each replica flushed before it
	// serves again (past the memory's bound): it is empty, and may be refilled.
	Flushed func(pool, server string)

	owing atomic.Int32 // len(owed), read on every placement without mu

	mu   sync.Mutex
	owed map[pool.Server]*debt // guarded by mu
	n    int                   // keys remembered; guarded by mu

	forgotten atomic.Uint64

	owed1    chan struct{}      // capacity 1: a server began to owe (watch looks at once)
	watching bool               // watch runs; guarded by mu
	ctx      context.Context    // the cleanups'; cancelled by Close
	cancel   context.CancelFunc //
	wg       sync.WaitGroup     // watch and the cleanups it started
}

// debt is what one server owes before it serves again.
type debt struct {
	pool, name string // the server's, for the log
	cur        *round // the round remembering new writes
	cleaning   bool   // a cleanup goroutine runs
	retryAt    time.Time
	// flush: a replica's key was not remembered (max keys were), so the replica is
	// flushed before it serves, rather than trusted to failover_ttl as a stand-in is.
	flush bool
	// deleting is the round a cleanup is deleting, until it is done (Export hands it on).
	deleting map[string]pool.Server
}

// round is the stand-in writes remembered between two steps of a cleanup.
type round struct {
	keys    map[string]pool.Server // key → the stand-in it was written to; nil: a replica's key (away)
	writing sync.WaitGroup         // its writes not yet answered
}

func newRound() *round { return &round{keys: make(map[string]pool.Server)} }

// NewStandIns remembers at most max keys (max > 0). The goroutine that begins each owing
// server's cleanup once it is up (watch) starts when a server first owes one; Close ends
// it.
func NewStandIns(max int, logger *slog.Logger) *StandIns {
	if logger == nil {
		logger = slog.Default()
	}
	l := &StandIns{max: max, logger: logger, owed: make(map[pool.Server]*debt), owed1: make(chan struct{}, 1)}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// Close stops the cleanups (their deletes are cancelled; what they had not deleted stays
// owed) and the watch, and waits for them.
func (l *StandIns) Close() {
	l.mu.Lock() // goroutines start under mu, and not once cancelled: none starts after Wait
	l.cancel()
	l.mu.Unlock()
	l.wg.Wait()
}

// upPoll is how often watch asks the servers that owe a cleanup whether they are up.
const upPoll = 20 * time.Millisecond

// watch starts the cleanup of each server that owes one once it is up, until Close: it
// looks when a server begins to owe, then every upPoll while any does.
func (l *StandIns) watch() {
	defer l.wg.Done()
	poll := time.NewTicker(upPoll)
	defer poll.Stop()
	for {
		if l.owing.Load() == 0 {
			select { // nothing owed: sleep until something is
			case <-l.owed1:
			case <-l.ctx.Done():
				return
			}
		}
		select {
		case <-poll.C:
		case <-l.owed1:
		case <-l.ctx.Done():
			return
		}
		l.startCleanups(time.Now())
	}
}

// startCleanups starts the cleanup of every server that owes one, is up, and has no
// cleanup running nor one that failed less than a second before now.
func (l *StandIns) startCleanups(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil {
		return // closed
	}
	for home, d := range l.owed {
		if d.cleaning || now.Before(d.retryAt) || !home.Up() {
			continue
		}
		d.cleaning = true
		l.wg.Add(1)
		go l.cleanup(home, d)
	}
}

// owe is home's debt, made when it has none; the caller holds mu.
func (l *StandIns) owe(home pool.Server, poolName, name string) *debt {
	d := l.owed[home]
	if d == nil {
		d = &debt{pool: poolName, name: name, cur: newRound()}
		l.owed[home] = d
		l.owing.Add(1)
		if !l.watching && l.ctx.Err() == nil {
			l.watching = true
			l.wg.Add(1)
			go l.watch()
		}
		select {
		case l.owed1 <- struct{}{}:
		default:
		}
	}
	return d
}

// Remembered is the number of keys remembered now.
func (l *StandIns) Remembered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// Forgotten counts the stand-in writes not remembered because max keys were.
func (l *StandIns) Forgotten() uint64 { return l.forgotten.Load() }

var _ pool.Debts = (*StandIns)(nil)

// Owes reports whether s must clean up before it serves again (pool.Debts).
func (l *StandIns) Owes(s pool.Server) bool {
	if l == nil || l.owing.Load() == 0 {
		return false
	}
	l.mu.Lock()
	_, ok := l.owed[s]
	l.mu.Unlock()
	return ok
}

// remember records that key, owned by home (member name of pool), is about to be written
// to standIn. It returns the WaitGroup the write must call Done on once answered, or nil,
// without recording anything, when home serves its keys again (the caller places the
// write anew).
func (l *StandIns) remember(home pool.Server, poolName, name string, key []byte, standIn pool.Server) *sync.WaitGroup {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owed[home] == nil && home.Up() {
		return nil // it came back since the placement, and owes nothing
	}
	r := l.owe(home, poolName, name).cur
	if _, ok := r.keys[string(key)]; ok || l.n < l.max {
		if !ok {
			l.n++
		}
		r.keys[string(key)] = standIn
	} else {
		l.forgotten.Add(1)
	}
	r.writing.Add(1)
	return &r.writing
}

// Away records that key, of which home (member name of pool) is a replica, was written
// without home: home was away (not serving) or did not take the write. home then serves no
// read until key is deleted on it; past max keys remembered it is flushed instead.
func (l *StandIns) Away(home pool.Server, poolName, name string, key []byte) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.owe(home, poolName, name)
	r := d.cur
	if _, ok := r.keys[string(key)]; ok {
		return
	}
	if l.n < l.max {
		l.n++
		r.keys[string(key)] = nil // deleted on home only: the other replicas hold the write
		return
	}
	d.flush = true
	l.forgotten.Add(1)
}

// cleanupBatch bounds the deletes sent in one batch.
const cleanupBatch = 512

// cleanupTimeout bounds one batch of deletes, on top of the server's own timeout.
const cleanupTimeout = 30 * time.Second

// cleanup runs the rounds of home's cleanup (see StandIns).
func (l *StandIns) cleanup(home pool.Server, d *debt) {
	defer l.wg.Done()
	poolName, name := d.pool, d.name
	deleted := 0
	for {
		l.mu.Lock()
		r := d.cur
		if d.flush {
			d.flush = false
			d.cur = newRound()
			l.n -= len(r.keys)
			l.mu.Unlock()
			r.writing.Wait()
			if !flush(l.ctx, home) {
				l.mu.Lock()
				d.flush = true
				d.cleaning, d.retryAt = false, time.Now().Add(time.Second)
				l.mu.Unlock()
				l.logger.Warn("replicas: server back but not answering flush_all; it keeps not serving its keys", "pool", poolName, "server", name)
				return
			}
			l.logger.Info("replicas: server flushed before serving again: more keys were written while it was away than are remembered",
				"pool", poolName, "server", name)
			if l.Flushed != nil {
				l.Flushed(poolName, name)
			}
			continue
		}
		if len(r.keys) == 0 {
			// Nothing written to a stand-in since the last round: home serves again. A
			// write placed before this sees it in remember and is placed anew.
			delete(l.owed, home)
			l.owing.Add(-1)
			l.mu.Unlock()
			r.writing.Wait() // writes not remembered (memory full) end before home serves
			if deleted > 0 {
				l.logger.Info("failover: server serves again after deleting the keys written to stand-ins meanwhile",
					"pool", poolName, "server", name, "keys", deleted)
			}
			return
		}
		d.cur = newRound()
		d.deleting = r.keys
		l.n -= len(r.keys)
		l.mu.Unlock()

		r.writing.Wait()
		failed := deleteEverywhere(l.ctx, home, r.keys)
		l.mu.Lock()
		d.deleting = nil
		l.mu.Unlock()
		if len(failed) > 0 {
			l.mu.Lock()
			for k, s := range failed {
				if _, ok := d.cur.keys[k]; !ok {
					d.cur.keys[k] = s
					l.n++
				}
			}
			d.cleaning, d.retryAt = false, time.Now().Add(time.Second)
			l.mu.Unlock()
			l.logger.Warn("failover: server back but not answering deletes; it keeps not serving its keys",
				"pool", poolName, "server", name, "keys_owed", len(failed))
			return
		}
		deleted += len(r.keys)
	}
}

// deleteEverywhere deletes keys on their stand-ins and on home. It returns the keys home did
// not answer for. A stand-in that does not answer keeps its copy until failover_ttl.
func deleteEverywhere(ctx context.Context, home pool.Server, keys map[string]pool.Server) map[string]pool.Server {
	var failed map[string]pool.Server
	byStandIn := make(map[pool.Server][]string)
	for k, s := range keys {
		byStandIn[s] = append(byStandIn[s], k)
	}
	for s, ks := range byStandIn {
		if s != nil { // nil: a replica's key, which only home deletes
			deleteKeys(ctx, s, ks)
		}
	}
	all := make([]string, 0, len(keys))
	for k := range keys {
		all = append(all, k)
	}
	for k, ok := range deleteKeys(ctx, home, all) {
		if !ok {
			if failed == nil {
				failed = make(map[string]pool.Server)
			}
			failed[k] = keys[k]
		}
	}
	return failed
}

// flush empties s with flush_all and reports whether it answered OK.
func flush(ctx context.Context, s pool.Server) bool {
	ctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	var resp [1]protocol.Response
	err := pool.Do(ctx, s, nil, &protocol.Request{Op: protocol.OpFlushAll}, resp[:])
	return err == nil && resp[0].Status == protocol.StatusOK
}

// deleteKeys deletes keys on s in batches and reports, per key, whether s answered (a
// miss is an answer).
func deleteKeys(ctx context.Context, s pool.Server, keys []string) map[string]bool {
	answered := make(map[string]bool, len(keys))
	for len(keys) > 0 {
		n := min(len(keys), cleanupBatch)
		reqs := make([]protocol.Request, n)
		for i, k := range keys[:n] {
			reqs[i] = protocol.Request{Op: protocol.OpDelete, Key: []byte(k)}
		}
		resps := make([]protocol.Response, n)
		errs := make([]error, n)
		ctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		pool.DoBatch(ctx, s, nil, reqs, resps, errs)
		cancel()
		for i, k := range keys[:n] {
			answered[k] = errs[i] == nil && resps[i].Status != protocol.StatusTempFailure
		}
		keys = keys[n:]
	}
	return answered
}
