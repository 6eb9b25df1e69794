package replica_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/replica"
	"github.com/moxi-proxy/moxi/internal/servertest"
	"github.com/moxi-proxy/moxi/internal/turn"
	"golang.org/x/sync/semaphore"
)

func away(m *pool.Member) bool {
	stats := m.Server.Stats()
	return slices.Contains(stats, protocol.Stat{Name: "away", Value: "1"})
}

// TestReplicaStarts: a member of a replicated pool starts a lone plain write on both
// replicas without a goroutine waiting for it, dispatching the request's turn once and
// before its answer; every other run is executed on a goroutine that waits. With one
// replica down the write is started on the other, and the one down owes the key: up again,
// it serves no key until the key is deleted on it.
func TestReplicaStarts(t *testing.T) {
	a := servertest.NewDownable()
	b := servertest.NewDownable()
	pl := replicated(t, 2, replica.Options{StandIns: servertest.StandIns(t, 10)},
		pool.Member{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
		pool.Member{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
	)
	sb := pl.Member(0).Server
	start := func(reqs ...protocol.Request) (bool, *turn.Turn, []protocol.Response, int) {
		var order turn.Turn
		turn.NewChain(0).Next(&order)
		resps, calls := make([]protocol.Response, len(reqs)), 0
		answered := make(chan bool, 1)
		caller := servertest.GoroutineID()
		sb.Start(context.Background(), &order, reqs, resps, make([]error, len(reqs)), func() {
			calls++
			// The answer ends the request, and its turn with it (the frontend reuses it):
			// the turn must have been given on before.
			if order.Dispatches() != 1 {
				t.Errorf("answered with %d dispatches of its turn, want 1", order.Dispatches())
			}
			answered <- servertest.GoroutineID() == caller
		})
		inline := <-answered
		return inline, &order, resps, calls
	}
	write := func(k string) protocol.Request {
		return protocol.Request{Op: protocol.OpSet, Key: []byte(k), Value: []byte("v")}
	}
	ok, order, resps, calls := start(write("k1"))
	if !ok || calls != 1 || resps[0].Status != protocol.StatusOK || order.Dispatches() != 1 {
		t.Errorf("a lone set: started %v, done called %d times, %+v, %d dispatches", ok, calls, resps[0], order.Dispatches())
	}
	if a.Started.Load() != 1 || b.Started.Load() != 1 || !servertest.Has(a, "k1") || !servertest.Has(b, "k1") {
		t.Errorf("a lone set started %d and %d times on the replicas", a.Started.Load(), b.Started.Load())
	}
	for name, batch := range map[string][]protocol.Request{
		"a get":       {{Op: protocol.OpGet, Keys: [][]byte{[]byte("k1")}}},
		"two sets":    {write("k2"), write("k3")},
		"an add":      {{Op: protocol.OpAdd, Key: []byte("k4"), Value: []byte("v")}},
		"an incr":     {{Op: protocol.OpIncr, Key: []byte("k1"), Delta: 1}},
		"a cas write": {{Op: protocol.OpCas, Key: []byte("k1"), Value: []byte("v"), Cas: 1}},
	} {
		if inline, _, _, _ := start(batch...); inline {
			t.Errorf("%s was answered without a goroutine waiting", name)
		}
	}

	b.Down.Store(true)
	startedOnB := b.Started.Load()
	if ok, _, resps, _ := start(write("k5")); !ok || resps[0].Status != protocol.StatusOK || b.Started.Load() != startedOnB || servertest.Has(b, "k5") {
		t.Errorf("a set with a replica down: answered inline %v, %+v, started on it %d times", ok, resps[0], b.Started.Load()-startedOnB)
	}
	servertest.Set(t, b, "k5") // what b held of k5 before it went down: older than the write above
	b.Down.Store(false)
	if !away(pl.Member(1)) {
		t.Error("the replica up again does not owe the key")
	}
	deadline := time.Now().Add(10 * time.Second)
	for away(pl.Member(1)) {
		servertest.Has(pl.Member(0).Server, "k5") // a read asks whether each replica serves: that starts the cleanup
		if time.Now().After(deadline) {
			t.Fatal("the replica does not serve again")
		}
		runtime.Gosched()
	}
	if servertest.Has(b, "k5") {
		t.Error("the replica serves again with its copy of a key written while it was down")
	}
}

// TestReplicaFlushedPastMemory: a replica down while more keys are written than are
// remembered is flushed before it serves again.
func TestReplicaFlushedPastMemory(t *testing.T) {
	a := servertest.NewDownable()
	b := servertest.NewDownable()
	standIns := servertest.StandIns(t, 1)
	pl := replicated(t, 2, replica.Options{StandIns: standIns},
		pool.Member{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
		pool.Member{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
	)
	servertest.Set(t, b, "old")
	b.Down.Store(true)
	for _, k := range []string{"k1", "k2", "k3"} {
		servertest.Set(t, pl.Member(pl.Locate([]byte(k))).Server, k)
	}
	if standIns.Forgotten() == 0 {
		t.Fatal("no key was forgotten")
	}
	b.Down.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for away(pl.Member(1)) {
		servertest.Has(pl.Member(0).Server, "k1") // starts the cleanup
		if time.Now().After(deadline) {
			t.Fatal("the replica does not serve again")
		}
		runtime.Gosched()
	}
	if servertest.Has(b, "old") {
		t.Error("the replica serves again without having been flushed")
	}
}

// broken is a server that is up and never answers: every request fails with an error.
type broken struct{ name string }

func (broken) Start(_ context.Context, order *turn.Turn, _ []protocol.Request, _ []protocol.Response, errs []error, done func()) {
	pool.Fail(order, errs, errors.New("broken"), done)
}
func (broken) Up() bool               { return true }
func (broken) Info() pool.Info        { return pool.Info{State: pool.StateUp} }
func (broken) Stats() []protocol.Stat { return nil }
func (broken) Close() error           { return nil }

// TestReplicaQuorums: a write to three replicas, some of which fail it, with each quorum:
// all is acknowledged while one replica takes it (those that failed are away for the key),
// majority needs two, one needs one, and a write no replica took fails as a server does.
func TestReplicaQuorums(t *testing.T) {
	for _, tc := range []struct {
		quorum string
		broken int // of the three replicas
		want   string
	}{
		{replica.QuorumAll, 1, "ok"}, {replica.QuorumAll, 2, "ok"}, {replica.QuorumAll, 3, "error"},
		{replica.QuorumMajority, 1, "ok"}, {replica.QuorumMajority, 2, "quorum"},
		{replica.QuorumOne, 2, "ok"}, {replica.QuorumOne, 3, "error"},
	} {
		members := make([]pool.Member, 3)
		for i := range members {
			name := fmt.Sprintf("s%d", i)
			var s pool.Server = servertest.NewDownable()
			if i < tc.broken {
				s = broken{name}
			}
			members[i] = pool.Member{Name: name, Addr: "embedded/" + name, Weight: 1, Server: s}
		}
		pl := replicated(t, 3, replica.Options{WriteQuorum: tc.quorum, StandIns: servertest.StandIns(t, 10),
			Background: semaphore.NewWeighted(1 << 20)}, members...)
		var resp [1]protocol.Response
		err := pool.Do(context.Background(), pl.Member(0).Server, nil, &protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("v")}, resp[:])
		got := "ok"
		switch {
		case err != nil:
			got = "error"
		case resp[0].Status == protocol.StatusTempFailure:
			got = "quorum"
		case resp[0].Status != protocol.StatusOK:
			got = fmt.Sprintf("status %d", resp[0].Status)
		}
		if got != tc.want {
			t.Errorf("%s with %d of 3 replicas broken: %s (%v %+v), want %s", tc.quorum, tc.broken, got, err, resp[0], tc.want)
		}
	}
}

// TestReplicaReadFrom: with read_from first every read of a key asks its first replica;
// with random, both replicas answer some.
func TestReplicaReadFrom(t *testing.T) {
	for _, tc := range []struct {
		from      string
		bothAsked bool
	}{{replica.ReadFirst, false}, {replica.ReadRandom, true}} {
		a := servertest.NewDownable()
		b := servertest.NewDownable()
		pl := replicated(t, 2, replica.Options{ReadFrom: tc.from, StandIns: servertest.StandIns(t, 10)},
			pool.Member{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
			pool.Member{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
		)
		servertest.Set(t, pl.Member(0).Server, "k")
		before := [2]uint64{a.Info().Counters.Requests, b.Info().Counters.Requests}
		for range 200 {
			if !servertest.Has(pl.Member(pl.Locate([]byte("k"))).Server, "k") {
				t.Fatalf("%s: a read of k missed", tc.from)
			}
		}
		asked := [2]uint64{a.Info().Counters.Requests - before[0], b.Info().Counters.Requests - before[1]}
		if both := asked[0] > 0 && asked[1] > 0; both != tc.bothAsked || asked[0]+asked[1] != 200 {
			t.Errorf("read_from %s: the replicas answered %v of 200 reads", tc.from, asked)
		}
	}
}
