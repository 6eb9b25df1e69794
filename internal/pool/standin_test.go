package pool_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// downable is an embedded store whose health the test sets.
type downable struct {
	*memstore.Store
	down atomic.Bool
}

func (s *downable) Up() bool { return !s.down.Load() }

func (s *downable) DoBatch(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
	pool.DoEach(ctx, order, s, reqs, resps, errs)
}

func has(s pool.Server, key string) bool {
	var r [1]protocol.Response
	_ = s.Do(context.Background(), nil, &protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte(key)}}, r[:])
	return r[0].Status == protocol.StatusOK
}

func set(t *testing.T, s pool.Server, key string) {
	t.Helper()
	var r [1]protocol.Response
	if err := s.Do(context.Background(), nil, &protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte("v")}, r[:]); err != nil || r[0].Status != protocol.StatusOK {
		t.Fatalf("set %s: %v %+v", key, err, r[0])
	}
}

// TestStandInsBoundAndCleanup: with memory for 2 keys, a third stand-in write is counted as
// forgotten; when the owner is up again it does not serve until the remembered keys are
// deleted on it and on the stand-in, and the forgotten key's copies stay (failover_ttl is
// their bound).
func TestStandInsBoundAndCleanup(t *testing.T) {
	a := &downable{Store: memstore.New(memstore.Options{})}
	b := &downable{Store: memstore.New(memstore.Options{})}
	standIns := newStandIns(t, 2)
	pl, err := pool.New("p", pool.Options{Failover: true, StandIns: standIns, FailoverTTL: time.Minute}, []pool.Member{
		{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
		{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
	})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string // owned by a
	for i := 0; len(keys) < 3; i++ {
		if k := fmt.Sprintf("k%d", i); pl.Owner([]byte(k)) == 0 {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		set(t, a, k) // the values a keeps while it is unreachable
	}
	a.down.Store(true)
	for _, k := range keys {
		if i := pl.Locate([]byte(k)); i != 1 {
			t.Fatalf("%s placed on %d; want the stand-in b", k, i)
		}
		set(t, pl.Member(1).Server, k) // a stand-in write: remembered, when there is room
		if !has(b, k) {
			t.Fatalf("the stand-in write of %s did not reach b", k)
		}
	}
	if r, f := standIns.Remembered(), standIns.Forgotten(); r != 2 || f != 1 {
		t.Fatalf("remembered %d, forgotten %d; want 2 and 1", r, f)
	}

	a.down.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for pl.Locate([]byte(keys[0])) != 0 { // the first placement starts the cleanup
		if time.Now().After(deadline) {
			t.Fatal("a does not serve again")
		}
		<-time.After(time.Millisecond) // polling
	}
	for _, k := range keys[:2] {
		if has(a, k) || has(b, k) {
			t.Errorf("%s still on a (%v) or b (%v) after the cleanup", k, has(a, k), has(b, k))
		}
	}
	if !has(a, keys[2]) || !has(b, keys[2]) {
		t.Errorf("the forgotten key %s was deleted; nothing remembered it", keys[2])
	}
	if r := standIns.Remembered(); r != 0 {
		t.Errorf("remembered %d after the cleanup", r)
	}
}

// startable is a server that records the batches started on it and answers them at once.
type startable struct {
	*downable
	started int
}

func (s *startable) StartBatch(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) bool {
	s.started++
	s.DoBatch(ctx, order, reqs, resps, errs)
	done()
	return true
}

// TestStandInStarts: a member of a failover pool starts what its server starts, but a
// batch holding a write it stands in for, which it must remember: it declines that one.
func TestStandInStarts(t *testing.T) {
	a := &startable{downable: &downable{Store: memstore.New(memstore.Options{})}}
	b := &startable{downable: &downable{Store: memstore.New(memstore.Options{})}}
	pl, err := pool.New("p", pool.Options{Failover: true, StandIns: newStandIns(t, 10)}, []pool.Member{
		{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
		{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ofA, ofB []byte
	for i := 0; ofA == nil || ofB == nil; i++ {
		k := []byte(fmt.Sprintf("k%d", i))
		if pl.Owner(k) == 0 {
			ofA = k
		} else {
			ofB = k
		}
	}
	a.down.Store(true)
	sb, ok := pl.Member(1).Server.(pool.Starter)
	if !ok {
		t.Fatal("the member over a Starter is not one")
	}
	start := func(reqs ...protocol.Request) bool {
		return sb.StartBatch(context.Background(), nil, reqs, make([]protocol.Response, len(reqs)), make([]error, len(reqs)), func() {})
	}
	write := func(k []byte) protocol.Request {
		return protocol.Request{Op: protocol.OpSet, Key: k, Value: []byte("v")}
	}
	if !start(write(ofB), protocol.Request{Op: protocol.OpGet, Keys: [][]byte{ofA}}) || b.started != 1 {
		t.Error("a batch of its own key's write and a read was not started")
	}
	if start(write(ofB), write(ofA)) || b.started != 1 {
		t.Error("a batch with a write it stands in for was started")
	}
}

// counting is a server composed around a member after the pool was built, as package
// route composes a pool's features: it counts the requests that pass it.
type counting struct {
	pool.Server
	n atomic.Int32
}

func (c *counting) Do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	c.n.Add(1)
	return c.Server.Do(ctx, order, req, resps)
}

// TestStandInPlacesAnewBelowFeatures: a write that reached a stand-in after its owner came
// back is placed anew on the owner — below the features composed around the members (a
// backup, a shadow), which the write has passed already on its way to the stand-in.
func TestStandInPlacesAnewBelowFeatures(t *testing.T) {
	a := &downable{Store: memstore.New(memstore.Options{})}
	b := &downable{Store: memstore.New(memstore.Options{})}
	pl, err := pool.New("p", pool.Options{Failover: true, StandIns: newStandIns(t, 10), FailoverTTL: time.Minute}, []pool.Member{
		{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
		{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
	})
	if err != nil {
		t.Fatal(err)
	}
	features := [2]*counting{{Server: pl.Member(0).Server}, {Server: pl.Member(1).Server}}
	pl.Member(0).Server, pl.Member(1).Server = features[0], features[1]
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("k%d", i); pl.Owner([]byte(k)) == 0 {
			key = k
		}
	}
	// a is up: the write, placed on b while a was down, finds it back and goes to a.
	set(t, pl.Member(1).Server, key)
	if !has(a, key) || has(b, key) {
		t.Fatalf("%s: on a %v, on b %v; want a alone", key, has(a, key), has(b, key))
	}
	if n0, n1 := features[0].n.Load(), features[1].n.Load(); n0 != 0 || n1 != 1 {
		t.Errorf("the write passed the features of a %d times and of b %d; want 0 and 1", n0, n1)
	}
}
