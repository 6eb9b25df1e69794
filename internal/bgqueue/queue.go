// Package bgqueue holds copies of requests for a few background workers, bounded in
// requests and in bytes: Enqueue waits for room, TryEnqueue drops a request that finds
// none. A key's requests reach the handler in the order they were queued.
package bgqueue

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"

	"github.com/moxi-proxy/moxi/internal/keyhash"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// ErrClosed is returned by Enqueue after Close.
var ErrClosed = errors.New("queue closed")

// Measure is what a queued request counts against Options.MaxBytes.
type Measure uint8

const (
	// Data counts the bytes a request carries: its keys, value and meta tokens.
	Data Measure = iota
	// Memory counts about all the memory its copy holds: its data and its structs.
	Memory
)

// Options size a Queue.
type Options struct {
	Workers  int // how many take requests from the queue, each its share of the keys
	MaxItems int // requests queued or being handled, at most

	// MaxBytes bounds their bytes, by Measure. When Bytes is set it is a budget of MaxBytes
	// shared with other queues; nil makes the queue its own.
	MaxBytes int64
	Bytes    *semaphore.Weighted
	Measure  Measure

	// Batch is how many queued requests a worker takes at once, and hands on in waves: the
	// first request of every key in the batch at once, then the second of each, and so on.
	// A slow handler then costs a worker one wait a wave, not one a request. 0 or 1: one
	// request at a time.
	Batch int
}

// Handler handles one queued request: req is the queue's copy, valid until the handler
// returns; to is what was queued with it. ctx ends when Close gives up.
type Handler[T any] func(ctx context.Context, req *protocol.Request, to T)

// Queue is a queue of request copies and the workers that hand them to its Handler. A
// request holds one of MaxItems and its weight of MaxBytes from Enqueue until handled, so
// the bounds cover the copies being handled as well as those waiting. Safe for concurrent
// use.
type Queue[T any] struct {
	opts         Options
	handle       Handler[T]
	items, bytes *semaphore.Weighted
	pending      atomic.Int64 // requests queued or being handled

	ctx    context.Context // handed to handle; cancelled once Close is done or gives up
	cancel context.CancelFunc

	start   sync.Once      // the workers start with the first request: an unused queue costs nothing
	mu      sync.RWMutex   // held for reading while enqueuing, for writing by Close
	closed  bool           // guarded by mu
	shards  []chan *job[T] // made by start; a worker's each, by key; closed by Close
	workers sync.WaitGroup
}

// job is one queued request; it owns req's bytes.
type job[T any] struct {
	req    protocol.Request
	to     T
	weight int64
}

// New returns a queue that hands its requests to handle.
func New[T any](opts Options, handle Handler[T]) *Queue[T] {
	opts.Workers = max(opts.Workers, 1)
	opts.Batch = max(opts.Batch, 1)
	q := &Queue[T]{opts: opts, handle: handle, items: semaphore.NewWeighted(int64(opts.MaxItems)), bytes: opts.Bytes}
	if q.bytes == nil {
		q.bytes = semaphore.NewWeighted(opts.MaxBytes)
	}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	return q
}

// Enqueue copies req (its bytes are the caller's) and queues the copy with to. When the
// queue is full it waits for room (back-pressure) until ctx ends; a request larger than
// MaxBytes waits for the whole of it.
func (q *Queue[T]) Enqueue(ctx context.Context, req *protocol.Request, to T) error {
	w := min(Weight(req, q.opts.Measure), q.opts.MaxBytes)
	if err := q.items.Acquire(ctx, 1); err != nil {
		return err
	}
	if err := q.bytes.Acquire(ctx, w); err != nil {
		q.items.Release(1)
		return err
	}
	return q.put(ctx, req, to, w, true)
}

// TryEnqueue copies req and queues the copy with to when there is room at once, and
// reports whether it did: a full or closed queue drops req, and a slow handler costs the
// caller nothing.
func (q *Queue[T]) TryEnqueue(req *protocol.Request, to T) bool {
	w := Weight(req, q.opts.Measure)
	if !q.items.TryAcquire(1) {
		return false
	}
	if !q.bytes.TryAcquire(w) {
		q.items.Release(1)
		return false
	}
	return q.put(context.Background(), req, to, w, false) == nil
}

