package bgqueue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sync/semaphore"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a Handler that records the values it was handed, in order, per key.
type recorder struct {
	mu   sync.Mutex
	seen map[string][]string
	gate chan struct{} // when non-nil, each request waits for it to close, or for ctx
	errs int           // requests handed on with their context ended
}

func (r *recorder) handle(ctx context.Context, req *protocol.Request, _ struct{}) {
	if r.gate != nil {
		select {
		case <-r.gate:
		case <-ctx.Done():
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Err() != nil {
		r.errs++
		return
	}
	if r.seen == nil {
		r.seen = map[string][]string{}
	}
	r.seen[string(req.Key)] = append(r.seen[string(req.Key)], string(req.Value))
}

func set(key, value string) *protocol.Request {
	return &protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte(value)}
}

func TestInOrderPerKey(t *testing.T) {
	for _, batch := range []int{1, 256} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			r := &recorder{}
			q := New(Options{Workers: 4, MaxItems: 100, MaxBytes: 1 << 20, Batch: batch}, r.handle)
			for i := range 1000 {
				req := set(fmt.Sprintf("k%d", i%7), fmt.Sprint(i))
				if err := q.Enqueue(context.Background(), req, struct{}{}); err != nil {
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
					if _, err := fmt.Sscan(v, &n); err != nil {
						t.Fatalf("key %s: value %q was not the queue's copy", k, v)
					}
					if n <= last {
						t.Fatalf("key %s: request %d handled after %d", k, n, last)
					}
					last = n
				}
			}
			if total != 1000 || q.Pending() != 0 {
				t.Fatalf("%d handled, %d pending; want 1000, 0", total, q.Pending())
			}
		})
	}
}

// TestBounds: past MaxItems requests or MaxBytes, Enqueue waits for room and TryEnqueue
// drops; a request larger than MaxBytes waits for an empty queue, or is dropped.
func TestBounds(t *testing.T) {
	const maxBytes = 100 // each request's key "k" is 1 byte; Data counts key and value
	tests := []struct {
		name   string
		queued []int // the value sizes of the requests queued (and held) first
		next   int   // the value size of the request then
		full   bool  // whether the queue has no room for it
		tryFit bool  // TryEnqueue's answer differs: it fits (never: it is dropped)
	}{
		{name: "up to the bound", queued: []int{39, 39}, next: 19},
		{name: "past the bound", queued: []int{39, 39}, next: 20, full: true},
		{name: "past max items", queued: []int{0, 0, 0}, next: 0, full: true},
		{name: "a lone larger request", next: 1000},
		{name: "a larger request behind another", queued: []int{0}, next: 1000, full: true},
		{name: "any behind a larger request", queued: []int{1000}, next: 0, full: true},
	}
	for _, tt := range tests {
		for _, try := range []bool{false, true} {
			name := tt.name + ", Enqueue"
			if try {
				name = tt.name + ", TryEnqueue"
			}
			t.Run(name, func(t *testing.T) {
				r := &recorder{gate: make(chan struct{})}
				q := New(Options{Workers: 1, MaxItems: 3, MaxBytes: maxBytes}, r.handle) // its shard holds 4: only the bounds bind
				for _, n := range tt.queued {
					if err := q.Enqueue(context.Background(), set("k", strings.Repeat("v", n)), struct{}{}); err != nil {
						t.Fatal(err)
					}
				}
				next := set("k", strings.Repeat("v", tt.next))
				var queued bool
				if try {
					queued = q.TryEnqueue(next, struct{}{})
					// A request larger than MaxBytes never fits in whole: dropped.
					if tt.next+1 > maxBytes {
						tt.full = true
					}
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
					defer cancel()
					err := q.Enqueue(ctx, next, struct{}{})
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						t.Fatal(err)
					}
					queued = err == nil
				}
				if queued == tt.full {
					t.Fatalf("queued: %v; want %v", queued, !tt.full)
				}
				want := len(tt.queued)
				if queued {
					want++
				}
				if q.Pending() != want {
					t.Errorf("pending %d, want %d", q.Pending(), want)
				}
				close(r.gate)
				if err := q.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				if n := len(r.seen["k"]); n != want || q.Pending() != 0 {
					t.Errorf("%d handled, %d pending after Close; want %d, 0", n, q.Pending(), want)
				}
			})
		}
	}
}

