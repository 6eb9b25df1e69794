package proxy_test

import (
	"bytes"
	"context"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/route"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// warming is a proxy whose default pool "new" warms up from "old", each of 2 shards.
func warming(t *testing.T) (*proxy.Proxy, *prometheus.Registry, *pool.Pool, *pool.Pool) {
	t.Helper()
	newP, oldP := newPool(t, "new", 2), newPool(t, "old", 2)
	reg := prometheus.NewRegistry()
	features := route.NewShared(route.Options{Registry: reg})
	topology.Compose(newP, features, topology.Stack{Features: route.Features{WarmFrom: oldP}})
	p := proxy.New(&topology.Topology{Pools: []*pool.Pool{newP, oldP}, Default: newP}, proxy.Options{Registry: reg, Features: features})
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p, reg, newP, oldP
}

// store sets key directly on its server of pl.
func store(t *testing.T, pl *pool.Pool, key, value string, exptime int64) {
	t.Helper()
	var r [1]protocol.Response
	req := &protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte(value), Flags: 7, Exptime: exptime}
	if err := pool.Do(context.Background(), pl.Member(pl.Locate([]byte(key))).Server, nil, req, r[:]); err != nil || r[0].Status != protocol.StatusOK {
		t.Fatalf("set %s on %s: %v %+v", key, pl.Name(), err, r[0])
	}
}

// ttlOn is key's remaining TTL on pl (-1: none), or -2 when pl does not hold it.
func ttlOn(t *testing.T, pl *pool.Pool, key string) int64 {
	t.Helper()
	req := &protocol.Request{Op: protocol.OpMetaGet, Key: []byte(key)}
	req.Meta.KeyToken = req.Key
	req.Meta.Flags = []protocol.MetaFlag{{Letter: 't'}}
	var r [1]protocol.Response
	if err := pool.Do(context.Background(), pl.Member(pl.Locate(req.Key)).Server, nil, req, r[:]); err != nil {
		t.Fatal(err)
	}
	if r[0].Meta.Code == protocol.MetaEN {
		return -2
	}
	f := bytes.TrimPrefix(bytes.TrimSpace(r[0].Meta.Flags), []byte("t"))
	n, err := strconv.ParseInt(string(f), 10, 64)
	if err != nil {
		t.Fatalf("mg %s t: %q", key, r[0].Meta.Flags)
	}
	return n
}

func TestWarmUpReadThrough(t *testing.T) {
	p, reg, newP, oldP := warming(t)
	store(t, oldP, "a", "old-a", 100)
	store(t, oldP, "b", "old-b", 0)
	store(t, newP, "c", "new-c", 0)
	store(t, oldP, "c", "old-c", 0) // the new pool's value wins

	r := get(p, "a", "b", "c", "d")
	want := []string{"old-a", "old-b", "new-c", ""}
	for i, w := range want {
		if string(r[i].Value) != w || (w == "" && r[i].Status != protocol.StatusNotFound) {
			t.Errorf("get %s = %q (status %d), want %q", r[i].Key, r[i].Value, r[i].Status, w)
		}
		if w != "" && r[i].Flags != 7 {
			t.Errorf("get %s flags = %d, want 7", r[i].Key, r[i].Flags)
		}
	}
	if ttl := ttlOn(t, newP, "a"); ttl < 98 || ttl > 100 {
		t.Errorf("copied a's TTL = %d, want its remaining 100s or a little less", ttl)
	}
	if ttl := ttlOn(t, newP, "b"); ttl != -1 {
		t.Errorf("copied b's TTL = %d, want none (-1)", ttl)
	}
	if got := value(t, reg, "moxi_warmup_reads_total", "pool", "new", "result", "hit"); got != 2 {
		t.Errorf("warm-up hits = %v, want 2", got)
	}
	if got := value(t, reg, "moxi_warmup_reads_total", "pool", "new", "result", "miss"); got != 1 {
		t.Errorf("warm-up misses = %v, want 1", got)
	}
	get(p, "a", "b") // now hits on the new pool: the old one is not asked
	if got := value(t, reg, "moxi_warmup_reads_total", "pool", "new", "result", "hit"); got != 2 {
		t.Errorf("warm-up hits after the copy = %v, want still 2", got)
	}
}