// put queues a copy of req, which holds an item and w bytes, on its key's worker's shard:
// when the shard is full, waiting for room until ctx ends, or without wait not at all.
// Unless queued, req gives them back.
func (q *Queue[T]) put(ctx context.Context, req *protocol.Request, to T, w int64, wait bool) error {
	q.pending.Add(1)
	j := &job[T]{req: CopyRequest(req), to: to, weight: w}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		q.release(j)
		return ErrClosed
	}
	q.start.Do(q.startWorkers)
	shard := q.shards[keyhash.Stripe(key(&j.req), len(q.shards))]
	if !wait {
		select {
		case shard <- j:
			return nil
		default:
			q.release(j)
			return errFull
		}
	}
	select {
	case shard <- j:
		return nil
	case <-ctx.Done():
		q.release(j)
		return ctx.Err()
	}
}

var errFull = errors.New("queue full")

// key is what orders req among the queued requests: its key, or a retrieval's first.
func key(req *protocol.Request) []byte {
	if len(req.Keys) > 0 {
		return req.Keys[0]
	}
	return req.Key
}

// startWorkers makes the shards and starts a worker for each; called once, under mu.
func (q *Queue[T]) startWorkers() {
	q.shards = make([]chan *job[T], q.opts.Workers)
	for i := range q.shards {
		// MaxItems bounds the total; a shard holds its share, so a skewed key waits for
		// (or is dropped by) its worker rather than every shard reserving MaxItems.
		q.shards[i] = make(chan *job[T], q.opts.MaxItems/q.opts.Workers+1)
		q.workers.Add(1)
		go q.work(q.shards[i]) // exits when Close has closed the shard and it is empty
	}
}

// release gives back what a request held, once handled or abandoned.
func (q *Queue[T]) release(j *job[T]) {
	q.pending.Add(-1)
	q.bytes.Release(j.weight)
	q.items.Release(1)
}

// Pending is the number of requests queued or being handled.
func (q *Queue[T]) Pending() int { return int(q.pending.Load()) }

// Close stops taking requests and waits until the workers have handled the queued ones,
// or, when ctx ends first, cancels the context the handlers were given (the rest are
// handed on with it, and fail at once), waits for the workers and returns ctx's error.
func (q *Queue[T]) Close(ctx context.Context) error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		for _, s := range q.shards { // none when no request ever came
			close(s)
		}
	}
	q.mu.Unlock()
	done := make(chan struct{})
	go func() { q.workers.Wait(); close(done) }() // exits when the workers have
	defer q.cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		q.cancel()
		<-done
		return ctx.Err()
	}
}

// work hands on one shard's requests until the shard is closed and empty, taking what has
// queued up, up to Batch, at once.
func (q *Queue[T]) work(shard <-chan *job[T]) {
	defer q.workers.Done()
	batch := make([]*job[T], 0, q.opts.Batch)
	for j := range shard {
		batch = append(batch[:0], j)
	drain:
		for len(batch) < cap(batch) {
			select {
			case j, ok := <-shard:
				if !ok {
					break drain
				}
				batch = append(batch, j)
			default:
				break drain
			}
		}
		q.handleWaves(batch)
	}
}

// handleWaves hands on batch in waves: a wave holds the first request of every key left,
// handled at once; a key's next request waits for the wave after.
func (q *Queue[T]) handleWaves(batch []*job[T]) {
	if len(batch) == 1 {
		q.handleOne(batch[0])
		return
	}
	seen := make(map[string]bool, len(batch))
	for len(batch) > 0 {
		clear(seen)
		var wave, rest []*job[T]
		for _, j := range batch {
			if seen[string(key(&j.req))] {
				rest = append(rest, j)
				continue
			}
			seen[string(key(&j.req))] = true
			wave = append(wave, j)
		}
		var wg sync.WaitGroup
		for _, j := range wave {
			wg.Go(func() { q.handleOne(j) })
		}
		wg.Wait()
		batch = rest
	}
}

func (q *Queue[T]) handleOne(j *job[T]) {
	q.handle(q.ctx, &j.req, j.to)
	q.release(j)
}