// TestSharedBytes: two queues that share a budget drop past it together, and every
// request gives its bytes back once handled.
func TestSharedBytes(t *testing.T) {
	const size = 1000
	budget := semaphore.NewWeighted(3 * (256 + size + 1)) // three copies, with Memory
	gate := make(chan struct{})
	var queues []*Queue[struct{}]
	for range 2 {
		r := &recorder{gate: gate}
		queues = append(queues, New(Options{Workers: 2, MaxItems: 100, MaxBytes: 3 * (256 + size + 1), Bytes: budget, Measure: Memory}, r.handle))
	}
	var queued int
	for i := range 10 {
		if queues[i%2].TryEnqueue(set("k", strings.Repeat("v", size)), struct{}{}) {
			queued++
		}
	}
	if queued != 3 {
		t.Errorf("%d of 10 queued, want the 3 that fit", queued)
	}
	close(gate)
	for _, q := range queues {
		if err := q.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if !budget.TryAcquire(3 * (256 + size + 1)) {
		t.Error("the budget was not given back whole")
	}
}

func TestClose(t *testing.T) {
	r := &recorder{}
	q := New(Options{Workers: 1, MaxItems: 10, MaxBytes: 1 << 20}, r.handle)
	if err := q.Close(context.Background()); err != nil { // no request ever came
		t.Fatal(err)
	}
	if err := q.Enqueue(context.Background(), set("k", "v"), struct{}{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Enqueue after Close: %v", err)
	}
	if q.TryEnqueue(set("k", "v"), struct{}{}) {
		t.Fatal("TryEnqueue after Close queued")
	}

	// A stuck handler: Close gives up when its context ends, and the handlers' context
	// ends with it, so that they fail at once and the workers exit.
	stuck := &recorder{gate: make(chan struct{})}
	q = New(Options{Workers: 1, MaxItems: 10, MaxBytes: 1 << 20}, stuck.handle)
	for range 5 {
		if err := q.Enqueue(context.Background(), set("k", "v"), struct{}{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := q.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a stuck handler: %v, want its context's error", err)
	}
	if stuck.errs != 5 || q.Pending() != 0 {
		t.Fatalf("%d requests handed on cancelled, %d pending; want 5, 0", stuck.errs, q.Pending())
	}
}

func TestCopyOwnsItsBytes(t *testing.T) {
	req := &protocol.Request{
		Op: protocol.OpMetaSet, Key: []byte("k"), Value: []byte("value"), NoReply: true, Opaque: 7,
		Meta: protocol.MetaRequest{KeyToken: []byte("k"), Quiet: true, Flags: []protocol.MetaFlag{
			{Letter: 'q'}, {Letter: 'T', Token: []byte("30")},
		}},
	}
	c := CopyRequest(req)
	for _, b := range [][]byte{req.Key, req.Value, req.Meta.KeyToken, req.Meta.Flags[1].Token} {
		b[0] = 'X' // the client's buffer is reused
	}
	if string(c.Key) != "k" || string(c.Value) != "value" || string(c.Meta.KeyToken) != "k" {
		t.Errorf("copy = %q %q %q", c.Key, c.Value, c.Meta.KeyToken)
	}
	if len(c.Meta.Flags) != 1 || c.Meta.Flags[0].Letter != 'T' || string(c.Meta.Flags[0].Token) != "30" || c.Meta.Quiet || c.NoReply || c.Opaque != 0 {
		t.Errorf("copy asks for no answer, or is not the server's: %+v", c)
	}

	get := &protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte("a"), []byte("b")}}
	c = CopyRequest(get)
	get.Keys[1][0] = 'X'
	if len(c.Keys) != 2 || string(c.Keys[1]) != "b" {
		t.Errorf("copy's keys = %q", c.Keys)
	}
}

func BenchmarkTryEnqueue(b *testing.B) {
	q := New(Options{Workers: 8, MaxItems: 1024, MaxBytes: 1 << 30}, func(context.Context, *protocol.Request, struct{}) {})
	defer q.Close(context.Background())
	req := set("user:1234", strings.Repeat("v", 100))
	b.ReportAllocs()
	for b.Loop() {
		q.TryEnqueue(req, struct{}{})
	}
}
