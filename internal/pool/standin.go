package pool

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// StandIns remembers the keys written to a stand-in while their server was not serving, so
// that before the server serves again those keys are deleted on the stand-in and on the
// server itself (docs/operating.md, failover). Without that, a server that was only unreachable (its
// data kept) would answer values older than the ones written meanwhile, and one that came
// back and died again would hand its keys back to a stand-in holding older values.
//
// A server that owes such a cleanup does not serve its keys: its pools place them as if it
// were dead until the cleanup is done. The cleanup starts when a placement finds the server
// up again, and runs in rounds: it takes the keys remembered so far, waits for the stand-in
// writes that made them to be answered, deletes them, and ends when a round finds no new
// key (under the same lock as a write's remembering, so none slips in between).
//
// At most max keys are remembered; past that a stand-in write is not remembered (counted in
// Forgotten) and only the pool's failover_ttl, the cap on stand-in writes' expiry, bounds
// how long its older copies can be served. One StandIns serves every pool of every topology
// a process builds, so that what it remembers outlives reloads.
type StandIns struct {
	max    int
	logger *slog.Logger

	owing atomic.Int32 // len(owed), read on every placement without mu

	mu   sync.Mutex
	owed map[Server]*debt // guarded by mu
	n    int              // keys remembered; guarded by mu

	forgotten atomic.Uint64
}

// debt is what one server owes before it serves again.
type debt struct {
	cur      *round // the round remembering new writes
	cleaning bool   // a cleanup goroutine runs
	retryAt  time.Time
	// flush: a replica's key was not remembered (max keys were), so the replica is
	// flushed before it serves, rather than trusted to failover_ttl as a stand-in is.
	flush bool
}

// round is the stand-in writes remembered between two steps of a cleanup.
type round struct {
	keys    map[string]Server // key → the stand-in it was written to; nil: a replica's key (away)
	writing sync.WaitGroup    // its writes not yet answered
}

func newRound() *round { return &round{keys: make(map[string]Server)} }

// NewStandIns remembers at most max keys (max > 0).
func NewStandIns(max int, logger *slog.Logger) *StandIns {
	if logger == nil {
		logger = slog.Default()
	}
	return &StandIns{max: max, logger: logger, owed: make(map[Server]*debt)}
}

// Remembered is the number of keys remembered now.
func (l *StandIns) Remembered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// Forgotten counts the stand-in writes not remembered because max keys were.
func (l *StandIns) Forgotten() uint64 { return l.forgotten.Load() }

// owes reports whether s must clean up before it serves again.
func (l *StandIns) owes(s Server) bool {
	if l == nil || l.owing.Load() == 0 {
		return false
	}
	l.mu.Lock()
	_, ok := l.owed[s]
	l.mu.Unlock()
	return ok
}

// remember records that key, owned by home, is about to be written to standIn. It returns
// the WaitGroup the write must call Done on once answered, or nil, without recording
// anything, when home serves its keys again (the caller places the write anew).
func (l *StandIns) remember(home Server, key []byte, standIn Server) *sync.WaitGroup {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.owed[home]
	if d == nil {
		if home.Up() {
			return nil // it came back since the placement, and owes nothing
		}
		d = &debt{cur: newRound()}
		l.owed[home] = d
		l.owing.Add(1)
	}
	r := d.cur
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

// away records that key, of which home is a replica, was written without home: home was
// away (not serving) or did not take the write. home then serves no read until key is
// deleted on it; past max keys remembered it is flushed instead.
func (l *StandIns) away(home Server, key []byte) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.owed[home]
	if d == nil {
		d = &debt{cur: newRound()}
		l.owed[home] = d
		l.owing.Add(1)
	}
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

// clean starts home's cleanup unless one runs, or the last failed less than a second ago.
func (l *StandIns) clean(home Server, pool, name string) {
	l.mu.Lock()
	d := l.owed[home]
	if d == nil || d.cleaning || time.Now().Before(d.retryAt) {
		l.mu.Unlock()
		return
	}
	d.cleaning = true
	l.mu.Unlock()
	go l.cleanup(home, d, pool, name)
}

// cleanupBatch bounds the deletes sent in one batch.
const cleanupBatch = 512

// cleanupTimeout bounds one batch of deletes, on top of the server's own timeout.
const cleanupTimeout = 30 * time.Second

// cleanup runs the rounds of home's cleanup (see StandIns).
func (l *StandIns) cleanup(home Server, d *debt, pool, name string) {
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
			if !flush(home) {
				l.mu.Lock()
				d.flush = true
				d.cleaning, d.retryAt = false, time.Now().Add(time.Second)
				l.mu.Unlock()
				l.logger.Warn("replicas: server back but not answering flush_all; it keeps not serving its keys", "pool", pool, "server", name)
				return
			}
			l.logger.Info("replicas: server flushed before serving again: more keys were written while it was away than are remembered",
				"pool", pool, "server", name)
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
					"pool", pool, "server", name, "keys", deleted)
			}
			return
		}
		d.cur = newRound()
		l.n -= len(r.keys)
		l.mu.Unlock()

		r.writing.Wait()
		if failed := deleteEverywhere(home, r.keys); len(failed) > 0 {
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
				"pool", pool, "server", name, "keys_owed", len(failed))
			return
		}
		deleted += len(r.keys)
	}
}

// deleteEverywhere deletes keys on their stand-ins and on home. It returns the keys home did
// not answer for. A stand-in that does not answer keeps its copy until failover_ttl.
func deleteEverywhere(home Server, keys map[string]Server) map[string]Server {
	var failed map[string]Server
	byStandIn := make(map[Server][]string)
	for k, s := range keys {
		byStandIn[s] = append(byStandIn[s], k)
	}
	for s, ks := range byStandIn {
		if s != nil { // nil: a replica's key, which only home deletes
			deleteKeys(s, ks)
		}
	}
	all := make([]string, 0, len(keys))
	for k := range keys {
		all = append(all, k)
	}
	for k, ok := range deleteKeys(home, all) {
		if !ok {
			if failed == nil {
				failed = make(map[string]Server)
			}
			failed[k] = keys[k]
		}
	}
	return failed
}

// flush empties s with flush_all and reports whether it answered OK.
func flush(s Server) bool {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var resp [1]protocol.Response
	err := s.Do(ctx, nil, &protocol.Request{Op: protocol.OpFlushAll}, resp[:])
	return err == nil && resp[0].Status == protocol.StatusOK
}

// deleteKeys deletes keys on s in batches and reports, per key, whether s answered (a
// miss is an answer).
func deleteKeys(s Server, keys []string) map[string]bool {
	answered := make(map[string]bool, len(keys))
	for len(keys) > 0 {
		n := min(len(keys), cleanupBatch)
		reqs := make([]protocol.Request, n)
		for i, k := range keys[:n] {
			reqs[i] = protocol.Request{Op: protocol.OpDelete, Key: []byte(k)}
		}
		resps := make([]protocol.Response, n)
		errs := make([]error, n)
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		s.DoBatch(ctx, nil, reqs, resps, errs)
		cancel()
		for i, k := range keys[:n] {
			answered[k] = errs[i] == nil && resps[i].Status != protocol.StatusTempFailure
		}
		keys = keys[n:]
	}
	return answered
}
