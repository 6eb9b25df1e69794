package proxy_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// BenchmarkGetDedup is the get path against a real memcached with dedup off and on, when
// there is nothing to coalesce (every caller reads its own key): what dedup costs.
func BenchmarkGetDedup(b *testing.B) {
	mc := memcachedtest.Start(b)
	cfg := config.Default()
	main := config.NewPool("main")
	main.Servers, main.Timeout = []config.Server{{Addr: mc.Addr, Weight: 1}}, 5*time.Second
	cfg.Pools = []*config.Pool{main}
	builder := &topology.Builder{Dial: true}
	defer builder.Close(context.Background())
	for _, dedup := range []bool{false, true} {
		b.Run(fmt.Sprintf("dedup=%v", dedup), func(b *testing.B) {
			cfg.Dedup = dedup
			pd, err := builder.Build(cfg)
			if err != nil {
				b.Fatal(err)
			}
			pd.Commit(0)
			p := proxy.New(pd.Topology, proxy.Options{})
			defer p.Close(context.Background())
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				key := []byte("dedup:" + strconv.FormatInt(next.Add(1), 10))
				set := []protocol.Request{{Op: protocol.OpSet, Key: key, Value: make([]byte, 100)}}
				resps := p.Handle(context.Background(), nil, set, nil)
				get := []protocol.Request{{Op: protocol.OpGet, Keys: [][]byte{key}}}
				for pb.Next() {
					resps = p.Handle(context.Background(), nil, get, resps[:0])
					if resps[0].Status != protocol.StatusOK {
						b.Errorf("get: %+v", resps[0])
						return
					}
				}
			})
		})
	}
}