func TestWarmUpWritesDeleteOnOld(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  protocol.Request
		want string // what a get answers afterwards; "" for a miss
	}{
		{"set", protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("v2")}, "v2"},
		{"delete", protocol.Request{Op: protocol.OpDelete, Key: []byte("k")}, ""},
		{"meta delete", metaDelete("k"), ""},
		{"touch", protocol.Request{Op: protocol.OpTouch, Key: []byte("k"), Exptime: 10}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _, _, oldP := warming(t)
			store(t, oldP, "k", "v1", 0)
			handle(p, &tc.req)
			if ttlOn(t, oldP, "k") != -2 {
				t.Error("the old pool still holds k after a write through moxi")
			}
			r := get(p, "k")
			if string(r[0].Value) != tc.want {
				t.Errorf("get k = %q, want %q", r[0].Value, tc.want)
			}
		})
	}
}

// TestWarmUpSharedServer: when the warm_from pool keeps a key on the very server the key's
// write lands on (the pools share it), the write is not deleted there: the value answered
// STORED stays.
func TestWarmUpSharedServer(t *testing.T) {
	newP := newPool(t, "new", 1)
	oldShared, err := pool.New("old", pool.Options{}, []pool.Member{{Name: "shared", Addr: "embedded/shared", Weight: 1, Server: newP.Member(0).Server}})
	if err != nil {
		t.Fatal(err)
	}
	newShared, err := pool.New("new", pool.Options{}, []pool.Member{{Name: "shared", Addr: "embedded/shared", Weight: 1, Server: newP.Member(0).Server}})
	if err != nil {
		t.Fatal(err)
	}
	features := route.NewShared(route.Options{Registry: prometheus.NewRegistry()})
	topology.Compose(newShared, features, topology.Stack{Features: route.Features{WarmFrom: oldShared}})
	p := proxy.New(&topology.Topology{Pools: []*pool.Pool{newShared, oldShared}, Default: newShared}, proxy.Options{Features: features})
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	if r := handle(p, &protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("v")}); r[0].Status != protocol.StatusOK {
		t.Fatalf("set: %+v", r[0])
	}
	if r := get(p, "k"); string(r[0].Value) != "v" {
		t.Errorf("get k after set = %q, want v: the write was deleted on the server it landed on", r[0].Value)
	}
}

func metaDelete(key string) protocol.Request {
	r := protocol.Request{Op: protocol.OpMetaDelete, Key: []byte(key)}
	r.Meta.KeyToken = r.Key
	return r
}

// A gets answered from the old pool carries the new pool's cas, so a cas with it works.
func TestWarmUpGetsCas(t *testing.T) {
	p, _, _, oldP := warming(t)
	store(t, oldP, "k", "v1", 0)
	r := handle(p, &protocol.Request{Op: protocol.OpGets, Keys: [][]byte{[]byte("k")}})
	if string(r[0].Value) != "v1" || r[0].Cas == 0 {
		t.Fatalf("gets k = %+v", r[0])
	}
	c := handle(p, &protocol.Request{Op: protocol.OpCas, Key: []byte("k"), Value: []byte("v2"), Cas: r[0].Cas})
	if c[0].Status != protocol.StatusOK {
		t.Fatalf("cas with the warm-up's cas: status %d", c[0].Status)
	}
}

func TestWarmUpMetaGet(t *testing.T) {
	p, reg, newP, oldP := warming(t)
	store(t, oldP, "k", "v1", 50)
	req := &protocol.Request{Op: protocol.OpMetaGet, Key: []byte("k")}
	req.Meta.KeyToken = req.Key
	req.Meta.ReturnValue = true
	req.Meta.Flags = []protocol.MetaFlag{{Letter: 'v'}, {Letter: 'f'}}
	r := handle(p, req)
	if r[0].Meta.Code != protocol.MetaVA || string(r[0].Value) != "v1" || string(r[0].Meta.Flags) != " f7" {
		t.Fatalf("mg k v f = %+v", r[0])
	}
	if ttl := ttlOn(t, newP, "k"); ttl < 48 || ttl > 50 {
		t.Errorf("copied TTL = %d, want about 50", ttl)
	}
	if got := value(t, reg, "moxi_warmup_reads_total", "pool", "new", "result", "hit"); got != 1 {
		t.Errorf("warm-up hits = %v, want 1", got)
	}
}

// A pool without warm_from never reads another pool.
func TestNoWarmUpWithoutWarmFrom(t *testing.T) {
	main, other := newPool(t, "main", 1), newPool(t, "other", 1)
	p := proxy.New(&topology.Topology{Pools: []*pool.Pool{main, other}, Default: main}, proxy.Options{})
	store(t, other, "k", "v", 0)
	if r := get(p, "k"); r[0].Status != protocol.StatusNotFound {
		t.Errorf("get k = %+v, want a miss", r[0])
	}
}
