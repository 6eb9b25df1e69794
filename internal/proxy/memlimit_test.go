package proxy_test

import (
	"strconv"
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// TestCacheMemlimit: with allow_flush_all false cache_memlimit is refused as flush_all is
// and reaches no server; else it reaches every shard, which never goes above its
// configured memory.
func TestCacheMemlimit(t *testing.T) {
	const mb = 1 << 20
	for _, tc := range []struct {
		name       string
		noFlushAll bool
		limit      uint64
		answer     string
		requests   uint64 // handed to each shard
		maxbytes   int    // each shard's limit_maxbytes afterwards
	}{
		{"refused", true, 8, "CLIENT_ERROR cache_memlimit not allowed\r\n", 0, 64 * mb},
		{"lowered", false, 8, "OK\r\n", 1, 8 * mb},
		{"above embedded_memory_mb", false, 2048, "OK\r\n", 1, 64 * mb},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := newPool(t, "main", 2)
			p := proxy.New(&topology.Topology{Pools: []*pool.Pool{pl}, Default: pl, NoFlushAll: tc.noFlushAll}, proxy.Options{})
			req := &protocol.Request{Op: protocol.OpCacheMemlimit, Delta: tc.limit}
			if got := protocol.AppendTextResponse(nil, req, handle(p, req)); string(got) != tc.answer {
				t.Errorf("cache_memlimit %d answered %q, want %q", tc.limit, got, tc.answer)
			}
			for i := range pl.Len() {
				m := pl.Member(i)
				if got := m.Server.Info().Counters.Requests; got != tc.requests {
					t.Errorf("%s was handed %d requests, want %d", m.Name, got, tc.requests)
				}
				for _, st := range m.Server.Stats() {
					if st.Name == "limit_maxbytes" && st.Value != strconv.Itoa(tc.maxbytes) {
						t.Errorf("%s: limit_maxbytes %s, want %d", m.Name, st.Value, tc.maxbytes)
					}
				}
			}
		})
	}
}
