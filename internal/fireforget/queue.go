// Package fireforget writes in the background: a request is queued, its client answered at
// once, and workers send it on, two writes of one key in the order they were queued.
package fireforget

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/bgqueue"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// ErrClosed is returned by Enqueue after Close.
var ErrClosed = bgqueue.ErrClosed

// Write sends one queued request to its server and reports whether it was stored; an error
// means it was not (no answer, or an answer other than success).
type Write func(ctx context.Context, req *protocol.Request) error

// Queue is a queue of writes, bounded in writes and in the bytes of their keys and values,
// and the workers that drain it. Safe for concurrent use.
type Queue struct {
	queue  *bgqueue.Queue[struct{}]
	write  Write
	logger *slog.Logger

	written, failed atomic.Uint64
	lastLog         atomic.Int64 // unix nanos of the last failure log line
}

// maxBatch is how many queued writes a worker takes at once: a slow link then costs one
// round trip per wave of them, not per write (see bgqueue.Options.Batch).
const maxBatch = 256

// New returns a queue of at most maxPending writes and maxPendingBytes of their keys and
// values, which workers drain with write.
func New(workers, maxPending, maxPendingBytes int, write Write, logger *slog.Logger) *Queue {
	q := &Queue{write: write, logger: logger}
	q.queue = bgqueue.New(bgqueue.Options{
		Workers:  workers,
		MaxItems: maxPending,
		MaxBytes: int64(maxPendingBytes),
		Measure:  bgqueue.Data,
		Batch:    maxBatch,
	}, q.writeOne)
	return q
}

// Enqueue copies req and queues it. Past max_pending writes or max_pending_bytes it waits
// for room (back-pressure) until ctx ends; a write larger than max_pending_bytes waits for
// an empty queue.
func (q *Queue) Enqueue(ctx context.Context, req *protocol.Request) error {
	return q.queue.Enqueue(ctx, req, struct{}{})
}

// Pending is the number of writes queued or being written.
func (q *Queue) Pending() int { return q.queue.Pending() }

// Counts are the writes done and failed so far.
func (q *Queue) Counts() (written, failed uint64) { return q.written.Load(), q.failed.Load() }

// Close stops accepting writes and waits until the queued ones are written, or ctx ends:
// then the writes are cancelled (and counted as failed) and Close returns ctx's error.
func (q *Queue) Close(ctx context.Context) error { return q.queue.Close(ctx) }

func (q *Queue) writeOne(ctx context.Context, req *protocol.Request, _ struct{}) {
	if err := q.write(ctx, req); err != nil {
		q.failed.Add(1)
		q.logFailure(req, err)
	} else {
		q.written.Add(1)
	}
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
