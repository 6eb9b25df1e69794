package migrate

import (
	"context"
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
	// The keys listed so far, by hash: 8 bytes a key, whatever the keys' length.
	seen := make(map[uint64]struct{})
	limit := copyLimiter(m.opts.Rate) // shared by the passes: Rate bounds the whole copy
	var err error
	quiet := 0
	for pass := 1; pass <= maxPasses && err == nil && quiet < quietPasses; pass++ {
		var fresh int64
		fresh, err = m.pass(ctx, seen, pass, limit)
		if pass > 1 && fresh > 0 {
			m.opts.Logger.Info("migration: a later listing found keys the first had missed", "pool", m.opts.Pool, "server", m.opts.Name, "pass", pass, "keys", fresh)
		}
		if quiet = quiet + 1; fresh > 0 {
			quiet = 0
		}
	}
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

// pass lists the old server once (the pass-th time) and copies the keys not in seen that
// move, adding them to it, in batches of limit's burst at limit's rate; it returns how many
// keys were new.
func (m *Migration) pass(ctx context.Context, seen map[uint64]struct{}, pass int, limit *rate.Limiter) (int64, error) {
	batchSize := limit.Burst()
	var batch [][]byte
	lastLog := time.Now()
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		// On the copy's ctx: a stop ends the wait at once.
		if err := limit.WaitN(ctx, len(batch)); err != nil {
			return err
		}
		if _, err := m.copyKeys(ctx, batch, false); err != nil {
			return err
		}
		if m.opts.DeleteMoved {
			// The new server has each key now (copied, or written by a client, whose
			// write deleted it here already): the old copy can only be stale later.
			if err := m.old.deleteAll(ctx, batch); err != nil {
				return err
			}
		}
		batch = batch[:0]
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			m.opts.Logger.Info("migration progress", "pool", m.opts.Pool, "server", m.opts.Name,
				"keys_copied", m.copied.Load(), "keys_listed", m.total.Load())
		}
		return nil
	}
	var fresh, listed int64
	now := time.Now().Unix()
	err := m.old.dump(ctx, func(e DumpEntry) error {
		if listed++; listed%4096 == 0 {
			now = time.Now().Unix() // not for every key: a listing is a server's every key
		}
		if m.opts.Moves != nil && !m.opts.Moves(e.Key) {
			// Stays where it is: not remembered either, since only keys that move count.
			if pass == 1 {
				m.total.Add(1)
			}
			return nil
		}
		h := keyhash.Sum(e.Key)
		if _, ok := seen[h]; ok {
			return nil
		}
		seen[h] = struct{}{}
		fresh++
		m.total.Add(1)
		if e.Exp > 0 && e.Exp <= now {
			return nil // expired: nothing to move
		}
		batch = append(batch, e.Key)
		if len(batch) >= batchSize {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	return fresh, err
}
