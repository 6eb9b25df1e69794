package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// newPool is a ketama pool of n embedded shards named name/shardI.
func newPool(t testing.TB, name string, n int) *pool.Pool {
	t.Helper()
	members := make([]pool.Member, n)
	for i := range members {
		members[i] = pool.Member{
			Name:   fmt.Sprintf("shard%d", i),
			Addr:   fmt.Sprintf("embedded/%d", i),
			Weight: 1,
			Server: memstore.New(memstore.Options{}),
		}
	}
	p, err := pool.New(name, pool.Options{}, members)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// twoPools is pool "main" (3 shards, the default) and pool "sess" (2 shards), with routes
// "sess:" → sess, then "sess:main:" → main, which the first route always shadows.
func twoPools(t testing.TB) (*topology.Topology, *pool.Pool, *pool.Pool) {
	main, sess := newPool(t, "main", 3), newPool(t, "sess", 2)
	return &topology.Topology{
		Pools: []*pool.Pool{main, sess},
		Routes: []topology.Route{
			{Prefix: []byte("sess:"), Pool: sess},
			{Prefix: []byte("sess:main:"), Pool: main},
		},
		Default: main,
	}, main, sess
}

func handle(p *proxy.Proxy, req *protocol.Request) []protocol.Response {
	return p.Handle(context.Background(), nil, []protocol.Request{*req}, nil)
}

func set(t testing.TB, p *proxy.Proxy, key, value string) {
	t.Helper()
	r := handle(p, &protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte(value)})
	if len(r) != 1 || r[0].Status != protocol.StatusOK {
		t.Fatalf("set %s: %+v", key, r)
	}
}

func get(p *proxy.Proxy, keys ...string) []protocol.Response {
	req := &protocol.Request{Op: protocol.OpGet}
	for _, k := range keys {
		req.Keys = append(req.Keys, []byte(k))
	}
	return handle(p, req)
}

// holds asks member m directly whether it has key.
func holds(t testing.TB, m *pool.Member, key string) bool {
	t.Helper()
	var r [1]protocol.Response
	if err := pool.Do(context.Background(), m.Server, nil, &protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte(key)}}, r[:]); err != nil {
		t.Fatal(err)
	}
	return r[0].Status == protocol.StatusOK
}

func TestRouting(t *testing.T) {
	topo, main, sess := twoPools(t)
	p := proxy.New(topo, proxy.Options{})
	tests := []struct {
		name string
		key  string
		want *pool.Pool
	}{
		{name: "no prefix goes to default", key: "user:1", want: main},
		{name: "route prefix", key: "sess:abc", want: sess},
		{name: "first matching route wins", key: "sess:main:x", want: sess},
		{name: "prefix must be at the start", key: "xsess:abc", want: main},
		{name: "prefix itself", key: "sess:", want: sess},
		{name: "shorter than prefix", key: "sess", want: main},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := topo.PoolFor([]byte(tt.key)); got != tt.want {
				t.Fatalf("PoolFor = %s, want %s", got.Name(), tt.want.Name())
			}
			set(t, p, tt.key, "v")
			owner := topo.Locate([]byte(tt.key))
			found := 0
			for _, pl := range topo.Pools {
				for i := range pl.Len() {
					m := pl.Member(i)
					if !holds(t, m, tt.key) {
						continue
					}
					found++
					if pl != tt.want || m != owner {
						t.Errorf("stored on %s/%s, want %s/%s", pl.Name(), m.Name, tt.want.Name(), owner.Name)
					}
				}
			}
			if found != 1 {
				t.Errorf("key on %d shards, want 1", found)
			}
		})
	}
}

// TestSpread checks that a pool's keys land on every shard, each where Locate says.
func TestSpread(t *testing.T) {
	topo, main, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{})
	perShard := make(map[*pool.Member]int)
	for i := range 300 {
		key := fmt.Sprintf("key%d", i)
		set(t, p, key, "v")
		m := topo.Locate([]byte(key))
		if !holds(t, m, key) {
			t.Fatalf("%s is not on %s, its owner", key, m.Name)
		}
		perShard[m]++
	}
	if len(perShard) != main.Len() {
		t.Fatalf("300 keys on %d shards of %d", len(perShard), main.Len())
	}
	for m, n := range perShard {
		t.Logf("%s: %d keys", m.Name, n)
	}
}

