// Package fireforget writes in the background: a request is queued, its client answered at
// once, and workers send it on, two writes of one key in the order they were queued.
package fireforget

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// ErrClosed is returned by Enqueue after Close.
var ErrClosed = errors.New("fire-and-forget queue closed")

// Write sends one queued request to its server and reports whether it was stored; an error
// means it was not (no answer, or an answer other than success).
type Write func(ctx context.Context, req *protocol.Request) error

// Queue is a queue of writes, bounded in writes and in bytes, and the workers that drain
// it. Safe for concurrent use.
type Queue struct {
	write  Write
	logger *slog.Logger
	shards []chan *protocol.Request // a key always goes to the same shard: its writes stay in order

	// A write holds one of items and its weight of bytes from Enqueue until it is written,
	// so the bounds cover the copies being written as well as those waiting.
	items, bytes       *semaphore.Weighted // max_pending; max_pending_bytes, of keys and values
	maxItems, maxBytes int64
	pending            atomic.Int64 // writes queued or being written

	start  sync.Once      // the workers start with the first write: an unused queue costs nothing
	mu     sync.RWMutex   // closed and sends on shards; held for reading while enqueuing
	closed bool           // guarded by mu
	wg     sync.WaitGroup // the workers

	written, failed atomic.Uint64
	lastLog         atomic.Int64 // unix nanos of the last failure log line
}

// New starts workers that drain a queue of at most maxPending writes and maxPendingBytes
// of their keys and values with write.
func New(workers, maxPending, maxPendingBytes int, write Write, logger *slog.Logger) *Queue {
	return &Queue{
		write:    write,
		logger:   logger,
		shards:   make([]chan *protocol.Request, workers),
		items:    semaphore.NewWeighted(int64(maxPending)),
		bytes:    semaphore.NewWeighted(int64(maxPendingBytes)),
		maxItems: int64(maxPending),
		maxBytes: int64(maxPendingBytes),
	}
}

// startWorkers makes the shards and starts one worker each; called once, under mu.
func (q *Queue) startWorkers() {
	for i := range q.shards {
		// The semaphores bound the total; a shard holds its share, and a skewed key waits
		// for its worker (back-pressure) rather than every shard reserving max_pending.
		q.shards[i] = make(chan *protocol.Request, q.maxItems/int64(len(q.shards))+1)
		q.wg.Add(1)
		go q.work(q.shards[i])
	}
}

// Enqueue copies req and queues it. Past max_pending writes or max_pending_bytes it waits
// for room (back-pressure) until ctx ends; a write larger than max_pending_bytes waits for
// an empty queue.
func (q *Queue) Enqueue(ctx context.Context, req *protocol.Request) error {
	w := q.weight(req)
	if err := q.items.Acquire(ctx, 1); err != nil {
		return err
	}
	if err := q.bytes.Acquire(ctx, w); err != nil {
		q.items.Release(1)
		return err
	}
	q.pending.Add(1)
	cp := &protocol.Request{
		Op:      req.Op,
		Key:     append([]byte(nil), req.Key...),
		Value:   append([]byte(nil), req.Value...),
		Flags:   req.Flags,
		Exptime: req.Exptime,
		Cas:     req.Cas,
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		q.release(cp)
		return ErrClosed
	}
	q.start.Do(q.startWorkers)
	select {
	case q.shards[shard(cp.Key, len(q.shards))] <- cp:
		return nil
	case <-ctx.Done():
		q.release(cp)
		return ctx.Err()
	}
}

// weight is what req holds of max_pending_bytes: its key and value, clamped to the bound so
// that a lone larger write still passes.
func (q *Queue) weight(req *protocol.Request) int64 {
	return min(int64(len(req.Key)+len(req.Value)), q.maxBytes)
}

// release gives back what a write held, once written or abandoned.
func (q *Queue) release(req *protocol.Request) {
	q.pending.Add(-1)
	q.bytes.Release(q.weight(req))
	q.items.Release(1)
}

// Pending is the number of writes queued or being written.
func (q *Queue) Pending() int { return int(q.pending.Load()) }

// Counts are the writes done and failed so far.
func (q *Queue) Counts() (written, failed uint64) { return q.written.Load(), q.failed.Load() }

// Close stops accepting writes and waits until the queued ones are written, or ctx ends:
// then the rest are abandoned (and counted as failed) and Close returns ctx's error.
func (q *Queue) Close(ctx context.Context) error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		for _, s := range q.shards {
			if s != nil { // nil when no write ever came
				close(s)
			}
		}
	}
	q.mu.Unlock()
	done := make(chan struct{})
	go func() { q.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// maxBatch is how many queued writes a worker takes at once.
const maxBatch = 256

// work writes one shard's requests until the shard is closed and empty. It takes what has
// queued up (up to maxBatch) and writes it in waves: a wave holds the first write of every
// key in the batch, sent all at once, then the next wave the second writes, and so on. So
// a slow link costs one round trip per wave, not per write, and one key's writes still
// land in the order they were queued.
func (q *Queue) work(shard <-chan *protocol.Request) {
	defer q.wg.Done()
	batch := make([]*protocol.Request, 0, maxBatch)
	for req := range shard {
		batch = append(batch[:0], req)
	drain:
		for len(batch) < maxBatch {
			select {
			case r, ok := <-shard:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		q.writeWaves(batch)
	}
}

func (q *Queue) writeWaves(batch []*protocol.Request) {
	seen := make(map[string]bool, len(batch))
	for len(batch) > 0 {
		clear(seen)
		var wave, rest []*protocol.Request
		for _, r := range batch {
			if seen[string(r.Key)] {
				rest = append(rest, r)
				continue
			}
			seen[string(r.Key)] = true
			wave = append(wave, r)
		}
		var wg sync.WaitGroup
		for _, r := range wave {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q.writeOne(r)
			}()
		}
		wg.Wait()
		batch = rest
	}
}

func (q *Queue) writeOne(req *protocol.Request) {
	if err := q.write(context.Background(), req); err != nil {
		q.failed.Add(1)
		q.logFailure(req, err)
	} else {
		q.written.Add(1)
	}
	q.release(req)
}

// logFailure logs at most one line a second, with the count so far.
func (q *Queue) logFailure(req *protocol.Request, err error) {
	now := time.Now().UnixNano()
	last := q.lastLog.Load()
	if now-last < int64(time.Second) || !q.lastLog.CompareAndSwap(last, now) {
		return
	}
	q.logger.Warn("fire-and-forget write failed", "key", string(req.Key), "err", err, "failed_total", q.failed.Load())
}

func shard(key []byte, n int) int {
	h := fnv.New32a()
	h.Write(key)
	return int(h.Sum32() % uint32(n))
}
