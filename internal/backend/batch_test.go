package backend

import (
	"context"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestDoBatchAgainstMemcached: a batch of writes, quiet and not, gets each write's own
// answer in order — a quiet write's failure included, a quiet success as OK — with one
// system call for the batch.
func TestDoBatchAgainstMemcached(t *testing.T) {
	mc := memcachedtest.Start(t)
	s := newServer(t, mc.Addr, Options{Timeout: 2 * time.Second, Connections: 1})
	do(t, s, &protocol.Request{Op: protocol.OpSet, Key: []byte("n"), Value: []byte("5")}) // connected

	reqs := []protocol.Request{
		{Op: protocol.OpSet, Key: []byte("a"), Value: []byte("1"), Quiet: true},      // OK, quietly
		{Op: protocol.OpAdd, Key: []byte("a"), Value: []byte("2"), Quiet: true},      // NOT_STORED, though quiet
		{Op: protocol.OpAppend, Key: []byte("a"), Value: []byte("x"), NoReply: true}, // OK
		{Op: protocol.OpIncr, Key: []byte("n"), Delta: 10},                           // 15
		{Op: protocol.OpCas, Key: []byte("a"), Value: []byte("3"), NoReply: true},    // text cas 0: EXISTS
		{Op: protocol.OpCas, Key: []byte("zz"), Value: []byte("3")},                  // text cas 0: NOT_FOUND
		{Op: protocol.OpDelete, Key: []byte("missing"), Quiet: true},                 // NOT_FOUND
		{Op: protocol.OpTouch, Key: []byte("a"), Exptime: 100},                       // OK
		{Op: protocol.OpReplace, Key: []byte("a"), Value: []byte("final")},           // OK
	}
	want := []protocol.Status{
		protocol.StatusOK, protocol.StatusNotStored, protocol.StatusOK, protocol.StatusOK,
		protocol.StatusExists, protocol.StatusNotFound, protocol.StatusNotFound, protocol.StatusOK, protocol.StatusOK,
	}
	resps := make([]protocol.Response, len(reqs))
	errs := make([]error, len(reqs))
	writes := s.Info().Counters.Writes
	pool.DoBatch(context.Background(), s, nil, reqs, resps, errs)
	for i := range reqs {
		if errs[i] != nil {
			t.Fatalf("%d %s: %v", i, reqs[i].Op, errs[i])
		}
		if resps[i].Status != want[i] {
			t.Errorf("%d %s %s: status %d, want %d", i, reqs[i].Op, reqs[i].Key, resps[i].Status, want[i])
		}
	}
	if resps[3].Number != 15 {
		t.Errorf("incr answered %d, want 15", resps[3].Number)
	}
	if n := s.Info().Counters.Writes - writes; n != 1 {
		t.Errorf("the batch took %d writes, want 1", n)
	}
	if got := do(t, s, &protocol.Request{Op: protocol.OpGet, Keys: keys("a")}); string(got.Value) != "final" {
		t.Errorf("a = %q after the batch, want final", got.Value)
	}
}

// TestDoBatchServerGone: a batch to a server that does not answer fails as a whole.
func TestDoBatchServerGone(t *testing.T) {
	s := newServer(t, "127.0.0.1:1", Options{Timeout: 2 * time.Second})
	reqs := []protocol.Request{{Op: protocol.OpSet, Key: []byte("a")}, {Op: protocol.OpDelete, Key: []byte("b")}}
	resps := make([]protocol.Response, 2)
	errs := make([]error, 2)
	pool.DoBatch(context.Background(), s, nil, reqs, resps, errs)
	for i, err := range errs {
		if err == nil {
			t.Errorf("write %d: no error from a server that is not there", i)
		}
	}
}
