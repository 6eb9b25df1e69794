package memstore

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestLRUEviction fills a store that holds exactly three items and checks that the least
// recently used one goes first, where a get counts as a use.
func TestLRUEviction(t *testing.T) {
	per := itemSize(1, 10)
	s, _ := newTestStore(3 * per)
	value := "0123456789"
	set(t, s, "a", value, 0, 0)
	set(t, s, "b", value, 0, 0)
	set(t, s, "c", value, 0, 0)
	wantHit(t, s, "a", value) // a is now the most recent; b the least
	set(t, s, "d", value, 0, 0)
	wantMiss(t, s, "b")
	wantHit(t, s, "a", value)
	wantHit(t, s, "c", value)
	wantHit(t, s, "d", value)
	set(t, s, "e", value, 0, 0) // a was read before c and d: a goes
	wantMiss(t, s, "a")
	for name, want := range map[string]string{
		"evictions":      "2",
		"curr_items":     "3",
		"bytes":          strconv.FormatInt(3*per, 10),
		"limit_maxbytes": strconv.FormatInt(3*per, 10),
		"total_items":    "5",
	} {
		if got := stat(t, s, name); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
}

// TestEvictionOnGrowth checks that a growing overwrite of the most recent item
// evicts others, not itself, and that bytes stay within the bound.
func TestEvictionOnGrowth(t *testing.T) {
	s, _ := newTestStore(3 * itemSize(1, 10))
	set(t, s, "a", "0123456789", 0, 0)
	set(t, s, "b", "0123456789", 0, 0)
	set(t, s, "c", "0123456789", 0, 0)
	big := "0123456789012345678901234567890123456789"
	set(t, s, "c", big, 0, 0)
	wantMiss(t, s, "a")
	wantHit(t, s, "c", big)
	wantHit(t, s, "b", "0123456789")
	if got, _ := strconv.ParseInt(stat(t, s, "bytes"), 10, 64); got > 3*itemSize(1, 10) {
		t.Errorf("bytes %d over the bound %d", got, 3*itemSize(1, 10))
	}
}

// TestExpiredReclaimedNotEvicted checks that an expired item at the cold end makes room
// without counting as an eviction.
func TestExpiredReclaimedNotEvicted(t *testing.T) {
	s, c := newTestStore(2 * itemSize(1, 1))
	set(t, s, "a", "1", 0, 5)
	set(t, s, "b", "2", 0, 0)
	c.advance(5 * time.Second)
	set(t, s, "c", "3", 0, 0)
	wantHit(t, s, "b", "2")
	wantHit(t, s, "c", "3")
	if got := stat(t, s, "evictions"); got != "0" {
		t.Errorf("evictions %s, want 0", got)
	}
	if got := stat(t, s, "reclaimed"); got != "1" {
		t.Errorf("reclaimed %s, want 1", got)
	}
}

func TestStats(t *testing.T) {
	s, _ := newTestStore(0)
	set(t, s, "a", "1", 0, 0)
	get(t, s, "a")
	get(t, s, "b")
	do(t, s, protocol.Request{Op: protocol.OpDelete, Key: []byte("a")})
	do(t, s, protocol.Request{Op: protocol.OpIncr, Key: []byte("a"), Delta: 1})
	r := do(t, s, protocol.Request{Op: protocol.OpStats})
	got := map[string]string{}
	for _, st := range r.Stats {
		got[st.Name] = st.Value
	}
	for name, want := range map[string]string{
		"cmd_get": "2", "cmd_set": "1", "get_hits": "1", "get_misses": "1",
		"delete_hits": "1", "incr_misses": "1", "curr_items": "0", "bytes": "0",
		"total_items": "1", "limit_maxbytes": strconv.Itoa(DefaultMaxBytes), "evictions": "0",
	} {
		if got[name] != want {
			t.Errorf("%s = %q, want %q", name, got[name], want)
		}
	}
}

// TestConcurrent drives one store from several goroutines (run it with -race); the incr
// total proves no update was lost.
func TestConcurrent(t *testing.T) {
	s := New(Options{MaxBytes: 1 << 20})
	const workers, rounds = 8, 500
	counter := []byte("counter")
	do(t, s, protocol.Request{Op: protocol.OpSet, Key: counter, Value: []byte("0")})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			resps := make([]protocol.Response, 2)
			for i := range rounds {
				key := []byte(fmt.Sprintf("k%d", (w*rounds+i)%97))
				reqs := []protocol.Request{
					{Op: protocol.OpSet, Key: key, Value: []byte("v")},
					{Op: protocol.OpGet, Keys: [][]byte{key, counter}},
					{Op: protocol.OpAppend, Key: key, Value: []byte("x")},
					{Op: protocol.OpIncr, Key: counter, Delta: 1},
					{Op: protocol.OpDelete, Key: key},
				}
				for j := range reqs {
					if err := pool.Do(t.Context(), s, nil, &reqs[j], resps); err != nil {
						t.Error(err)
						return
					}
				}
				if i%100 == 0 {
					s.Stats()
				}
			}
		})
	}
	wg.Wait()
	wantHit(t, s, "counter", strconv.Itoa(workers*rounds))
}

func TestGetHitAllocs(t *testing.T) {
	s, _ := newTestStore(0)
	set(t, s, "key", "value", 0, 0)
	req := protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte("key")}}
	resps := make([]protocol.Response, 1)
	allocs := fewestAllocs(func() {
		pool.Do(t.Context(), s, nil, &req, resps)
	})
	if resps[0].Status != protocol.StatusOK {
		t.Fatalf("status %v", resps[0].Status)
	}
	if allocs != 0 {
		t.Errorf("get hit: %v allocs/op, want 0", allocs)
	}
}

func TestSetOverwriteAllocs(t *testing.T) {
	s, _ := newTestStore(0)
	req := protocol.Request{Op: protocol.OpSet, Key: []byte("key"), Value: []byte("value")}
	resps := make([]protocol.Response, 1)
	allocs := fewestAllocs(func() {
		pool.Do(t.Context(), s, nil, &req, resps)
	})
	// The value must be copied, and nothing else.
	if allocs != 1 {
		t.Errorf("set over an existing key: %v allocs/op, want 1", allocs)
	}
}

// fewestAllocs is the fewest allocations per run of f over 3 measurements: a measurement
// counts the whole process's, and on a loaded machine what else runs meanwhile (a
// collection emptying the pools pool.Do takes its waiters from) may add to one of them;
// an allocation of f's own is in every one.
func fewestAllocs(f func()) float64 {
	fewest := testing.AllocsPerRun(100, f)
	for range 2 {
		fewest = min(fewest, testing.AllocsPerRun(100, f))
	}
	return fewest
}
