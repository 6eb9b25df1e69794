package topology

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/migrate"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// mainConfig is a config of one pool "main" with extra settings over addrs, named s0, s1…
// in order.
func mainConfig(t *testing.T, extra string, addrs ...string) *config.Config {
	t.Helper()
	var b strings.Builder
	b.WriteString("pools:\n  main:\n" + extra + "    servers:\n")
	for i, a := range addrs {
		fmt.Fprintf(&b, "      - {name: s%d, addr: %q}\n", i, a)
	}
	return parse(t, b.String())
}

// do sends req to s and returns its answer.
func do(t *testing.T, s pool.Server, req protocol.Request) protocol.Response {
	t.Helper()
	var resp [1]protocol.Response
	if err := pool.Do(context.Background(), s, nil, &req, resp[:]); err != nil {
		t.Fatalf("%s %s: %v", req.Op, req.Key, err)
	}
	return resp[0]
}

// through is the server that the proxy sends key to in top's default pool.
func through(top *Topology, key string) pool.Server {
	return top.Default.Member(top.Default.Locate([]byte(key))).Server
}

// getValue is key's value read from s, or "" when s misses it.
func getValue(t *testing.T, s pool.Server, key string) string {
	t.Helper()
	return string(do(t, s, protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte(key)}}).Value)
}

// migrationNamed is the /migrations entry of b named name, if any.
func migrationNamed(b *Builder, name string) (migrate.Status, bool) {
	ms := b.Migrations()
	i := slices.IndexFunc(ms, func(st migrate.Status) bool { return st.Name == name })
	if i < 0 {
		return migrate.Status{}, false
	}
	return ms[i], true
}