func TestMultiGet(t *testing.T) {
	topo, _, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{})
	var keys []string
	owners := make(map[*pool.Member]bool)
	for i := range 20 {
		k := fmt.Sprintf("k%d", i)
		if i%4 == 3 {
			k = "sess:" + k
		}
		keys = append(keys, k)
		owners[topo.Locate([]byte(k))] = true
		if i%3 != 0 {
			set(t, p, k, "value-"+k)
		}
	}
	if len(owners) < 4 {
		t.Fatalf("keys span only %d shards; the test needs several", len(owners))
	}
	keys = append(keys, "k1") // a repeated key is answered twice, like memcached
	resps := get(p, keys...)
	if len(resps) != len(keys) {
		t.Fatalf("%d answers for %d keys", len(resps), len(keys))
	}
	for i, k := range keys {
		r := resps[i]
		if string(r.Key) != k {
			t.Errorf("answer %d is for %q, want %q", i, r.Key, k)
		}
		hit := i == len(keys)-1 || i%3 != 0
		switch {
		case hit && (r.Status != protocol.StatusOK || string(r.Value) != "value-"+k):
			t.Errorf("%s: status %d value %q, want a hit", k, r.Status, r.Value)
		case !hit && r.Status != protocol.StatusNotFound:
			t.Errorf("%s: status %d, want a miss", k, r.Status)
		}
	}
}

func TestFlushAll(t *testing.T) {
	topo, _, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{})
	type placed struct {
		m   *pool.Member
		key string
	}
	var all []placed
	for _, pl := range topo.Pools {
		for i := range pl.Len() {
			m := pl.Member(i)
			key := fmt.Sprintf("direct-%s-%s", pl.Name(), m.Name)
			var r [1]protocol.Response
			if err := pool.Do(context.Background(), m.Server, nil, &protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte("v")}, r[:]); err != nil {
				t.Fatal(err)
			}
			all = append(all, placed{m, key})
		}
	}
	if r := handle(p, &protocol.Request{Op: protocol.OpFlushAll}); len(r) != 1 || r[0].Status != protocol.StatusOK {
		t.Fatalf("flush_all: %+v", r)
	}
	for _, pk := range all {
		if holds(t, pk.m, pk.key) {
			t.Errorf("%s still holds %s after flush_all", pk.m.Name, pk.key)
		}
	}
}

func TestVersion(t *testing.T) {
	topo, _, _ := twoPools(t)
	for _, tc := range []struct{ build, answer string }{
		{"1.2.3", "1.2.3 moxi"},
		{"", "1.2.3 moxi"},
		{"dev", "1.2.3 moxi/dev"},
		{"1.2.3-dev", "1.2.3 moxi/1.2.3-dev"},
		{"9.9", "1.2.3 moxi/9.9"},         // a build string never takes the number's place
		{"a1b2c3d", "1.2.3 moxi/a1b2c3d"}, // a commit hash starting with a letter
	} {
		p := proxy.New(topo, proxy.Options{Release: "1.2.3", Build: tc.build})
		r := handle(p, &protocol.Request{Op: protocol.OpVersion})
		if len(r) != 1 || r[0].Status != protocol.StatusOK || string(r[0].Value) != tc.answer {
			t.Errorf("build %q: version answered %+v, want %q", tc.build, r, tc.answer)
		}
	}
}

// failing is a server that never answers.
type failing struct{}

func (failing) Up() bool               { return true }
func (failing) Info() pool.Info        { return pool.Info{State: pool.StateUp} }
func (failing) Stats() []protocol.Stat { return nil }
func (failing) Close() error           { return nil }

func (failing) Start(_ context.Context, order *turn.Turn, _ []protocol.Request, _ []protocol.Response, errs []error, done func()) {
	pool.Fail(order, errs, errors.New("connection refused"), done)
}

