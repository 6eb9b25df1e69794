package failover_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/servertest"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// TestStandInsBoundAndCleanup: with memory for 2 keys, a third stand-in write is counted as
// forgotten; when the owner is up again it does not serve until the remembered keys are
// deleted on it and on the stand-in, and the forgotten key's copies stay (failover_ttl is
// their bound).
func TestStandInsBoundAndCleanup(t *testing.T) {
	a := servertest.NewDownable()
	b := servertest.NewDownable()
	standIns := servertest.StandIns(t, 2)
	pl := failoverPool(t, standIns, time.Minute,
		pool.Member{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
		pool.Member{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
	)
	var keys []string // owned by a
	for i := 0; len(keys) < 3; i++ {
		if k := fmt.Sprintf("k%d", i); pl.Owner([]byte(k)) == 0 {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		servertest.Set(t, a, k) // the values a keeps while it is unreachable
	}
	a.Down.Store(true)
	for _, k := range keys {
		if i := pl.Locate([]byte(k)); i != 1 {
			t.Fatalf("%s placed on %d; want the stand-in b", k, i)
		}
		servertest.Set(t, pl.Member(1).Server, k) // a stand-in write: remembered, when there is room
		if !servertest.Has(b, k) {
			t.Fatalf("the stand-in write of %s did not reach b", k)
		}
	}
	if r, f := standIns.Remembered(), standIns.Forgotten(); r != 2 || f != 1 {
		t.Fatalf("remembered %d, forgotten %d; want 2 and 1", r, f)
	}

	a.Down.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for pl.Locate([]byte(keys[0])) != 0 { // the first placement starts the cleanup
		if time.Now().After(deadline) {
			t.Fatal("a does not serve again")
		}
		<-time.After(time.Millisecond) // polling
	}
	for _, k := range keys[:2] {
		if servertest.Has(a, k) || servertest.Has(b, k) {
			t.Errorf("%s still on a (%v) or b (%v) after the cleanup", k, servertest.Has(a, k), servertest.Has(b, k))
		}
	}
	if !servertest.Has(a, keys[2]) || !servertest.Has(b, keys[2]) {
		t.Errorf("the forgotten key %s was deleted; nothing remembered it", keys[2])
	}
	if r := standIns.Remembered(); r != 0 {
		t.Errorf("remembered %d after the cleanup", r)
	}
}

// start starts reqs on s and waits for their answers; inline reports whether s answered
// them on the caller's goroutine, before Start returned: no goroutine waited for them.
func start(s pool.Server, order *turn.Turn, reqs ...protocol.Request) (resps []protocol.Response, inline bool) {
	resps = make([]protocol.Response, len(reqs))
	answered := make(chan bool, 1)
	caller := servertest.GoroutineID()
	s.Start(context.Background(), order, reqs, resps, make([]error, len(reqs)), func() { answered <- servertest.GoroutineID() == caller })
	return resps, <-answered
}

// TestStandInStarts: a member of a failover pool passes on what holds no write it stands in
// for, answered where its server answers it (an embedded store: at once, no goroutine
// waiting); a run with a write it stands in for, which it must remember, is executed one
// request after the other on a goroutine of its own.
func TestStandInStarts(t *testing.T) {
	a := servertest.NewDownable()
	b := servertest.NewDownable()
	pl := failoverPool(t, servertest.StandIns(t, 10), 0,
		pool.Member{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
		pool.Member{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
	)
	var ofA, ofB []byte
	for i := 0; ofA == nil || ofB == nil; i++ {
		k := []byte(fmt.Sprintf("k%d", i))
		if pl.Owner(k) == 0 {
			ofA = k
		} else {
			ofB = k
		}
	}
	a.Down.Store(true)
	write := func(k []byte) protocol.Request {
		return protocol.Request{Op: protocol.OpSet, Key: k, Value: []byte("v")}
	}
	if _, inline := start(pl.Member(1).Server, nil, write(ofB), protocol.Request{Op: protocol.OpGet, Keys: [][]byte{ofA}}); !inline || b.Started.Load() != 1 {
		t.Errorf("a run of its own key's write and a read: answered inline %v, started on its server %d times", inline, b.Started.Load())
	}
	if _, inline := start(pl.Member(1).Server, nil, write(ofB), write(ofA)); inline || b.Started.Load() != 3 || !servertest.Has(b, string(ofA)) {
		t.Errorf("a run with a write it stands in for: answered inline %v, started on its server %d times in all", inline, b.Started.Load())
	}
}

// counting is a server composed around a member's stand-in, as package route's features
// are: it counts the requests that pass it.
type counting struct {
	pool.Server
	n atomic.Int32
}

func (c *counting) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	c.n.Add(int32(len(reqs)))
	c.Server.Start(ctx, order, reqs, resps, errs, done)
}

// TestStandInPlacesAnewBelowFeatures: a write that reached a stand-in after its owner came
// back is placed anew on the owner's stand-in — below the features composed around it (a
// backup, a shadow), which the write has passed already on its way to the stand-in.
func TestStandInPlacesAnewBelowFeatures(t *testing.T) {
	a := servertest.NewDownable()
	b := servertest.NewDownable()
	pl := failoverPool(t, servertest.StandIns(t, 10), time.Minute,
		pool.Member{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
		pool.Member{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
	)
	features := [2]*counting{{Server: pl.Member(0).Server}, {Server: pl.Member(1).Server}}
	pl.Member(0).Server, pl.Member(1).Server = features[0], features[1]
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("k%d", i); pl.Owner([]byte(k)) == 0 {
			key = k
		}
	}
	// a is up: the write, placed on b while a was down, finds it back and goes to a.
	servertest.Set(t, pl.Member(1).Server, key)
	if !servertest.Has(a, key) || servertest.Has(b, key) {
		t.Fatalf("%s: on a %v, on b %v; want a alone", key, servertest.Has(a, key), servertest.Has(b, key))
	}
	if n0, n1 := features[0].n.Load(), features[1].n.Load(); n0 != 0 || n1 != 1 {
		t.Errorf("the write passed the features of a %d times and of b %d; want 0 and 1", n0, n1)
	}
}