// TestResumedReshardReadsFromTheOldServers: a process resharding main from {A, B} to
// {A, B, C}, its copy slow, hands its state over mid-copy (through JSON); its successor
// resumes the reshard under the same name: every key that moved to C is read through the
// successor's topology with its value, from the server that held it; the successor hands
// the same reshard on; and its next change of servers is reshard-2.
func TestResumedReshardReadsFromTheOldServers(t *testing.T) {
	mcs := []*memcachedtest.Server{memcachedtest.Start(t), memcachedtest.Start(t), memcachedtest.Start(t)}
	const slow = "    failover: false\n    migrate_rate: 1\n"
	two := mainConfig(t, slow, mcs[0].Addr, mcs[1].Addr)
	three := mainConfig(t, slow, mcs[0].Addr, mcs[1].Addr, mcs[2].Addr)
	build := func(b *Builder, cfg *config.Config) *Pending {
		t.Helper()
		pd, err := b.Build(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return pd
	}

	old := &Builder{Dial: true}
	closeOld := sync.OnceFunc(func() { _ = old.Close(context.Background()) })
	defer closeOld()
	first := build(old, two)
	first.Commit(0)
	keys := make([]string, 300)
	for i := range keys {
		keys[i] = fmt.Sprintf("k:%d", i)
		do(t, through(first.Topology, keys[i]), protocol.Request{Op: protocol.OpSet, Key: []byte(keys[i]), Value: []byte("v-" + keys[i])})
	}
	build(old, three).Commit(0)
	st := old.Moving()
	want := []ReshardState{{Pool: "main", Name: "reshard-1", Before: placementOf(two.Pools[0])}}
	if !reflect.DeepEqual(st.Reshards, want) || len(st.Rebuilds) != 0 {
		t.Fatalf("Moving mid-copy: %+v, want %+v", st, want)
	}
	closeOld() // an upgrade's predecessor goes; its copy stops halfway
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var handed MovingState
	if err := json.Unmarshal(data, &handed); err != nil {
		t.Fatal(err)
	}

	b := &Builder{Dial: true}
	defer b.Close(context.Background())
	b.Resume(handed)
	pd := build(b, three)
	if run := pd.placements["main"].reshard; run == nil || run.name != "reshard-1" {
		t.Errorf("resumed: reshard %+v, want reshard-1", run)
	}
	pd.Commit(0)
	if _, ok := migrationNamed(b, "reshard-1"); !ok {
		t.Errorf("/migrations: %+v, want reshard-1", b.Migrations())
	}
	top := pd.Topology.Default
	var moved, missed []string
	for _, k := range keys {
		if top.Member(top.Owner([]byte(k))).Addr != mcs[2].Addr {
			continue
		}
		moved = append(moved, k)
		if getValue(t, through(pd.Topology, k), k) != "v-"+k {
			missed = append(missed, k)
		}
	}
	if len(moved) == 0 {
		t.Fatal("no key moved to the third server: the test shows nothing")
	}
	if len(missed) > 0 {
		t.Errorf("%d of the %d keys that moved to the new server missed through the successor: %q", len(missed), len(moved), missed)
	}
	if st := b.Moving(); !reflect.DeepEqual(st.Reshards, want) {
		t.Errorf("the successor hands on %+v, want %+v", st.Reshards, want)
	}
	next := build(b, two)
	if run := next.placements["main"].reshard; run == nil || run.name != "reshard-2" {
		t.Errorf("the successor's next change of servers: reshard %+v, want reshard-2", run)
	}
	next.Abort()
}

// TestResumeReshardsOnlyAChangedPool: a resumed reshard starts when the pool's servers
// differ from those its keys move from, and not when they are the same or the pool is gone;
// either way, the pool's next reshard counts on from the name handed.
func TestResumeReshardsOnlyAChangedPool(t *testing.T) {
	a, c := memcachedtest.Start(t), memcachedtest.Start(t)
	now := mainConfig(t, "", a.Addr, c.Addr)
	for _, tc := range []struct {
		name       string
		pool       string
		before     *config.Config
		want, next string // the reshard of the first build, and of the next change ("": none)
	}{
		{"the same servers", "main", now, "", "reshard-5"},
		{"a server added", "main", mainConfig(t, "", a.Addr), "reshard-4", "reshard-5"},
		{"other settings", "main", mainConfig(t, "    hash: fnv1a_64\n", a.Addr, c.Addr), "reshard-4", "reshard-5"},
		{"the pool gone", "gone", now, "", "reshard-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &Builder{Dial: true}
			defer b.Close(context.Background())
			b.Resume(MovingState{Reshards: []ReshardState{{Pool: tc.pool, Name: "reshard-4", Before: placementOf(tc.before.Pools[0])}}})
			pd, err := b.Build(now)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if run := pd.placements["main"].reshard; run != nil {
				got = run.name
			}
			if got != tc.want {
				t.Errorf("first build: reshard %q, want %q", got, tc.want)
			}
			if tc.want == "" && len(pd.migrations) != 0 {
				t.Errorf("first build: %d migrations, want none", len(pd.migrations))
			}
			pd.Commit(0)
			if _, ok := migrationNamed(b, "reshard-4"); ok != (tc.want != "") {
				t.Errorf("/migrations: %+v", b.Migrations())
			}
			if st := b.Moving(); (len(st.Reshards) != 0) != (tc.want != "") {
				t.Errorf("Moving: %+v", st)
			}
			next, err := b.Build(mainConfig(t, "", c.Addr))
			if err != nil {
				t.Fatal(err)
			}
			defer next.Abort()
			if run := next.placements["main"].reshard; run == nil || run.name != tc.next {
				t.Errorf("the next change of servers: reshard %+v, want %s", run, tc.next)
			}
		})
	}
}

// resumedRebuilds is a new Builder that resumed rebuilds, committed over a replicated pool
// main of a (50 keys set: full) and c (empty, its rebuild lock held by holder): the Builder,
// c's server and the keys.
func resumedRebuilds(t *testing.T, rebuilds []RebuildState, a, c, lock, holder string) (*Builder, pool.Server, []string) {
	t.Helper()
	b := &Builder{Dial: true}
	t.Cleanup(func() { b.Close(context.Background()) })
	b.Resume(MovingState{Rebuilds: rebuilds})
	pd, err := b.Build(mainConfig(t, "    replicas: 2\n", a, c))
	if err != nil {
		t.Fatal(err)
	}
	full, empty := pd.Topology.Default.Member(0).Base, pd.Topology.Default.Member(1).Base
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = fmt.Sprintf("k:%d", i)
		do(t, full, protocol.Request{Op: protocol.OpSet, Key: []byte(keys[i]), Value: []byte("v-" + keys[i])})
	}
	do(t, empty, protocol.Request{Op: protocol.OpSet, Key: []byte(lock), Value: []byte(holder), Exptime: 60})
	pd.Commit(0)
	return b, empty, keys
}

