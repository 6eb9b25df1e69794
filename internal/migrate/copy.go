package migrate

import (
	"context"
	"time"
)

// copyBatch is how many keys the background copy reads from the old server at once.
const copyBatch = 100

// run is the background copy: it lists the old server's items and copies, batch by batch,
// every one still absent on the new server and not written by a client meanwhile, within
// the rate limit. It ends the migration done, or failed with the error; a stop (a reload
// that took the migration out, or shutdown) just ends it.
func (m *Migration) run(ctx context.Context) {
	batchSize := copyBatch
	if m.opts.Rate > 0 {
		batchSize = max(1, min(copyBatch, m.opts.Rate/10)) // at least ten batches a second
	}
	var batch [][]byte
	start, lastLog := time.Now(), time.Now()
	var sent int64
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if _, err := m.copyKeys(ctx, batch); err != nil {
			return err
		}
		sent += int64(len(batch))
		batch = batch[:0]
		if m.opts.Rate > 0 { // pace: sent keys may take sent/rate seconds, no less
			due := start.Add(time.Duration(float64(sent) / float64(m.opts.Rate) * float64(time.Second)))
			select {
			case <-time.After(time.Until(due)):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			m.opts.Logger.Info("migration progress", "pool", m.opts.Pool, "server", m.opts.Name,
				"keys_copied", m.copied.Load(), "keys_listed", m.total.Load())
		}
		return nil
	}
	err := m.old.dump(ctx, func(e DumpEntry) error {
		m.total.Add(1)
		if e.Exp > 0 && e.Exp <= time.Now().Unix() {
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
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		m.finish(Failed, err)
		return
	}
	m.finish(Done, nil)
}
