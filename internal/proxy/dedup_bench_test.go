package proxy_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/backend"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// BenchmarkGetDedup is the get path against a real memcached with dedup off and on, when
// there is nothing to coalesce (every caller reads its own key): what dedup costs.
func BenchmarkGetDedup(b *testing.B) {
	mc := memcachedtest.Start(b)
	srv := backend.New(backend.Options{Addr: mc.Addr, Timeout: 5 * time.Second})
	defer srv.Close()
	pl, err := pool.New("main", pool.Options{}, []pool.Member{{Name: "mc", Addr: mc.Addr, Weight: 1, Server: srv}})
	if err != nil {
		b.Fatal(err)
	}
	for _, dedup := range []bool{false, true} {
		b.Run(fmt.Sprintf("dedup=%v", dedup), func(b *testing.B) {
			p := proxy.New(&topology.Topology{Pools: []*pool.Pool{pl}, Default: pl, Dedup: dedup}, proxy.Options{})
			defer p.Close(context.Background())
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				key := []byte("dedup:" + strconv.FormatInt(next.Add(1), 10))
				set := protocol.Request{Op: protocol.OpSet, Key: key, Value: make([]byte, 100)}
				resps := p.Handle(context.Background(), &set, nil)
				get := protocol.Request{Op: protocol.OpGet, Keys: [][]byte{key}}
				for pb.Next() {
					resps = p.Handle(context.Background(), &get, resps[:0])
					if resps[0].Status != protocol.StatusOK {
						b.Errorf("get: %+v", resps[0])
						return
					}
				}
			})
		})
	}
}
