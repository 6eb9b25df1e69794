// Package servertest holds the tests every pool.Server passes (its _test files) and the
// small servers and helpers the packages that wrap servers test with.
package servertest

import (
	"bytes"
	"context"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/moxi-proxy/moxi/internal/failover"
	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// Downable is an embedded store whose health the test sets (Down), which counts the runs
// started on it.
type Downable struct {
	*memstore.Store
	Down    atomic.Bool
	Started atomic.Int32
}

// NewDownable is an empty, up Downable.
func NewDownable() *Downable { return &Downable{Store: memstore.New(memstore.Options{})} }

func (s *Downable) Up() bool { return !s.Down.Load() }

func (s *Downable) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	s.Started.Add(1)
	s.Store.Start(ctx, order, reqs, resps, errs, done)
}

// Has reports whether s answers a get of key with a hit.
func Has(s pool.Server, key string) bool {
	var r [1]protocol.Response
	_ = pool.Do(context.Background(), s, nil, &protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte(key)}}, r[:])
	return r[0].Status == protocol.StatusOK
}

// Set sets key on s, failing t unless s stores it.
func Set(t testing.TB, s pool.Server, key string) {
	t.Helper()
	var r [1]protocol.Response
	if err := pool.Do(context.Background(), s, nil, &protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte("v")}, r[:]); err != nil || r[0].Status != protocol.StatusOK {
		t.Fatalf("set %s: %v %+v", key, err, r[0])
	}
}

// GoroutineID is the calling goroutine's number, from its stack's first line: whether a
// server answered on the caller's goroutine (no goroutine waited) or another.
func GoroutineID() string {
	var buf [64]byte
	line := buf[:runtime.Stack(buf[:], false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(line, []byte("goroutine ")), []byte(" "))
	return string(id)
}

// StandIns is a failover.StandIns remembering at most max keys, closed with t.
func StandIns(t testing.TB, max int) *failover.StandIns {
	l := failover.NewStandIns(max, nil)
	t.Cleanup(l.Close)
	return l
}
