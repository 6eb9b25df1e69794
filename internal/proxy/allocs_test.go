//go:build !race

// Allocation counts: built without -race only, under which sync.Pool drops a quarter of
// what it is given and a count says nothing. make test runs them in a step of their own.

package proxy_test

import (
	"context"
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// TestHandleGetHitAllocsDetail: with detail on, a get of a prefix already counted allocates
// nothing more than with detail off.
func TestHandleGetHitAllocsDetail(t *testing.T) {
	pl := newPool(t, "main", 1)
	p := proxy.New(&topology.Topology{Pools: []*pool.Pool{pl}, Default: pl}, proxy.Options{})
	handle(p, stats("detail on"))
	set(t, p, "pre:key", "value")
	req := []protocol.Request{{Op: protocol.OpGet, Keys: [][]byte{[]byte("pre:key")}}}
	resps := make([]protocol.Response, 0, 4)
	allocs := testing.AllocsPerRun(1000, func() {
		resps = p.Handle(context.Background(), nil, req, resps[:0])
	})
	if allocs > 0 {
		t.Errorf("%.0f allocations per get hit with detail on, want 0", allocs)
	}
}

// TestHandleGetHitAllocs is the hot path's allocation budget, as BenchmarkHandleGetHit
// measures it.
func TestHandleGetHitAllocs(t *testing.T) {
	p, req, resps := getHitSetup(t)
	allocs := testing.AllocsPerRun(1000, func() {
		resps = p.Handle(context.Background(), nil, req, resps[:0])
	})
	t.Logf("proxy.Handle of a get hit: %.0f allocs", allocs)
	if allocs > 0 {
		t.Errorf("%.0f allocations per get hit, want 0", allocs)
	}
}