func TestBackendError(t *testing.T) {
	good := memstore.New(memstore.Options{})
	pl, err := pool.New("main", pool.Options{}, []pool.Member{
		{Name: "good", Addr: "embedded/0", Weight: 1, Server: good},
		{Name: "bad", Addr: "127.0.0.1:1", Weight: 1, Server: failing{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	topo := &topology.Topology{Pools: []*pool.Pool{pl}, Default: pl}
	p := proxy.New(topo, proxy.Options{})
	var keys []string
	var onBad []bool
	for i := 0; len(keys) < 10; i++ {
		k := fmt.Sprintf("k%d", i)
		keys = append(keys, k)
		onBad = append(onBad, topo.Locate([]byte(k)).Name == "bad")
		if !onBad[len(onBad)-1] {
			set(t, p, k, "v")
		}
	}

	t.Run("multi-get fails only the bad server's keys", func(t *testing.T) {
		resps := get(p, keys...)
		bad := 0
		for i, r := range resps {
			if string(r.Key) != keys[i] {
				t.Errorf("answer %d is for %q, want %q", i, r.Key, keys[i])
			}
			if !onBad[i] {
				if r.Status != protocol.StatusOK {
					t.Errorf("%s on the good server: status %d", keys[i], r.Status)
				}
				continue
			}
			bad++
			if r.Status != protocol.StatusTempFailure || !strings.Contains(r.Msg, "bad") || !strings.Contains(r.Msg, "connection refused") {
				t.Errorf("%s on the bad server: status %d msg %q, want a temporary failure naming it", keys[i], r.Status, r.Msg)
			}
		}
		if bad == 0 || bad == len(keys) {
			t.Fatalf("%d of %d keys on the bad server; the test needs both kinds", bad, len(keys))
		}
	})
	t.Run("single-key commands", func(t *testing.T) {
		for i, k := range keys {
			r := handle(p, &protocol.Request{Op: protocol.OpDelete, Key: []byte(k)})
			want := protocol.StatusOK
			if onBad[i] {
				want = protocol.StatusTempFailure
			}
			if r[0].Status != want || (onBad[i] && r[0].Msg == "") {
				t.Errorf("delete %s: status %d msg %q, want status %d", k, r[0].Status, r[0].Msg, want)
			}
		}
	})
	t.Run("a run of pipelined writes fails only the bad server's writes", func(t *testing.T) {
		reqs := make([]protocol.Request, 0, 2*len(keys))
		for _, k := range keys {
			reqs = append(reqs,
				protocol.Request{Op: protocol.OpSet, Key: []byte(k), Value: []byte("run")},
				protocol.Request{Op: protocol.OpAppend, Key: []byte(k), Value: []byte("!")})
		}
		resps := p.Handle(context.Background(), nil, reqs, nil)
		for i, r := range resps {
			k := keys[i/2]
			bad := onBad[i/2]
			if bad != (r.Status == protocol.StatusTempFailure) || bad && !strings.Contains(r.Msg, "bad") {
				t.Errorf("%s %s (on the bad server: %v): status %d msg %q", reqs[i].Op, k, bad, r.Status, r.Msg)
			}
			if !bad {
				if got := get(p, k); string(got[0].Value) != "run!" {
					t.Errorf("%s = %q after set and append in one run, want run!", k, got[0].Value)
				}
			}
		}
	})
	t.Run("flush_all reports the failure", func(t *testing.T) {
		r := handle(p, &protocol.Request{Op: protocol.OpFlushAll})
		if r[0].Status != protocol.StatusTempFailure || r[0].Msg == "" {
			t.Errorf("flush_all: %+v", r[0])
		}
	})
}

// TestRunOfFireAndForgetWrites: a pipelined run of fire-and-forget writes alone (no share
// for any server) is answered at once, its turn given on, and the writes land.
func TestRunOfFireAndForgetWrites(t *testing.T) {
	pl := newPool(t, "main", 2)
	p := proxy.New(&topology.Topology{Pools: []*pool.Pool{pl}, Default: pl, FireAndForget: [][]byte{[]byte("ff:")}}, proxy.Options{})
	defer func() { _ = p.Close(context.Background()) }()
	reqs := []protocol.Request{
		{Op: protocol.OpSet, Key: []byte("ff:a"), Value: []byte("1")},
		{Op: protocol.OpSet, Key: []byte("ff:b"), Value: []byte("2")},
	}
	var order turn.Turn
	turn.NewChain(0).Next(&order)
	answered := make(chan []protocol.Response, 1)
	go func() { answered <- p.Handle(context.Background(), &order, reqs, nil) }()
	select {
	case resps := <-answered:
		if len(resps) != 2 || resps[0].Status != protocol.StatusOK || resps[1].Status != protocol.StatusOK {
			t.Fatalf("answers %+v", resps)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a run of fire-and-forget writes was not answered")
	}
	if n := order.Dispatches(); n != 1 {
		t.Errorf("the run's turn was dispatched %d times, want once", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for get(p, "ff:a")[0].Status != protocol.StatusOK || get(p, "ff:b")[0].Status != protocol.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("the fire-and-forget writes never landed")
		}
		time.Sleep(5 * time.Millisecond) // polling
	}
}
