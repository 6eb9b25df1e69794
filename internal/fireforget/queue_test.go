package fireforget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a Write that records what it was asked, in order, per key.
type recorder struct {
	mu   sync.Mutex
	seen map[string][]string
	gate chan struct{} // when non-nil, each write waits for a token
	fail bool
}

func (r *recorder) write(ctx context.Context, req *protocol.Request) error {
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string][]string{}
	}
	r.seen[string(req.Key)] = append(r.seen[string(req.Key)], string(req.Value))
	if r.fail {
		return errors.New("server said no")
	}
	return nil
}

func set(key, value string) *protocol.Request {
	return &protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte(value)}
}

func TestAllWrittenInOrderPerKey(t *testing.T) {
	r := &recorder{}
	q := New(4, 100, 1<<20, r.write, slog.New(slog.DiscardHandler))
	for i := range 1000 {
		req := set(fmt.Sprintf("k%d", i%7), fmt.Sprint(i))
		if err := q.Enqueue(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		req.Value[0] = 'X' // the queue copied it: the client's buffer is reused at once
	}
	if err := q.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	total := 0
	for k, vs := range r.seen {
		total += len(vs)
		last := -1
		for _, v := range vs {
			var n int
			fmt.Sscan(v, &n)
			if n <= last {
				t.Fatalf("key %s: write %d landed after %d", k, n, last)
			}
			last = n
		}
	}
	if written, failed := q.Counts(); total != 1000 || written != 1000 || failed != 0 {
		t.Fatalf("%d writes seen, %d counted written, %d failed; want 1000", total, written, failed)
	}
}

func TestBackPressure(t *testing.T) {
	r := &recorder{gate: make(chan struct{})}
	q := New(2, 3, 1<<20, r.write, slog.New(slog.DiscardHandler))
	for i := range 3 {
		if err := q.Enqueue(context.Background(), set("k", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if q.Pending() != 3 {
		t.Fatalf("pending %d, want 3", q.Pending())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := q.Enqueue(ctx, set("k", "3")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a fourth write with max_pending 3 did not wait: %v", err)
	}
	close(r.gate) // let the writes through
	if err := q.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestByteBackPressure: past max_pending_bytes (keys and values) a write waits for room; a
// lone write larger than the bound passes when the queue is empty, and waits otherwise.
func TestByteBackPressure(t *testing.T) {
	const maxBytes = 100 // each write's key "k" is 1 byte
	tests := []struct {
		name   string
		queued []int // the value sizes of the writes queued (and held) first
		next   int   // the value size of the write then
		waits  bool
	}{
		{name: "up to the bound", queued: []int{39, 39}, next: 19},
		{name: "past the bound waits", queued: []int{39, 39}, next: 20, waits: true},
		{name: "a lone larger write passes", next: 1000},
		{name: "a larger write waits for an empty queue", queued: []int{0}, next: 1000, waits: true},
		{name: "behind a larger write any waits", queued: []int{1000}, next: 0, waits: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{gate: make(chan struct{})}
			q := New(2, 100, maxBytes, r.write, slog.New(slog.DiscardHandler))
			for _, n := range tt.queued {
				if err := q.Enqueue(context.Background(), set("k", strings.Repeat("v", n))); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			err := q.Enqueue(ctx, set("k", strings.Repeat("v", tt.next)))
			if waited := errors.Is(err, context.DeadlineExceeded); waited != tt.waits || (!waited && err != nil) {
				t.Fatalf("Enqueue: %v; want waiting: %v", err, tt.waits)
			}
			want := len(tt.queued)
			if !tt.waits {
				want++
			}
			if q.Pending() != want {
				t.Errorf("pending %d, want %d", q.Pending(), want)
			}
			close(r.gate)
			if err := q.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if written, _ := q.Counts(); written != uint64(want) || q.Pending() != 0 {
				t.Errorf("%d written, %d pending after Close; want %d, 0", written, q.Pending(), want)
			}
		})
	}
}

func TestFailuresCountedAndCloseBounded(t *testing.T) {
	r := &recorder{fail: true}
	q := New(1, 10, 1<<20, r.write, slog.New(slog.DiscardHandler))
	for range 5 {
		_ = q.Enqueue(context.Background(), set("k", "v"))
	}
	if err := q.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, failed := q.Counts(); failed != 5 {
		t.Fatalf("failed %d, want 5", failed)
	}
	if err := q.Enqueue(context.Background(), set("k", "v")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Enqueue after Close: %v", err)
	}

	stuck := &recorder{gate: make(chan struct{})}
	q = New(1, 10, 1<<20, stuck.write, slog.New(slog.DiscardHandler))
	_ = q.Enqueue(context.Background(), set("k", "v"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := q.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a stuck write: %v, want its context's error", err)
	}
	close(stuck.gate)
	_ = q.Close(context.Background()) // the worker finishes; nothing leaks
}