// waitRefilled waits for b's rebuild name to be done, and checks that it refilled empty
// with keys.
func waitRefilled(t *testing.T, b *Builder, name string, empty pool.Server, keys []string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); ; <-tick.C {
		st, _ := migrationNamed(b, name)
		if st.Phase == migrate.Done {
			break
		}
		if st.Phase == migrate.Failed || time.Now().After(deadline) {
			t.Fatalf("%s not done within 30s: %+v", name, b.Migrations())
		}
	}
	for _, k := range keys {
		if v := getValue(t, empty, k); v != "v-"+k {
			t.Errorf("%s on the refilled server: %q", k, v)
		}
	}
}

// TestResumedRebuild: a rebuild handed over starts again at the first Commit, under its
// name and with its lock — so while another proxy of the tier holds the lock it waits, and
// is handed on as it was — then, once the lock is free, refills its server; a rebuild of a
// server now at another address is not resumed; and the next rebuild counts on.
func TestResumedRebuild(t *testing.T) {
	a, c := memcachedtest.Start(t), memcachedtest.Start(t)
	const lock = "__moxi__:rebuild:resumed"
	refill := RebuildState{Pool: "main", Server: "s1", Addr: c.Addr, Name: "rebuild-3", Lock: lock}
	b, empty, keys := resumedRebuilds(t, []RebuildState{
		refill,
		{Pool: "main", Server: "s0", Addr: "127.0.0.1:1", Name: "rebuild-2", Lock: "__moxi__:rebuild:elsewhere"},
	}, a.Addr, c.Addr, lock, "other-proxy:1")
	handed := refill
	handed.Holder = migrate.LockOwner()
	if st := b.Moving(); !reflect.DeepEqual(st.Rebuilds, []RebuildState{handed}) {
		t.Errorf("Moving while another proxy holds the lock: %+v, want %+v", st.Rebuilds, handed)
	}
	if _, ok := migrationNamed(b, "rebuild-2"); ok {
		t.Errorf("a rebuild of a server now elsewhere was resumed: %+v", b.Migrations())
	}
	do(t, empty, protocol.Request{Op: protocol.OpDelete, Key: []byte(lock)}) // its holder died: the lock expired
	waitRefilled(t, b, "rebuild-3", empty, keys)
	if st := b.Moving(); len(st.Rebuilds) != 0 {
		t.Errorf("Moving after the rebuild: %+v", st.Rebuilds)
	}
	b.restarted("main", "s1", c.Addr, 1)
	if _, ok := migrationNamed(b, "rebuild-4"); !ok {
		t.Errorf("the next rebuild: %+v, want rebuild-4", b.Migrations())
	}
}

// TestResumedRebuildTakesItsLock: a rebuild handed over while its predecessor held the
// tier lock takes the lock over at once (the predecessor, on its way out, would keep it
// until it expires, 60 s here) and refills its server.
func TestResumedRebuildTakesItsLock(t *testing.T) {
	a, c := memcachedtest.Start(t), memcachedtest.Start(t)
	const lock, predecessor = "__moxi__:rebuild:handed", "old-host:4242"
	b, empty, keys := resumedRebuilds(t, []RebuildState{{Pool: "main", Server: "s1", Addr: c.Addr, Name: "rebuild-1", Lock: lock, Holder: predecessor}},
		a.Addr, c.Addr, lock, predecessor)
	waitRefilled(t, b, "rebuild-1", empty, keys)
}

// TestMovingStateJSONRoundTrip: a state survives encode → decode unchanged, zones,
// replicas and all, and its placements still place keys.
func TestMovingStateJSONRoundTrip(t *testing.T) {
	zoned := parse(t, "pools:\n  z:\n    hash_tag: \"{}\"\n    zones:\n      - {name: a, servers: [\"h:1\", \"h:2:3 x\"]}\n      - {name: b, servers: [\"h:3\"]}\n")
	replicated := mainConfig(t, "    replicas: 2\n    distribution: jump\n", "h:1", "h:2", "h:3")
	st := MovingState{
		Reshards: []ReshardState{
			{Pool: "z", Name: "reshard-7", Before: placementOf(zoned.Pools[0])},
			{Pool: "main", Name: "reshard-2", Before: placementOf(replicated.Pools[0])},
		},
		Rebuilds: []RebuildState{{Pool: "main", Server: "s1", Addr: "h:2", Name: "rebuild-9", Lock: "__moxi__:rebuild:1700000000"}},
	}
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var back MovingState
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, st) {
		t.Fatalf("after JSON %s:\n%+v\nwant\n%+v", data, back, st)
	}
	for _, r := range back.Reshards {
		if _, err := r.Before.newPool(r.Pool); err != nil {
			t.Errorf("%s: %v", r.Pool, err)
		}
	}
}
