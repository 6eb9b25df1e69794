package pool_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
	"golang.org/x/sync/semaphore"
)

func replicatedPool(t *testing.T, distribution string, replicas int, names ...string) *pool.Pool {
	t.Helper()
	members := make([]pool.Member, len(names))
	for i, n := range names {
		members[i] = pool.Member{Name: n, Addr: n, Weight: 1}
	}
	p, err := pool.New("p", pool.Options{Distribution: distribution, Replicas: replicas}, members)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func names(p *pool.Pool, idx []int) []string {
	out := make([]string, len(idx))
	for i, m := range idx {
		out[i] = p.Member(m).Name
	}
	return out
}

// TestReplicasDistinct: every key has N distinct replicas, the first its owner, with every
// distribution, and they spread over every member.
func TestReplicasDistinct(t *testing.T) {
	for _, d := range pool.Distributions() {
		for _, n := range []int{2, 3, 5} {
			p := replicatedPool(t, d, n, "a:1", "b:1", "c:1", "d:1", "e:1")
			if p.Replicas() != n {
				t.Fatalf("%s: Replicas() = %d, want %d", d, p.Replicas(), n)
			}
			held := make(map[string]int)
			for i := range 10_000 {
				k := []byte(fmt.Sprintf("key:%d", i))
				rs := names(p, p.ReplicasOf(k))
				if len(rs) != n {
					t.Fatalf("%s/%d: %s has replicas %v", d, n, k, rs)
				}
				sorted := slices.Clone(rs)
				slices.Sort(sorted)
				if len(slices.Compact(sorted)) != n {
					t.Fatalf("%s/%d: %s has replicas %v, not distinct", d, n, k, rs)
				}
				if rs[0] != p.Member(p.Owner(k)).Name {
					t.Fatalf("%s/%d: %s's first replica %s is not its owner", d, n, k, rs[0])
				}
				for _, r := range rs {
					held[r]++
				}
			}
			for _, m := range []string{"a:1", "b:1", "c:1", "d:1", "e:1"} {
				if held[m] < 10_000*n/5/2 {
					t.Errorf("%s/%d: %s holds %d of %d copies", d, n, m, held[m], 10_000*n)
				}
			}
		}
	}
}

// TestReplicasStable: adding a server leaves the replicas of every key that does not get a
// copy on it where they were (ketama and jump; modula moves every key, as it does without
// replicas).
func TestReplicasStable(t *testing.T) {
	for _, d := range []string{"ketama", "jump"} {
		before := replicatedPool(t, d, 3, "a:1", "b:1", "c:1", "d:1")
		after := replicatedPool(t, d, 3, "a:1", "b:1", "c:1", "d:1", "e:1")
		moved := 0
		for i := range 10_000 {
			k := []byte(fmt.Sprintf("key:%d", i))
			was, is := names(before, before.ReplicasOf(k)), names(after, after.ReplicasOf(k))
			if slices.Contains(is, "e:1") {
				moved++
				continue
			}
			if !slices.Equal(was, is) {
				t.Fatalf("%s: %s's replicas went from %v to %v, without the new server", d, k, was, is)
			}
		}
		if moved == 0 || moved == 10_000 {
			t.Errorf("%s: %d of 10,000 keys got a copy on the new server", d, moved)
		}
	}
}

// TestReplicasCappedByMembers: a pool with fewer members than replicas keeps a copy on each.
func TestReplicasCappedByMembers(t *testing.T) {
	p := replicatedPool(t, "ketama", 3, "a:1", "b:1")
	if got := p.ReplicasOf([]byte("k")); len(got) != 2 || p.Replicas() != 2 {
		t.Errorf("2 members, replicas 3: %v, Replicas() %d", got, p.Replicas())
	}
}

// away reports whether m, a replica, owes keys ("stats proxy" says so).
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
	a := &startable{downable: &downable{Store: memstore.New(memstore.Options{})}}
	b := &startable{downable: &downable{Store: memstore.New(memstore.Options{})}}
	pl, err := pool.New("p", pool.Options{Replicas: 2, StandIns: newStandIns(t, 10)}, []pool.Member{
		{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
		{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
	})
	if err != nil {
		t.Fatal(err)
	}
	sb := pl.Member(0).Server
	start := func(reqs ...protocol.Request) (bool, *turn.Turn, []protocol.Response, int) {
		var order turn.Turn
		turn.NewChain(0).Next(&order)
		resps, calls := make([]protocol.Response, len(reqs)), 0
		answered := make(chan bool, 1)
		caller := goroutineID()
		sb.Start(context.Background(), &order, reqs, resps, make([]error, len(reqs)), func() {
			calls++
			// The answer ends the request, and its turn with it (the frontend reuses it):
			// the turn must have been given on before.
			if order.Dispatches() != 1 {
				t.Errorf("answered with %d dispatches of its turn, want 1", order.Dispatches())
			}
			answered <- goroutineID() == caller
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
	if a.started.Load() != 1 || b.started.Load() != 1 || !has(a, "k1") || !has(b, "k1") {
		t.Errorf("a lone set started %d and %d times on the replicas", a.started.Load(), b.started.Load())
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

	b.down.Store(true)
	startedOnB := b.started.Load()
	if ok, _, resps, _ := start(write("k5")); !ok || resps[0].Status != protocol.StatusOK || b.started.Load() != startedOnB || has(b, "k5") {
		t.Errorf("a set with a replica down: answered inline %v, %+v, started on it %d times", ok, resps[0], b.started.Load()-startedOnB)
	}
	set(t, b, "k5") // what b held of k5 before it went down: older than the write above
	b.down.Store(false)
	if !away(pl.Member(1)) {
		t.Error("the replica up again does not owe the key")
	}
	deadline := time.Now().Add(10 * time.Second)
	for away(pl.Member(1)) {
		has(pl.Member(0).Server, "k5") // a read asks whether each replica serves: that starts the cleanup
		if time.Now().After(deadline) {
			t.Fatal("the replica does not serve again")
		}
		runtime.Gosched()
	}
	if has(b, "k5") {
		t.Error("the replica serves again with its copy of a key written while it was down")
	}
}

// TestReplicaFlushedPastMemory: a replica down while more keys are written than are
// remembered is flushed before it serves again.
func TestReplicaFlushedPastMemory(t *testing.T) {
	a := &downable{Store: memstore.New(memstore.Options{})}
	b := &downable{Store: memstore.New(memstore.Options{})}
	standIns := newStandIns(t, 1)
	pl, err := pool.New("p", pool.Options{Replicas: 2, StandIns: standIns}, []pool.Member{
		{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
		{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
	})
	if err != nil {
		t.Fatal(err)
	}
	set(t, b, "old")
	b.down.Store(true)
	for _, k := range []string{"k1", "k2", "k3"} {
		set(t, pl.Member(pl.Locate([]byte(k))).Server, k)
	}
	if standIns.Forgotten() == 0 {
		t.Fatal("no key was forgotten")
	}
	b.down.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for away(pl.Member(1)) {
		has(pl.Member(0).Server, "k1") // starts the cleanup
		if time.Now().After(deadline) {
			t.Fatal("the replica does not serve again")
		}
		runtime.Gosched()
	}
	if has(b, "old") {
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
		{pool.QuorumAll, 1, "ok"}, {pool.QuorumAll, 2, "ok"}, {pool.QuorumAll, 3, "error"},
		{pool.QuorumMajority, 1, "ok"}, {pool.QuorumMajority, 2, "quorum"},
		{pool.QuorumOne, 2, "ok"}, {pool.QuorumOne, 3, "error"},
	} {
		members := make([]pool.Member, 3)
		for i := range members {
			name := fmt.Sprintf("s%d", i)
			var s pool.Server = &downable{Store: memstore.New(memstore.Options{})}
			if i < tc.broken {
				s = broken{name}
			}
			members[i] = pool.Member{Name: name, Addr: "embedded/" + name, Weight: 1, Server: s}
		}
		pl, err := pool.New("p", pool.Options{Replicas: 3, WriteQuorum: tc.quorum, StandIns: newStandIns(t, 10),
			Background: semaphore.NewWeighted(1 << 20)}, members)
		if err != nil {
			t.Fatal(err)
		}
		var resp [1]protocol.Response
		err = pool.Do(context.Background(), pl.Member(0).Server, nil, &protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("v")}, resp[:])
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
	}{{pool.ReadFirst, false}, {pool.ReadRandom, true}} {
		a := &downable{Store: memstore.New(memstore.Options{})}
		b := &downable{Store: memstore.New(memstore.Options{})}
		pl, err := pool.New("p", pool.Options{Replicas: 2, ReadFrom: tc.from, StandIns: newStandIns(t, 10)}, []pool.Member{
			{Name: "a", Addr: "embedded/0", Weight: 1, Server: a},
			{Name: "b", Addr: "embedded/1", Weight: 1, Server: b},
		})
		if err != nil {
			t.Fatal(err)
		}
		set(t, pl.Member(0).Server, "k")
		before := [2]uint64{a.Info().Counters.Requests, b.Info().Counters.Requests}
		for range 200 {
			if !has(pl.Member(pl.Locate([]byte("k"))).Server, "k") {
				t.Fatalf("%s: a read of k missed", tc.from)
			}
		}
		asked := [2]uint64{a.Info().Counters.Requests - before[0], b.Info().Counters.Requests - before[1]}
		if both := asked[0] > 0 && asked[1] > 0; both != tc.bothAsked || asked[0]+asked[1] != 200 {
			t.Errorf("read_from %s: the replicas answered %v of 200 reads", tc.from, asked)
		}
	}
}
