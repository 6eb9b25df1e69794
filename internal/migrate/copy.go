package migrate

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/moxi-proxy/moxi/internal/keyhash"
)

// copyBatch is how many keys the background copy reads from the old server at once.
const copyBatch = 250

// copyLimiter paces the background copy at keysPerSecond (0: no limit). Its burst is the
// copy's batch: a tenth of a second's keys (1 to copyBatch), so that the copy moves at
// least ten batches a second, steadily, not a second's keys at once.
func copyLimiter(keysPerSecond int) *rate.Limiter {
	if keysPerSecond <= 0 {
		return rate.NewLimiter(rate.Inf, copyBatch)
	}
	return rate.NewLimiter(rate.Limit(keysPerSecond), max(1, min(copyBatch, keysPerSecond/10)))
}

// maxPasses bounds the listings of the old server. memcached's crawler is no snapshot: an
// item its LRU maintainer moves between segments mid-crawl, or that a client holds at that
// instant, can be missed (seen here: 1 to 3 of 50,000, and 4 of 3,200 under a read load), so
// the copy lists again, copying only keys it had not listed, until quietPasses passes in a
// row find none (one was not enough: a key missed twice stayed behind in 1 of about 3 test
// runs under load).
const (
	maxPasses   = 6
	quietPasses = 2
)

// run is the background copy: it lists the old server's items and copies, batch by batch,
// every one still absent on the new server and not written by a client meanwhile, within
// the rate limit, pass after pass until a listing brings no key it had not seen. It ends
// the migration done, or failed with the error; a stop (a reload that took the migration
// out, or shutdown) just ends it.
func (m *Migration) run(ctx context.Context) {
	l := lister{
		old: m.old, moves: m.opts.Moves, countStaying: true, total: &m.total,
		copy: func(ctx context.Context, batch [][]byte) error {
			if _, err := m.copyKeys(ctx, batch, false); err != nil {
				return err
			}
			if m.opts.DeleteMoved {
				// The new server has each key now (copied, or written by a client, whose
				// write deleted it here already): the old copy can only be stale later.
				return m.old.deleteAll(ctx, batch)
			}
			return nil
		},
		progress: func() {
			m.opts.Logger.Info("migration progress", "pool", m.opts.Pool, "server", m.opts.Name,
				"keys_copied", m.copied.Load(), "keys_listed", m.total.Load())
		},
		missed: func(pass int, keys int64) {
			m.opts.Logger.Info("migration: a later listing found keys the first had missed", "pool", m.opts.Pool, "server", m.opts.Name, "pass", pass, "keys", keys)
		},
	}
	err := l.run(ctx, copyLimiter(m.opts.Rate)) // one limiter for every pass: Rate bounds the whole copy
	if ctx.Err() != nil {
		// Stopped (a revert, a later reshard, shutdown): the copy copies nothing more.
		m.opts.Logger.Info("migration copy stopped before its end", "pool", m.opts.Pool, "server", m.opts.Name,
			"from", m.opts.From, "to", m.opts.To, "keys_copied", m.copied.Load())
		return
	}
	if err != nil {
		m.finish(Failed, err)
		return
	}
	m.finish(Done, nil)
}

// lister lists a server's keys pass after pass (see maxPasses) and hands those that move to
// copy, in batches of the limiter's burst at its rate: the background copy of a migration
// and of a rebuild.
type lister struct {
	old          *oldServer
	moves        func(key []byte) bool // the keys to copy; nil: every key
	countStaying bool                  // total counts every key listed, not only those that move
	total        *atomic.Int64         // keys listed (that move, unless countStaying)
	copy         func(ctx context.Context, batch [][]byte) error
	progress     func()                     // every 5 s of copying
	missed       func(pass int, keys int64) // a later pass found keys the earlier ones had not
}

// run lists until quietPasses passes in a row find no key not seen before (or maxPasses),
// and on while a pass left keys for the next (deferred).
func (l *lister) run(ctx context.Context, limit *rate.Limiter) error {
	// The keys listed so far, by hash: 8 bytes a key, whatever the keys' length.
	seen := make(map[uint64]struct{})
	quiet := 0
	for pass := 1; pass <= maxPasses && quiet < quietPasses; pass++ {
		fresh, deferred, err := l.pass(ctx, seen, pass, limit)
		if err != nil {
			return err
		}
		if pass > 1 && fresh > 0 && l.missed != nil {
			l.missed(pass, fresh)
		}
		switch {
		case deferred > 0:
			quiet, pass = 0, min(pass, maxPasses-1) // not a pass that counts: the next lists them
		case fresh > 0:
			quiet = 0
		default:
			quiet++
		}
	}
	return nil
}

// queuedBatches bounds the batches listed and not yet copied: up to 128 × 250 keys, a few
// MiB. Past it a pass leaves keys for the next one rather than stop reading the listing:
// memcached (1.6.18) writes its listing while holding the lock of the items' bucket, so a
// listing left unread blocks the very reads the copy waits for.
const queuedBatches = 128

// pass lists the server once (the pass-th time) and copies the keys not in seen that
// move, in batches of limit's burst at limit's rate, while the listing is read on a
// goroutine of its own; it returns how many keys were new, and how many of those it left
// for the next pass (the copy was behind).
func (l *lister) pass(ctx context.Context, seen map[uint64]struct{}, pass int, limit *rate.Limiter) (fresh, deferred int64, err error) {
	batchSize := limit.Burst()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan [][]byte, queuedBatches)
	var listErr error
	var reader sync.WaitGroup
	reader.Go(func() { // the only user of seen, fresh and deferred until Wait
		defer close(batches)
		var batch [][]byte
		send := func() {
			select {
			case batches <- batch:
			default:
				for _, k := range batch {
					delete(seen, keyhash.Sum(k))
				}
				deferred += int64(len(batch))
			}
			batch = nil
		}
		var listed int64
		now := time.Now().Unix()
		listErr = l.old.dump(ctx, func(e DumpEntry) error {
			if listed++; listed%4096 == 0 {
				now = time.Now().Unix() // not for every key: a listing is a server's every key
			}
			if l.moves != nil && !l.moves(e.Key) {
				// Stays where it is: not remembered either, since only keys that move count.
				if pass == 1 && l.countStaying {
					l.total.Add(1)
				}
				return nil
			}
			h := keyhash.Sum(e.Key)
			if _, ok := seen[h]; ok {
				return nil
			}
			seen[h] = struct{}{}
			fresh++
			l.total.Add(1)
			if e.Exp > 0 && e.Exp <= now {
				return nil // expired: nothing to move
			}
			if batch = append(batch, e.Key); len(batch) >= batchSize {
				send()
			}
			return nil
		})
		if listErr == nil && len(batch) > 0 {
			send()
		}
	})
	lastLog := time.Now()
	for batch := range batches {
		if err != nil {
			continue // drain: the reader ends once cancelled
		}
		// On the copy's ctx: a stop ends the wait at once.
		if err = limit.WaitN(ctx, len(batch)); err == nil {
			err = l.copy(ctx, batch)
		}
		if err != nil {
			cancel()
			continue
		}
		if time.Since(lastLog) >= 5*time.Second && l.progress != nil {
			lastLog = time.Now()
			l.progress()
		}
	}
	reader.Wait()
	if err == nil {
		err = listErr
	}
	// Deferred keys are listed again next pass: they count as fresh then, not now.
	l.total.Add(-deferred)
	return fresh - deferred, deferred, err
}
