package fireforget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// The queue's mechanism (bounds, order per key, copies) is bgqueue's, tested there; these
// tests tie fireforget to it: the bounds wait, max_pending_bytes counts keys and values,
// and every write is counted.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a Write that counts what it was asked.
type recorder struct {
	mu   sync.Mutex
	n    int
	gate chan struct{} // when non-nil, each write waits for it to close, or for ctx
	fail bool
}

func (r *recorder) write(ctx context.Context, req *protocol.Request) error {
	if r.gate != nil {
		select {
		case <-r.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if r.fail {
		return errors.New("server said no")
	}
	return nil
}

func set(key, value string) *protocol.Request {
	return &protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte(value)}
}

func TestEveryWriteCounted(t *testing.T) {
	tests := []struct {
		name            string
		fail            bool
		written, failed uint64
	}{
		{name: "stored", written: 100},
		{name: "not stored", fail: true, failed: 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{fail: tt.fail}
			q := New(4, 10, 1<<20, r.write, slog.New(slog.DiscardHandler))
			for i := range 100 {
				if err := q.Enqueue(context.Background(), set(fmt.Sprint("k", i%7), "v")); err != nil {
					t.Fatal(err)
				}
			}
			if err := q.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if written, failed := q.Counts(); written != tt.written || failed != tt.failed || r.n != 100 {
				t.Fatalf("%d written, %d failed of %d sent; want %d, %d of 100", written, failed, r.n, tt.written, tt.failed)
			}
		})
	}
}

// TestWaitsPastMaxPendingBytes: the keys and values queued count against
// max_pending_bytes, and a write past it waits for room: it is never dropped.
func TestWaitsPastMaxPendingBytes(t *testing.T) {
	r := &recorder{gate: make(chan struct{})}
	q := New(1, 100, 10, r.write, slog.New(slog.DiscardHandler))
	if err := q.Enqueue(context.Background(), set("k", "123456789")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := q.Enqueue(ctx, set("k", "")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a write past max_pending_bytes did not wait: %v", err)
	}
	close(r.gate)
	if err := q.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestCloseBounded(t *testing.T) {
	stuck := &recorder{gate: make(chan struct{})}
	q := New(1, 10, 1<<20, stuck.write, slog.New(slog.DiscardHandler))
	if err := q.Enqueue(context.Background(), set("k", "v")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := q.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a stuck write: %v, want its context's error", err)
	}
	if _, failed := q.Counts(); failed != 1 {
		t.Fatalf("failed %d, want the stuck write cancelled and counted", failed)
	}
	if err := q.Enqueue(context.Background(), set("k", "v")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Enqueue after Close: %v", err)
	}
}
